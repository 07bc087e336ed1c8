"""Env activities: sessions live in this worker's process; `reset` on the shared queue, `step`/`close` on ours.

`reset` is polled from the shared queue of the env's pool ("cpu", or the pool its
`@env(pool=...)` names) by every env worker of that pool; the session it creates
stays in the process that created it, and the handle it returns names this
worker's private queue so every later `step` and `close` of the episode comes
back here (sticky routing). If this worker dies, `restore` (on the shared queue)
rebuilds a session elsewhere from the seed and the recorded actions; so does an
env whose own remote session is gone (`EnvSessionLost`: an OpenEnv server that
died), reported as `SessionLost` like a worker that restarted. Env calls,
`close` included, run in this worker's own thread pool (slow or sleeping envs must
not starve the default executor nor block the event loop); single-turn `prompts`
and `check` close each throwaway env whatever happens; a task's `faults` wrap its
envs, and its `reset_pool_size` turns on hedged resets with spares (`ResetPool`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.activities.env_calls import (
    build_env,
    close_now,
    first_observations,
    is_chat,
    lookup,
    play_answers,
    reset_now,
    step_result,
    unwrapped,
)
from rollart.activities.env_pool import ResetPool, close_quietly
from rollart.activities.envs.faults import FaultInjector, FaultyEnv, TransientStepFault
from rollart.activities.errors import bad_input, env_broken
from rollart.contracts.activities import (
    STICKY_START_S,
    CheckInput,
    CloseInput,
    EnvHandle,
    EnvOptions,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    PromptsInput,
    ResetInput,
    RestoreInput,
    StepInput,
    StepResult,
)
from rollart.contracts.errors import ErrorType
from rollart.spec.chat import ChatMessage
from rollart.spec.config import FaultModel
from rollart.spec.env import ChatEnv, EnvSessionLost, observation_text
from rollart.spec.registry import EnvEntry

__all__ = ["EnvActivities"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

REPLAY_STEP_TRIES = 3
"""A restore's replay retries a transient (injected) step fault this many times before giving up."""


@dataclass
class _Session:
    """One trajectory's env, or a GRPO group's envs (member i is `envs[i]`)."""

    envs: list[Any]
    entry: EnvEntry
    owner: str  # the trajectory or group id
    done: list[bool]
    turn: tuple[str, dict[int, StepResult]] = field(default_factory=lambda: ("", {}))
    """(the step_group call in progress, the members it has stepped): what a retry of that call must not redo."""

    @classmethod
    def of(cls, envs: list[Any], entry: EnvEntry, owner: str) -> _Session:
        return cls(envs=envs, entry=entry, owner=owner, done=[False] * len(envs))


