"""Env activities: sessions live in this cpu worker's process; `reset` on the shared queue, `step`/`close` on ours.

`reset` is polled from the shared "cpu" queue by every env worker; the session
it creates stays in the process that created it, and the handle it returns
names this worker's private queue so every later `step` and `close` of the
episode comes back here (sticky routing).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from rollart.activities.errors import bad_input, env_broken, unknown_component
from rollart.activities.types import (
    CheckInput,
    CloseInput,
    EnvHandle,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    PromptsInput,
    ResetInput,
    StepInput,
    StepResult,
)
from rollart.infra.registry import EnvEntry, UnknownComponentError, lookup_env
from temporalio import activity
from temporalio.exceptions import ApplicationError

__all__ = ["EnvActivities"]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    """One trajectory's env, or a GRPO group's envs (member i is `envs[i]`)."""

    envs: list[Any]
    entry: EnvEntry
    owner: str  # the trajectory or group id
    done: list[bool]

    @classmethod
    def of(cls, envs: list[Any], entry: EnvEntry, owner: str) -> _Session:
        return cls(envs=envs, entry=entry, owner=owner, done=[False] * len(envs))


class EnvActivities:
    """Holds this worker's env sessions; its bound methods are the registered activities."""

    def __init__(self, worker_id: str, queue: str) -> None:
        self.worker_id = worker_id
        self.queue = queue
        self._sessions: dict[str, _Session] = {}

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        """Create an env, reset it from the seed, and keep it here as a session."""
        entry, env = _build(inp.env, inp.env_args)
        observation = await _reset(entry, env, inp.seed)
        session_id = f"{inp.trajectory_id}/{uuid.uuid4().hex[:8]}"
        self._sessions[session_id] = _Session.of([env], entry, inp.trajectory_id)
        return EnvHandle(
            session_id=session_id,
            queue=self.queue,
            worker_id=self.worker_id,
            observation=observation,
            step_timeout_s=entry.step_timeout_s,
        )

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> StepResult:
        """Apply the model's text to the session's env; an env that raises ends the episode (EnvBroken)."""
        return await self._step(self._session(inp.session_id), 0, inp.action)

    @activity.defn(name="reset_group")
    async def reset_group(self, inp: GroupResetInput) -> GroupHandle:
        """Create `size` envs reset from the same seed, kept here as one session (a GRPO group)."""
        built = [_build(inp.env, inp.env_args) for _ in range(inp.size)]
        entry = built[0][0]
        observations = [await _reset(entry, env, inp.seed) for _, env in built]
        session_id = f"{inp.group_id}/{uuid.uuid4().hex[:8]}"
        self._sessions[session_id] = _Session.of([env for _, env in built], entry, inp.group_id)
        return GroupHandle(
            session_id=session_id,
            queue=self.queue,
            worker_id=self.worker_id,
            observations=observations,
            step_timeout_s=entry.step_timeout_s,
        )

    @activity.defn(name="step_group")
    async def step_group(self, inp: GroupStepInput) -> list[StepResult | None]:
        """One turn for every member still playing; a member given None is skipped (its result is None)."""
        session = self._session(inp.session_id)
        if len(inp.actions) != len(session.envs):
            raise bad_input(f"step_group: {len(inp.actions)} actions for a group of {len(session.envs)}")
        return [None if a is None else await self._step(session, i, a) for i, a in enumerate(inp.actions)]

    async def _step(self, session: _Session, member: int, action: str) -> StepResult:
        if session.done[member]:
            raise bad_input(f"session of {session.owner} (member {member}) already ended; a step after done is a caller bug")
        try:
            outcome = await asyncio.to_thread(session.envs[member].step, action)
        except Exception as e:
            session.done[member] = True
            raise env_broken(f"env {session.entry.name!r} step raised {type(e).__name__}: {e}") from e
        result = _step_result(session.entry, outcome)
        session.done[member] = result.done
        return result

    @activity.defn(name="close")
    async def close(self, inp: CloseInput) -> None:
        """Drop the session and release its env; closing twice is fine."""
        session = self._sessions.pop(inp.session_id, None)
        for env in session.envs if session is not None else []:
            try:
                await asyncio.to_thread(env.close)
            except Exception:  # the episode is over either way
                log.exception("env %s close failed for session %s", session.entry.name, inp.session_id)

    @activity.defn(name="prompts")
    async def prompts(self, inp: PromptsInput) -> list[str]:
        """Single-turn tasks: each seed's first observation, from a throwaway env (no session kept)."""
        observations = []
        for seed in inp.seeds:
            entry, env = _build(inp.env, inp.env_args)
            observations.append(await _reset(entry, env, seed))
            env.close()
        return observations

    @activity.defn(name="check")
    async def check(self, inp: CheckInput) -> list[list[StepResult]]:
        """Single-turn tasks: play each answer as the only step of a fresh env reset from its seed."""
        if len(inp.seeds) != len(inp.answers):
            raise bad_input(f"check: {len(inp.seeds)} seeds but {len(inp.answers)} answer lists")
        results = []
        for seed, answers in zip(inp.seeds, inp.answers):
            row = []
            for answer in answers:
                entry, env = _build(inp.env, inp.env_args)
                await _reset(entry, env, seed)
                try:
                    outcome = await asyncio.to_thread(env.step, answer)
                except Exception as e:
                    raise env_broken(f"env {entry.name!r} step raised {type(e).__name__}: {e}") from e
                row.append(_step_result(entry, outcome))
                env.close()
            results.append(row)
        return results

    def _session(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise ApplicationError(
                f"no session {session_id!r} on env worker {self.worker_id} (was the worker restarted?)",
                type="SessionLost",
                non_retryable=True,
            ) from None


def _build(name: str, env_args: dict[str, Any]) -> tuple[EnvEntry, Any]:
    """Look the env up and construct it; unknown names and rejected args are bad input (not retried)."""
    try:
        entry = lookup_env(name)
    except UnknownComponentError as e:
        raise unknown_component(str(e)) from e
    try:
        return entry, entry.cls(**env_args)
    except (TypeError, ValueError) as e:
        raise bad_input(f"env {name!r} rejected its env_args {env_args!r}: {e}") from e


async def _reset(entry: EnvEntry, env: Any, seed: int) -> str:
    """env.reset(seed) in a thread under the env's reset timeout; a raising env is retryable (fresh env)."""
    try:
        observation = await asyncio.wait_for(asyncio.to_thread(env.reset, seed), entry.reset_timeout_s)
    except asyncio.TimeoutError:
        raise ApplicationError(
            f"env {entry.name!r} reset(seed={seed}) took over {entry.reset_timeout_s:g}s", type="EnvResetTimeout"
        ) from None
    except Exception as e:
        raise ApplicationError(
            f"env {entry.name!r} reset(seed={seed}) raised {type(e).__name__}: {e}", type="EnvResetError"
        ) from e
    if not isinstance(observation, str):
        raise bad_input(f"env {entry.name!r}.reset must return the observation text, got {type(observation).__name__}")
    return observation


def _step_result(entry: EnvEntry, outcome: Any) -> StepResult:
    try:
        return StepResult(observation=outcome.observation, reward=outcome.reward, done=outcome.done, info=outcome.info)
    except (AttributeError, ValueError) as e:
        raise env_broken(f"env {entry.name!r} step returned {outcome!r}, not a StepOutcome: {e}") from e
