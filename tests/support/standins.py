"""Stand-in activities for orchestration tests: the real activity names and queues, scripted work, every call recorded.

A test about orchestration logic registers these instead of the real env, engine, reward and trainer
activities, configures which of them fail and how slowly they answer, and afterwards asserts on what
they were called with (`calls`). Checks a stand-in makes while it runs go to `violations`, never to an
`assert` inside the activity (that would only fail, and mask, one trajectory): `standin_workers` fails
the test with them when its block ends.

The env is a counter: the observation is the number of steps a member has taken, and member i of a
group is done after `turns + i * stagger` steps. The engine answers "R" with the policy version the
last `train_step` published (or `versions[k]` for the k-th `generate`). With `engines` named, each is a
generation worker of its own, polling the pool's shared queue and its private one (`h800@<engine>`) as a
real one does, and `standin_workers` yields the `StandInPool` that stops one (a killed worker).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from rollart.activities.children import ChildActivities
from rollart.activities.errors import env_broken, unknown_component
from rollart.activities.queues import QueueActivities
from rollart.contracts.activities import (
    CheckInput,
    CloseInput,
    EnvHandle,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    PromptsInput,
    ResetInput,
    RestoreInput,
    RewardBatchInput,
    RewardInput,
    RewardResult,
    StepInput,
    StepResult,
    TrainStepInput,
    TrainStepResult,
    Transcript,
)
from rollart.contracts.agent import CHAT_UPDATE, ChatInput, ChatReply, RunAgentInput, RunAgentResult
from rollart.contracts.errors import ErrorType
from rollart.contracts.generation import Completion, EnginePressure, GenerateBatchInput, GenerateInput, GenerateResult
from rollart.contracts.training import TrainingInput, TrainingResult
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.chat import ChatMessage
from rollart.spec.config import JobSpec, WorkerTuning
from rollart.spec.pools import queue_name, session_queue
from rollart.workflows import ALL_WORKFLOWS

__all__ = [
    "Call",
    "StandInPool",
    "StandIns",
    "full_marks",
    "reward_on_success",
    "reward_per_turn",
    "standin_workers",
    "start_training",
]

DEAD_AFTER_S = 1.0  # the stand-in env worker's handles: a step left waiting 1 s on its queue means it is dead
HELD_WAIT_S = 3.0  # how long a held group's first generation waits for another group to step


class Call(NamedTuple):
    """One stand-in call: the activity, the queue it ran on, a short key (ids, counts), its input, and the stand-in
    engine that served it (named `engines` only)."""

    name: str
    queue: str
    what: str
    inp: Any
    engine: str = ""


def reward_on_success(t: Transcript) -> RewardResult:
    """1 if the env said success on some turn, else 0 (the `success` reward)."""
    ok = any(turn.info.get("success") for turn in t.turns)
    return RewardResult(value=float(ok), success=ok)


def full_marks(t: Transcript) -> RewardResult:
    """1 for every transcript: for tests where only which trajectories were trained matters."""
    return RewardResult(value=1.0, success=True)


def reward_per_turn(t: Transcript) -> RewardResult:
    """The number of turns in the transcript: shows that a restored episode kept the turns before the loss."""
    return RewardResult(value=float(len(t.turns)), success=True)


HEARTBEAT_EVERY_S = 5.0


async def _busy(seconds: float) -> None:
    """Take `seconds` as an engine would: heartbeating, so a long generation outlives the heartbeat timeout."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    await asyncio.sleep(0)  # yields even when there is no time to take, as the plain sleep did
    while (left := end - loop.time()) > 0:
        await asyncio.sleep(min(left, HEARTBEAT_EVERY_S))
        activity.heartbeat()


@dataclass
class _Session:
    seed: int
    taken: list[int]  # steps taken, per member
    restored: bool = False