class EnvActivities:
    """Holds this worker's env sessions; its bound methods are the registered activities."""

    def __init__(
        self, worker_id: str, queue: str, env_threads: int = 64, sticky_start_s: float = STICKY_START_S
    ) -> None:
        self.worker_id = worker_id
        self.queue = queue
        self.sticky_start_s = sticky_start_s  # a call left waiting this long on `queue` means this worker is dead
        self._sessions: dict[str, _Session] = {}
        self._executor = ThreadPoolExecutor(max_workers=env_threads, thread_name_prefix="env")
        self._injectors: dict[FaultModel, FaultInjector] = {}
        self.pool = ResetPool(discard=self._discard_spare)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    def shutdown(self) -> None:
        """Stop the env threads (sleeping envs are not waited for)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` on the env threads: env code may block, the event loop must not."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    def _discard_spare(self, env: Any) -> None:
        """A spare env the pool drops is closed on the env threads, never on the event loop (a close may be slow)."""
        try:
            self._executor.submit(close_quietly, env)
        except RuntimeError:  # the worker is shutting down: its env threads are gone
            close_quietly(env)

    async def _close(self, entry: EnvEntry, env: Any, owner: str) -> None:
        """`env.close()` on the env threads; a close that raises is logged, never raised (the env is done anyway)."""
        await self._call(close_now, entry, env, owner)

    async def _single_turn(self, name: str, fn: Callable[..., _T], *args: Any, resets: int = 1) -> _T:
        """`fn(*args)` in one hop to the env threads, under the env's reset timeout for each of its `resets`.

        Single-turn calls build, reset, step and close many throwaway envs: one hop per seed instead of three
        per env (a step of the arithmetic example checks 256 answers: ~90 → ~10 ms).
        """
        entry = lookup(name)
        timeout_s = entry.reset_timeout_s * max(resets, 1)
        try:
            return await asyncio.wait_for(self._call(fn, *args), timeout_s)
        except TimeoutError:
            raise ErrorType.ENV_RESET_TIMEOUT.error(
                f"env {name!r}: {resets} throwaway resets took over {timeout_s:g}s"
            ) from None

    def _build(self, name: str, env_args: dict[str, Any], options: EnvOptions | None) -> tuple[EnvEntry, Any]:
        entry, env = build_env(name, env_args)
        if options is not None and options.faults is not None:
            injector = self._injectors.get(options.faults)
            if injector is None:
                injector = self._injectors[options.faults] = FaultInjector(options.faults, salt=self.worker_id)
            env = FaultyEnv(env, injector)
        return entry, env

    async def _reset_envs(
        self, name: str, env_args: dict[str, Any], options: EnvOptions | None, seed: int, n: int
    ) -> tuple[EnvEntry, list[tuple[Any, str]]]:
        """n envs reset from `seed`: through the pre-reset pool when the task has one, else n plain resets."""
        entry = lookup(name)  # an unknown name fails here, before any reset starts
        timeout = (options.reset_timeout_s if options else None) or entry.reset_timeout_s
        size = options.reset_pool_size if options else 0

        async def reset_one() -> tuple[Any, str]:
            _, env = self._build(name, env_args, options)
            try:
                return env, await self._reset(entry, env, seed, timeout)
            except BaseException:
                await self._close(entry, env, f"a failed reset of seed {seed}")
                raise

        if size == 0:  # the members' resets at once (remote sandboxes reset in parallel); any failure fails all
            outcomes = await asyncio.gather(*(reset_one() for _ in range(n)), return_exceptions=True)
            ready = [out for out in outcomes if not isinstance(out, BaseException)]
            if len(ready) < n:
                for env, _ in ready:  # a group with a member that failed to reset: release the others
                    await self._close(entry, env, f"a group member of seed {seed}")
                raise next(out for out in outcomes if isinstance(out, BaseException))
            return entry, ready
        key = (name, json.dumps(env_args, sort_keys=True, default=str), options, seed)
        return entry, await self.pool.take(key, n, size, reset_one)

    async def _reset(self, entry: EnvEntry, env: Any, seed: int, timeout_s: float | None = None) -> str:
        """env.reset(seed) in a thread under the reset timeout; a raising env is retryable (fresh env)."""
        timeout_s = timeout_s or entry.reset_timeout_s
        try:
            return await asyncio.wait_for(self._call(reset_now, entry, env, seed), timeout_s)
        except TimeoutError:
            raise ErrorType.ENV_RESET_TIMEOUT.error(
                f"env {entry.name!r} reset(seed={seed}) took over {timeout_s:g}s"
            ) from None

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        """Create an env, reset it from the seed, and keep it here as a session."""
        entry, [(env, observation)] = await self._reset_envs(inp.env, inp.env_args, inp.options, inp.seed, 1)
        session_id = f"{inp.trajectory_id}/{uuid.uuid4().hex[:8]}"
        self._sessions[session_id] = _Session.of([env], entry, inp.trajectory_id)
        chat = is_chat(env)
        return EnvHandle(
            session_id=session_id,
            queue=self.queue,
            worker_id=self.worker_id,
            observation=observation_text(observation),
            step_timeout_s=entry.step_timeout_s,
            sticky_start_s=self.sticky_start_s,
            messages=observation if chat else None,
            tools=(unwrapped(env).tool_schemas() or None) if chat else None,
        )

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> StepResult:
        """Apply the model's text (a chat env: its message) to the session's env; an env that raises ends the
        episode (EnvBroken)."""
        return await self._step(self._session(inp.session_id), 0, inp.message or inp.action)

    @activity.defn(name="reset_group")
    async def reset_group(self, inp: GroupResetInput) -> GroupHandle:
        """Create `size` envs reset from the same seed, kept here as one session (a GRPO group)."""
        if issubclass(lookup(inp.env).cls, ChatEnv):
            raise bad_input(
                f"env {inp.env!r} is a chat env, which runs one trajectory per member: set the job's "
                "rollout_unit: trajectory (a lockstep group session is for text envs)"
            )
        entry, ready = await self._reset_envs(inp.env, inp.env_args, inp.options, inp.seed, inp.size)
        session_id = f"{inp.group_id}/{uuid.uuid4().hex[:8]}"
        self._sessions[session_id] = _Session.of([env for env, _ in ready], entry, inp.group_id)
        return GroupHandle(
            session_id=session_id,
            queue=self.queue,
            worker_id=self.worker_id,
            observations=[observation for _, observation in ready],
            step_timeout_s=entry.step_timeout_s,
            sticky_start_s=self.sticky_start_s,
        )

    @activity.defn(name="restore")
    async def restore(self, inp: RestoreInput) -> GroupHandle:
        """Rebuild a lost session here: reset each member from the seed, replay its actions, check where it ends.

        A member whose replay does not end on the observation it last saw means the env is not
        deterministic in (seed, actions): `ReplayMismatch`, not retried — the trajectory fails (infra).
        """
        if len(inp.actions) != len(inp.observations):
            raise bad_input(f"restore: {len(inp.actions)} action lists but {len(inp.observations)} observations")
        entry, ready = await self._reset_envs(inp.env, inp.env_args, inp.options, inp.seed, len(inp.actions))
        session = _Session.of([env for env, _ in ready], entry, inp.owner_id)
        try:
            for member, ((_, opening), actions, expected) in enumerate(zip(ready, inp.actions, inp.observations)):
                observation = observation_text(opening)
                for turn, text in enumerate(actions):
                    action = inp.messages[member][turn] if inp.messages else text  # a chat env replays its messages
                    try:
                        observation = (await self._replay_step(session, member, action)).observation
                    except ApplicationError as e:
                        if e.type != ErrorType.SESSION_LOST:
                            raise
                        raise ErrorType.ENV_RESTORE_LOST.error(f"restore of {inp.owner_id}: {e}") from e
                    if session.done[member] and turn < len(actions) - 1:
                        raise _mismatch(inp, member, f"episode ended at turn {turn} of {len(actions)} on replay")
                if observation != expected:
                    raise _mismatch(
                        inp, member, f"replay ends on {observation[:60]!r}, the episode saw {expected[:60]!r}"
                    )
        except BaseException:
            for env in session.envs:
                await self._close(entry, env, f"a failed restore of {inp.owner_id}")
            raise
        session_id = f"{inp.owner_id}/{uuid.uuid4().hex[:8]}"
        self._sessions[session_id] = session
        activity.logger.info(
            "restored %s on %s (%d members, %d actions replayed)",
            inp.owner_id,
            self.worker_id,
            len(inp.actions),
            sum(map(len, inp.actions)),
        )
        return GroupHandle(
            session_id=session_id,
            queue=self.queue,
            worker_id=self.worker_id,
            observations=list(inp.observations),
            step_timeout_s=entry.step_timeout_s,
            sticky_start_s=self.sticky_start_s,
        )

    async def _replay_step(self, session: _Session, member: int, action: str | ChatMessage) -> StepResult:
        for attempt in range(REPLAY_STEP_TRIES):
            try:
                return await self._step(session, member, action)
            except ApplicationError as e:
                if e.type != ErrorType.ENV_STEP_TRANSIENT or attempt == REPLAY_STEP_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    @activity.defn(name="step_group")
    async def step_group(self, inp: GroupStepInput) -> list[StepResult | None]:
        """One turn for every member still playing, all at once; a member given None is skipped (result None).

        Members step concurrently (remote sandboxes step in parallel). If one raises a transient fault the
        activity is retried; members that already stepped in this call keep their result, not a second step.
        """
        session = self._session(inp.session_id)
        if len(inp.actions) != len(session.envs):
            raise bad_input(f"step_group: {len(inp.actions)} actions for a group of {len(session.envs)}")
        info = activity.info()
        call = f"{info.workflow_run_id}/{info.activity_id}"  # the same on every retry of this call
        if info.attempt == 1 or session.turn[0] != call:
            session.turn = (call, {})
        stepped = session.turn[1]

        async def step_once(member: int, action: str | None) -> StepResult | None:
            """A retry of this call (another member failed) must not step a member twice: reuse its result."""
            if action is not None and member not in stepped:
                stepped[member] = await self._step(session, member, action)
            return stepped.get(member)

        return list(await asyncio.gather(*(step_once(i, a) for i, a in enumerate(inp.actions))))

    async def _step(self, session: _Session, member: int, action: str | ChatMessage) -> StepResult:
        if session.done[member]:
            raise bad_input(
                f"session of {session.owner} (member {member}) already ended; a step after done is a caller bug"
            )
        if is_chat(session.envs[member]) != isinstance(action, ChatMessage):
            kind = "a chat env, which needs" if isinstance(action, str) else "a text env, which needs"
            raise bad_input(
                f"env {session.entry.name!r} is {kind} {'a message' if isinstance(action, str) else 'text'} to step"
            )
        try:
            outcome = await self._call(session.envs[member].step, action)
        except TransientStepFault as e:  # raised before the env was touched: its state is intact, retry is safe
            raise ErrorType.ENV_STEP_TRANSIENT.error(f"env {session.entry.name!r} step: {e}") from e
        except EnvSessionLost as e:  # the env's remote session is gone: the workflow restores the episode elsewhere
            session.done[member] = True
            if any(s is session for s in self._sessions.values()):  # first member to notice: drop the whole session
                self._sessions = {sid: s for sid, s in self._sessions.items() if s is not session}
                for env in session.envs:
                    await self._close(session.entry, env, f"a lost session of {session.owner}")
            raise ErrorType.SESSION_LOST.error(f"env {session.entry.name!r} lost its session: {e}") from e
        except Exception as e:
            session.done[member] = True
            raise env_broken(f"env {session.entry.name!r} step raised {type(e).__name__}: {e}") from e
        result = step_result(session.entry, outcome)
        session.done[member] = result.done
        return result

    @activity.defn(name="close")
    async def close(self, inp: CloseInput) -> None:
        """Drop the session and release its env; closing twice is fine."""
        session = self._sessions.pop(inp.session_id, None)
        for env in session.envs if session is not None else []:
            await self._close(session.entry, env, f"session {inp.session_id}")

    @activity.defn(name="prompts")
    async def prompts(self, inp: PromptsInput) -> list[str]:
        """Single-turn tasks: each seed's first observation, from a throwaway env (no session kept)."""
        return await self._single_turn(
            inp.env, first_observations, inp.env, inp.env_args, inp.seeds, resets=len(inp.seeds)
        )

    @activity.defn(name="check")
    async def check(self, inp: CheckInput) -> list[list[StepResult]]:
        """Single-turn tasks: play each answer as the only step of a fresh env reset from its seed."""
        if len(inp.seeds) != len(inp.answers):
            raise bad_input(f"check: {len(inp.seeds)} seeds but {len(inp.answers)} answer lists")
        return [
            await self._single_turn(inp.env, play_answers, inp.env, inp.env_args, seed, answers, resets=len(answers))
            for seed, answers in zip(inp.seeds, inp.answers)
        ]

    def _session(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise ErrorType.SESSION_LOST.error(
                f"no session {session_id!r} on env worker {self.worker_id} (was the worker restarted?)"
            ) from None


def _mismatch(inp: RestoreInput, member: int, why: str) -> ApplicationError:
    return ErrorType.REPLAY_MISMATCH.error(
        f"cannot restore {inp.owner_id} (member {member}) from seed {inp.seed}: {why}; env {inp.env!r} is not "
        "deterministic in (seed, actions), so its episode cannot move to another worker"
    )
