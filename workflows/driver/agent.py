"""An agent program's trajectory: the program runs on an env worker (`run_agent`), and each of its chat requests is
a turn played here, inside the trajectory's workflow (the `chat` update), so that every turn is durable, visible in
the UI and recorded — tokens and all — like a turn of an env's episode.

A request that extends the conversation so far goes on token by token (`prefix_key`: the engine appends only the
new messages to the tokens it sampled); one that rewrote history starts a new segment (contracts/conversation.py).
The endpoint sends a continuing request as its new messages only, with the digest of the history it continues,
which is checked here. Turns are played one at a time (a lock): a conversation is one sequence. The program's crash,
non-zero exit, kill or timeout fails the trajectory (masked, never scored); what it returns is its reward, or
the task's reward scores the transcript when it returns None.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio.exceptions import ApplicationError

from rollart.contracts.activities import ActivityName, TurnRecord, turn_key
from rollart.contracts.agent import ChatInput, ChatReply, RunAgentInput, RunAgentResult, TurnRefused
from rollart.contracts.agent_workflow import agent_queue
from rollart.contracts.conversation import TurnPlan, history_digest, plan_turn
from rollart.contracts.errors import ErrorType
from rollart.contracts.generation import GenerateInput, GenerateResult, WeightsRef
from rollart.contracts.rollouts import TrajectoryResult
from rollart.spec.chat import ChatMessage, messages_text
from rollart.spec.config.agent import AgentArgs
from rollart.workflows.driver.affinity import generate_on
from rollart.workflows.driver.calls import CallFailed
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.lockstep import guarded
from rollart.workflows.driver.priority import request_priority

__all__ = ["POLICY_ENDINGS", "RUN_AGENT_SLACK_S", "AgentEpisode", "AgentRoster"]

POLICY_ENDINGS = frozenset({"MaxTurnsExceeded", "ModelBehaviorError"})
"""The Agents SDK errors that end a Temporal-native agent's episode by the policy's doing: the episode is scored."""

AGENTS_USER_ERROR = "UserError"
"""The Agents SDK's error for an agent set up wrong: the job's bad input."""

RUN_AGENT_SLACK_S = 60.0
"""How much longer than the program's own `timeout_s` the `run_agent` call may take (the activity kills the program
at `timeout_s`; this is a backstop for a worker that cannot)."""

Report = Callable[[list[TrajectoryResult]], Awaitable[None]]


@dataclass
class AgentEpisode:
    """One agent program's episode: its turns (in `episode`, as an env episode keeps them) and its conversation.

    `history` is the current segment as the program sees it: its requests' messages and the replies returned;
    `tools` the segment's tools. `over` once the program has ended: later requests are refused.
    """

    episode: Episode
    trajectory: str = ""  # the member it is, in a workflow that plays several (a group's free members); "": its own
    history: list[ChatMessage] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    over: bool = False
    bad_input: CallFailed | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def chat(self, req: ChatInput) -> ChatReply:
        """One turn: the request's messages (new ones, or all of a new segment) → one sampled assistant message."""
        async with self._lock:
            self.check(req)
            ep = self.episode
            task, inp = ep.inp.task, ep.inp
            if req.history_len:  # the endpoint sent the new messages only: checked by `check`
                plan = TurnPlan(continues=True, messages=list(req.messages))
            else:
                plan = plan_turn(self.history, self.tools, req.messages, req.tools)
            gen_input = GenerateInput(
                prompt=messages_text(plan.messages),
                sampling=task.sampling,
                weights=WeightsRef(job_id=inp.job_id, min_version=inp.min_version) if inp.job_id else None,
                prompt_format=task.prompt,
                data_key=turn_key(inp.job_id, ep.trajectory_id, len(ep.turns)),
                messages=plan.messages,
                tools=None if plan.continues else req.tools,
                prefix_key=ep.gens[-1].data_key if plan.continues else None,
                tool_parser=task.tool_parser,
                priority=request_priority(inp.priority, len(ep.turns), inp.predicted_turns),
            )
            try:
                gen: GenerateResult = await generate_on(
                    ep.calls,
                    inp.affinity,
                    ep.pin,
                    ActivityName.GENERATE,
                    gen_input,
                    shared=ep.queue(task.generate_pool),
                    result_type=GenerateResult,
                )
            except CallFailed as err:
                raise self._failed_turn(err) from err
            completion = gen.completions[0]
            message = completion.message or ChatMessage(role="assistant", content=completion.text)
            ep.gens.append(gen)
            ep.turns.append(TurnRecord(observation=gen_input.prompt, action=completion.text, message=message))
            if not plan.continues:
                self.history, self.tools = [], req.tools
            self.history += [*plan.messages, message]
            return ChatReply(
                content=message.content,
                tool_calls=message.tool_calls,
                finish_reason="tool_calls" if message.tool_calls else completion.finish_reason,
                prompt_tokens=gen.prompt_tokens,
                completion_tokens=completion.num_tokens,
                policy_version=gen.policy_version_end,
                turn=len(ep.turns) - 1,
            )

    def check(self, req: ChatInput) -> None:
        """Raise the ApplicationError a request gets when it cannot be played: the episode is over, failed or at
        max_turns, or the request continues a history this trajectory does not hold (the endpoint resends it whole).
        Pure: the update's validator calls it too."""
        self.refuse_if_done()
        if req.history_len and (
            req.history_len != len(self.history) or req.history_digest != history_digest(self.history, self.tools)
        ):
            raise TurnRefused.HISTORY_MISMATCH.error(
                f"the request continues a conversation of {req.history_len} messages that this trajectory does not "
                f"hold (it holds {len(self.history)}): send the whole conversation"
            )

    def refuse_if_done(self) -> None:
        """Raise the ApplicationError a request gets once the episode is over, failed, or at max_turns."""
        ep = self.episode
        if self.over:
            raise TurnRefused.AGENT_DONE.error("this agent episode is over")
        if ep.error is not None:
            raise TurnRefused.AGENT_DONE.error(f"this trajectory has failed: {ep.error}")
        if len(ep.turns) >= ep.inp.task.max_turns:
            raise TurnRefused.MAX_TURNS.error(
                f"max_turns ({ep.inp.task.max_turns}) reached: this episode may make no more chat requests "
                "(raise the task's max_turns, or end the episode)"
            )

    def _failed_turn(self, err: CallFailed) -> ApplicationError:
        """The update's error for a generation that failed: the request's fault (the program may go on, e.g. with a
        shorter history), or the engine's after its retries (the trajectory fails: infra, masked)."""
        if err.bad_input:
            self.bad_input = self.bad_input or err  # a job that cannot work at all: fails the workflow at the end
        elif err.error_type != ErrorType.REQUEST_REJECTED:
            self.episode.error = self.episode.error or err.message
        return TurnRefused.REJECTED.error(err.message)

    async def play(self, report: Report | None = None) -> TrajectoryResult:
        """Run the program to its end (its turns come in meanwhile), then score and report the trajectory."""
        ep = self.episode
        task = ep.inp.task
        try:
            args = AgentArgs.parse(task.env_args)
        except ValueError as e:
            why = f"task {task.name!r}: env_args of an agent program: {e}"
            raise ErrorType.INVALID_INPUT.error(why) from e
        out: RunAgentResult | None = None
        try:
            if args.workflow is not None:
                out = await self._run_workflow(args)
            else:
                out = await ep.calls.call(
                    ActivityName.RUN_AGENT,
                    RunAgentInput(args=args, seed=ep.inp.seed, trajectory=self.trajectory),
                    queue=ep.queue(task.env_queue),
                    result_type=RunAgentResult,
                    timeout_s=args.timeout_s + RUN_AGENT_SLACK_S,
                )
        except CallFailed as err:
            if ep.error is None:
                ep.error, ep.error_type = err.mask(ep.calls, ep.owner_id), err.job_fault
        async with self._lock:  # a turn still being played ends first
            self.over = True
        if self.bad_input is not None:
            raise self.bad_input.as_input_error() from self.bad_input
        results = await self._results(out)
        if report is not None:
            await report(results)
        return results[0]

    async def _run_workflow(self, args: AgentArgs) -> RunAgentResult:
        """A Temporal-native agent: the user's agent workflow, started as this trajectory's child on the env pool's
        agent queue; its model calls come in as this trajectory's turns. Its result (as text) is the transcript's
        final observation, for the task's reward.

        How it ended decides the trajectory: an Agents SDK error that is the policy's doing (its own max turns, a
        reply it could not use) or a model call refused at the task's max_turns ends the episode, scored; an
        Agents SDK `UserError` is the job's bad input (it fails the job); a timeout, a worker fault or anything
        else fails the trajectory (masked, never scored)."""
        ep = self.episode
        try:
            result = await ep.calls.agent_workflow(
                args.workflow_name,
                args.input_of(ep.inp.seed),
                trajectory=self.trajectory,
                queue=agent_queue(ep.queue(ep.inp.task.env_queue)),
                timeout_s=args.timeout_s,
            )
        except CallFailed as err:
            if err.error_type == AGENTS_USER_ERROR:
                raise CallFailed(err.activity, err.why, error_type=ErrorType.INVALID_INPUT) from err
            policy_ended = err.error_type in POLICY_ENDINGS or len(ep.turns) >= ep.inp.task.max_turns
            if ep.error is not None or not policy_ended:
                raise
            ep.observation = err.why
            return RunAgentResult()
        ep.observation = result if isinstance(result, str) else json.dumps(result, sort_keys=True, default=str)
        return RunAgentResult()

    async def _results(self, out: RunAgentResult | None) -> list[TrajectoryResult]:
        ep = self.episode
        if ep.error is None and not ep.turns:
            ep.error = "the agent program made no chat request: nothing to train on"
        if ep.error is not None or out is None:
            return ep.results(None)
        if out.reward is not None:
            success = out.success if out.success is not None else out.reward > 0
            return [ep.result(status="completed", reward=out.reward, success=success)]
        if ep.inp.task.reward is None:  # nothing to score it with: the job's fault, never a 0
            raise ErrorType.INVALID_INPUT.error(
                f"task {ep.inp.task.name!r}: its agent program returned no reward and the task names no `reward:` "
                "to score the transcript: return the reward from run() (a `command`: print it, as JSON, on its last "
                "line), or set `reward:` (e.g. `reward: success`)"
            )
        return ep.results(await guarded(ep, ep.score))


class AgentRoster:
    """The agent episodes one workflow plays, by the trajectory a chat request names ("": the workflow's own): where
    its `chat` update and the update's validator find the episode a request is for."""

    def __init__(self) -> None:
        self._by_trajectory: dict[str, AgentEpisode] = {}

    def add(self, agent: AgentEpisode) -> AgentEpisode:
        self._by_trajectory[agent.trajectory] = agent
        return agent

    def find(self, req: ChatInput) -> AgentEpisode:
        """The episode `req` is for; the ApplicationError a request gets when this workflow plays none such."""
        agent = self._by_trajectory.get(req.trajectory)
        if agent is None:
            which = f"trajectory {req.trajectory!r} of this workflow" if req.trajectory else "this trajectory"
            raise TurnRefused.NOT_AN_AGENT.error(
                f"{which} is not played by an agent program (its task's env is not `agent`, or it has no such member)"
            )
        return agent