@dataclass
class StandIns:
    """Scripted env, engine, reward and trainer activities; configure failures and latencies, read `calls`."""

    prefix: str = ""  # the job's task queue prefix (a test's own): workers listen on f"{prefix}{pool}"
    # the env and the reward
    turns: int = 1
    stagger: int = 0
    score: Callable[[Transcript], RewardResult] = reward_on_success
    # the engine
    versions: list[int] | None = None
    engines: tuple[str, ...] = ()  # generation workers of their own, each with a private queue (else one, anonymous)
    busy_engines: set[str] = field(default_factory=set)  # refuse turns pinned to them (EngineBusy), as a swamped one
    pool_rates: dict[str, float] = field(default_factory=dict)  # the anonymous engine of a pool reports this rate
    # failures
    fail_seeds: set[int] = field(default_factory=set)  # sessions reset with these seeds raise EnvBroken at every step
    fail_step_at: int | None = None  # a session's n-th step raises EnvBroken
    unknown_env: bool = False  # reset raises UnknownComponent
    broken_engine_group: str | None = None  # generate_batch raises EngineError for data keys naming this group
    rejected_key: str | None = None  # generate / generate_batch refuse (RequestRejected) a data key containing this
    lose_after: int | None = None  # a session made by reset answers SessionLost once it has taken this many steps
    dead_resets: bool = False  # resets hand out sessions on a queue nobody polls (the worker is gone)
    agent_turns: int = 2  # chat requests of each stand-in agent program (`run_agent`)
    # latencies
    turn_delay_s: float = 0.0  # each generate / generate_batch
    slow_batches_after: int | None = None  # generate_batch calls after this many take 60 s (still running at the end)
    train_delay_s: float = 0.0  # each train_step
    train_metrics: Callable[[TrainStepInput], dict[str, float]] | None = None  # each step's metrics (else a loss of 0)
    held_group: str | None = None  # this group's first generate_batch waits until another group steps
    # what happened
    version: int = 0  # the policy the engine serves: the last one trained
    calls: list[Call] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    _sessions: dict[str, _Session] = field(default_factory=dict)
    _other_group_stepped: asyncio.Event = field(default_factory=asyncio.Event)

    # ------------------------------------------------------------------ queues and records

    @property
    def session_queue(self) -> str:
        """The private queue of the (only) live env worker: step, step_group and close go there."""
        return session_queue("stand-in", self.prefix)

    @property
    def dead_queue(self) -> str:
        """The private queue of an env worker that was killed: nobody polls it."""
        return session_queue("dead-stand-in", self.prefix)

    def called(self, name: str) -> list[Call]:
        """The calls of one activity, in order."""
        return [c for c in self.calls if c.name == name]

    def inputs(self, name: str) -> list[Any]:
        """What one activity was called with, in order."""
        return [c.inp for c in self.called(name)]

    @property
    def trained_ids(self) -> list[str]:
        """Every trajectory id sent to train_step, in order (a repeat means one was trained twice)."""
        return [s.trajectory_id for inp in self.inputs("train_step") for s in inp.samples]

    def _record(self, name: str, what: str, inp: Any, engine: str = "") -> None:
        """Note a call with the queue it arrived on, for the test to assert on afterwards."""
        self.calls.append(Call(name, activity.info().task_queue, what, inp, engine))

    def engine_queue(self, engine: str) -> str:
        """The private queue of the stand-in engine `engine` (`<prefix>h800@<engine>`)."""
        return session_queue(engine, self.prefix, "h800")

    def _check(self, ok: bool, message: str) -> None:
        """Keep a failed check for the test body: an assert here would only fail (and mask) one trajectory."""
        if not ok:
            self.violations.append(message)

    # ------------------------------------------------------------------ env

    def _open(self, owner: str, seed: int, members: int, taken: list[int] | None = None) -> str:
        """A new session for `owner`; `taken` (steps per member) when it is a restore."""
        sid = f"{owner}/s{len(self._sessions) + 1}"
        self._sessions[sid] = _Session(seed=seed, taken=taken or [0] * members, restored=taken is not None)
        return sid

    def _step(self, sid: str, actions: Sequence[str | None]) -> list[StepResult | None]:
        """One turn of the members still playing (action not None), or the failure this session is scripted for."""
        s = self._sessions[sid]
        if not s.restored and self.lose_after is not None and max(s.taken) >= self.lose_after:
            raise ApplicationError(f"no session {sid!r}", type=ErrorType.SESSION_LOST, non_retryable=True)
        if s.seed in self.fail_seeds or (self.fail_step_at is not None and max(s.taken) + 1 == self.fail_step_at):
            raise env_broken("env 'stand-in' step raised RuntimeError: boom")
        results: list[StepResult | None] = []
        for i, a in enumerate(actions):
            if a is None:
                results.append(None)
                continue
            s.taken[i] += 1
            done = s.taken[i] >= self.turns + i * self.stagger
            results.append(
                StepResult(
                    observation=str(s.taken[i]), reward=float(done), done=done, info={"success": done, "valid": True}
                )
            )
        return results

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        self._record("reset", inp.trajectory_id, inp)
        if self.unknown_env:
            raise unknown_component(f"unknown env {inp.env!r}")
        sid = self._open(inp.trajectory_id, inp.seed, 1)
        queue = self.dead_queue if self.dead_resets else self.session_queue
        return EnvHandle(session_id=sid, queue=queue, worker_id="w1", observation="0", sticky_start_s=DEAD_AFTER_S)

    @activity.defn(name="reset_group")
    async def reset_group(self, inp: GroupResetInput) -> GroupHandle:
        self._record("reset_group", inp.group_id, inp)
        sid = self._open(inp.group_id, inp.seed, inp.size)
        queue = self.dead_queue if self.dead_resets else self.session_queue
        return GroupHandle(
            session_id=sid, queue=queue, worker_id="w1", observations=["0"] * inp.size, sticky_start_s=DEAD_AFTER_S
        )

    @activity.defn(name="restore")
    async def restore(self, inp: RestoreInput) -> GroupHandle:
        """A new session on the live worker, as far into the episode as the recorded actions go."""
        self._record("restore", inp.owner_id, inp)
        self._check(
            [str(len(a)) for a in inp.actions] == inp.observations,
            f"restore of {inp.owner_id}: observations {inp.observations} do not follow its actions {inp.actions}",
        )
        sid = self._open(inp.owner_id, inp.seed, len(inp.actions), [len(a) for a in inp.actions])
        return GroupHandle(session_id=sid, queue=self.session_queue, worker_id="w2", observations=inp.observations)

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> StepResult:
        self._record("step", inp.session_id, inp)
        return cast(StepResult, self._step(inp.session_id, [inp.action])[0])  # one member, always playing

    @activity.defn(name="step_group")
    async def step_group(self, inp: GroupStepInput) -> list[StepResult | None]:
        self._record("step_group", f"{inp.session_id} {sum(a is not None for a in inp.actions)}", inp)
        if self.held_group and f"{self.held_group}/" not in inp.session_id:
            self._other_group_stepped.set()
        return self._step(inp.session_id, inp.actions)

    @activity.defn(name="close")
    async def close(self, inp: CloseInput) -> None:
        self._record("close", inp.session_id, inp)
        self._sessions.pop(inp.session_id, None)

    @activity.defn(name="prompts")
    async def prompts(self, inp: PromptsInput) -> list[str]:
        self._record("prompts", str(len(inp.seeds)), inp)
        return [f"{seed}+0=" for seed in inp.seeds]

    @activity.defn(name="check")
    async def check(self, inp: CheckInput) -> list[list[StepResult]]:
        self._record("check", str(len(inp.seeds)), inp)
        return [
            [StepResult(observation="", reward=1.0, done=True, info={"answer": "R", "success": True}) for _ in answers]
            for answers in inp.answers
        ]

    # ------------------------------------------------------------------ agent programs

    @activity.defn(name="run_agent")
    async def run_agent(self, inp: RunAgentInput) -> RunAgentResult:
        """An agent program (`env: agent`) as the endpoint would relay it: `agent_turns` chat requests, each the
        whole history so far plus a user message, as updates of the calling trajectory; fails for `fail_seeds`
        (after its first turn), as a program that crashed."""
        self._record("run_agent", f"seed={inp.seed}", inp)
        handle = activity.client().get_workflow_handle(activity.info().workflow_id)
        messages = [ChatMessage(role="user", content=f"seed {inp.seed}")]
        for k in range(self.agent_turns):
            reply = await handle.execute_update(
                CHAT_UPDATE, ChatInput(messages=messages, trajectory=inp.trajectory), result_type=ChatReply
            )
            if inp.seed in self.fail_seeds:
                raise ApplicationError("the agent program exited 1", type=ErrorType.AGENT_FAILED, non_retryable=True)
            said = ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)
            messages = [*messages, said, ChatMessage(role="user", content=f"after turn {k}")]
        return RunAgentResult(reward=float(self.agent_turns), success=True)

    # ------------------------------------------------------------------ engine

    def _generation(self, data_key: str, n: int, min_version: int | None, engine: str = "") -> GenerateResult:
        """n answers "R" with the version served, checking the caller asked for no version not yet published."""
        k = len(self.called("generate")) - 1
        v = self.version if self.versions is None else self.versions[min(max(k, 0), len(self.versions) - 1)]
        self._check(
            min_version is None or v >= min_version,
            f"{data_key}: asked for policy >= {min_version}, but only {v} was published",
        )
        pressure = EnginePressure(running=1, kv_usage=0.1) if engine else None
        pool = activity.info().task_queue.removeprefix(self.prefix)
        if not engine and pool in self.pool_rates:  # a pool's one engine, measuring its rate (tokens/s) both ways
            engine, calls = f"stand-in-{pool}", len([c for c in self.calls if c.queue == activity.info().task_queue])
            tokens, seconds = 100 * calls, 100 * calls / self.pool_rates[pool]
            pressure = EnginePressure(prefill_tokens=tokens, prefill_s=seconds, decode_tokens=tokens, decode_s=seconds)
        return GenerateResult(
            completions=[Completion(text="R", num_tokens=1, finish_reason="length")] * n,
            prompt_tokens=1,
            policy_version=v,
            policy_version_end=v,
            data_key=data_key,
            worker_id=engine,
            queue=self.engine_queue(engine) if engine and engine in self.engines else "",
            pressure=pressure,
        )

    def _reject(self, data_keys: list[str]) -> None:
        """The engine refuses a request, as vLLM does a prompt over max_model_len: no retry can help."""
        if self.rejected_key and any(self.rejected_key in key for key in data_keys):
            raise ApplicationError(
                f"request {self.rejected_key} refused", type=ErrorType.REQUEST_REJECTED, non_retryable=True
            )

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        return await self._generate(inp)

    async def _generate(self, inp: GenerateInput, engine: str = "") -> GenerateResult:
        self._record("generate", f"{inp.data_key} n={inp.sampling.n}", inp, engine)
        self._refuse_pinned(engine)
        self._reject([inp.data_key])
        await _busy(self.turn_delay_s)
        min_version = inp.weights.min_version if inp.weights else None
        return self._generation(inp.data_key, inp.sampling.n, min_version, engine)

    def _refuse_pinned(self, engine: str) -> None:
        """A busy engine refuses what came through its private queue, as GenerateActivities does."""
        if engine in self.busy_engines and activity.info().task_queue == self.engine_queue(engine):
            raise ApplicationError(f"{engine} is busy", type=ErrorType.ENGINE_BUSY, non_retryable=True)

    @activity.defn(name="generate_batch")
    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        return await self._generate_batch(inp)

    async def _generate_batch(self, inp: GenerateBatchInput, engine: str = "") -> list[GenerateResult]:
        self._record("generate_batch", str(len(inp.prompts)), inp, engine)
        self._refuse_pinned(engine)
        if self.broken_engine_group and f"{self.broken_engine_group}-" in inp.data_keys[0]:
            raise ApplicationError("engine crashed", type="EngineError", non_retryable=True)
        self._reject(inp.data_keys)
        slow = self.slow_batches_after is not None and len(self.called("generate_batch")) > self.slow_batches_after
        await _busy(60.0 if slow else self.turn_delay_s)
        if self.held_group and f"{self.held_group}-" in inp.data_keys[0] and "turn-000" in inp.data_keys[0]:
            with contextlib.suppress(asyncio.TimeoutError):  # lockstep: no other group steps before this returns
                await asyncio.wait_for(self._other_group_stepped.wait(), HELD_WAIT_S)
            self.calls.append(Call("held", "", "released" if self._other_group_stepped.is_set() else "timed out", None))
        min_version = inp.weights.min_version if inp.weights else None
        return [self._generation(key, inp.sampling.n, min_version, engine) for key in inp.data_keys]

    # ------------------------------------------------------------------ reward and trainer

    @activity.defn(name="reward")
    async def reward(self, inp: RewardInput) -> RewardResult:
        self._record("reward", inp.transcript.task, inp)
        return self.score(inp.transcript)

    @activity.defn(name="reward_batch")
    async def reward_batch(self, inp: RewardBatchInput) -> list[RewardResult]:
        self._record("reward_batch", str(len(inp.transcripts)), inp)
        return [self.score(t) for t in inp.transcripts]

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        self._record("train_step", str(inp.step), inp)
        await asyncio.sleep(self.train_delay_s)
        self.version = inp.step + 1
        metrics = self.train_metrics(inp) if self.train_metrics else {"loss": 0.0}
        return TrainStepResult(step=inp.step, version=inp.step + 1, weights_key="k", metrics=metrics)


class _Engine:
    """One named stand-in generation worker: the stand-ins' engine, recording which engine served a call."""

    def __init__(self, s: StandIns, name: str) -> None:
        self.s, self.name = s, name

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        return await self.s._generate(inp, self.name)

    @activity.defn(name="generate_batch")
    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        return await self.s._generate_batch(inp, self.name)


@dataclass
class StandInPool:
    """The named stand-in engines' workers, each engine's on the pool's queue and on its private one."""

    stacks: dict[str, contextlib.AsyncExitStack] = field(default_factory=dict)

    async def stop_engine(self, name: str) -> None:
        """Stop both workers of engine `name`, as a killed generation worker: its private queue goes unpolled."""
        await self.stacks.pop(name).aclose()


@contextlib.asynccontextmanager
async def standin_workers(
    client: Client,
    s: StandIns,
    *,
    workflows: Sequence[type] = ALL_WORKFLOWS,
    reward_pools: Sequence[str] = ("serverless",),
    missing_pools: Sequence[str] = (),
) -> AsyncIterator[StandInPool]:
    """A worker per queue the workflows route to, serving what a real worker of that pool serves.

    Rewards are served on `reward_pools` (a colocated reward goes to the generation pool); `missing_pools` get
    no worker (their work waits, as after a lost node). The control worker serves the real `describe_queues`,
    `live_engines` and `describe_children`. With `s.engines`, each named engine gets a worker on `h800` and one
    on its private queue (`StandInPool.stop_engine` stops both). When the block ends without an error, any check a
    stand-in failed fails the test.
    """
    p = s.prefix
    engine = [s.generate, s.generate_batch]
    queues: dict[str, list[Callable[..., Any]]] = {
        queue_name("cpu", p): [s.reset, s.reset_group, s.restore, s.prompts, s.check, s.run_agent],
        s.session_queue: [s.step, s.step_group, s.close],
        queue_name("h800", p): [] if s.engines else list(engine),
        queue_name("h20", p): list(engine),
        queue_name("trainer", p): [s.train_step],
    }
    for pool in dict.fromkeys(reward_pools):
        queues.setdefault(queue_name(pool, p), []).extend([s.reward, s.reward_batch])
    pool = StandInPool()
    async with contextlib.AsyncExitStack() as stack:
        if "control" not in missing_pools:
            live = QueueActivities(client)
            control = Worker(
                client,
                task_queue=queue_name("control", p),
                workflows=list(workflows),
                activities=[live.describe_queues, live.live_engines, ChildActivities(client).describe_children],
                workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),  # the checks the sandbox makes
            )
            await stack.enter_async_context(control)
        for queue, acts in queues.items():
            if not acts or any(queue == queue_name(pool_, p) for pool_ in missing_pools):
                continue
            await stack.enter_async_context(Worker(client, task_queue=queue, activities=acts))
        for name in s.engines:
            pool.stacks[name] = own = contextlib.AsyncExitStack()
            stack.push_async_callback(_close_if_open, pool, name)
            e, own_client = _Engine(s, name), await _own_client(client)  # a process of its own: its own client
            for queue in (queue_name("h800", p), s.engine_queue(name)):
                await own.enter_async_context(
                    Worker(own_client, task_queue=queue, activities=[e.generate, e.generate_batch], identity=name)
                )
        yield pool
    assert not s.violations, "the stand-ins saw calls they should not have:\n" + "\n".join(s.violations)


async def start_training(client: Client, spec: JobSpec, job_id: str, prefix: str = "") -> WorkflowHandle:
    """Start `spec` as a training job on the stand-ins' control queue (of `prefix`), as `rollart train` does."""
    return await client.start_workflow(
        "TrainingWorkflow",
        TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
        id=job_id,
        task_queue=queue_name("control", prefix),
        result_type=TrainingResult,
    )


async def _own_client(client: Client) -> Client:
    """A new connection like `client`'s (one client may not run two workers of one queue, as two engines do)."""
    config = client.service_client.config
    return await Client.connect(
        config.target_host, namespace=client.namespace, data_converter=client.data_converter, runtime=config.runtime
    )


async def _close_if_open(pool: StandInPool, name: str) -> None:
    if name in pool.stacks:
        await pool.stop_engine(name)
