"""TrajectoryWorkflow: one agentic episode, reset → (generate → step)* → reward → close.

Each activity goes to its pool's queue: reset to the env pool ("cpu"), generate to the task's generation
pool, step/close to the private queue of the env worker holding the session (sticky), reward to
"serverless". The calls and their failure handling are the rollout driver's (workflows/driver).

An agent program's episode (`env: agent`) runs the program instead (`run_agent` on the env pool) and plays each
of its chat requests as a turn: the `chat` update (workflows/driver/agent.py).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.agent import CHAT_UPDATE, ChatInput, ChatReply
    from rollart.contracts.rollouts import TrajectoryArgs, TrajectoryInput, TrajectoryResult
    from rollart.spec.config import TaskSpec
    from rollart.workflows.driver.agent import AgentEpisode, AgentRoster
    from rollart.workflows.driver.episode import Episode
    from rollart.workflows.driver.lockstep import play
    from rollart.workflows.reporting import TRAJECTORIES_DONE, Reporter, report
    from rollart.workflows.temporal_calls import TemporalCalls
    from rollart.workflows.ui_summary import show_outcome

__all__ = ["TRAJECTORIES_DONE", "TrajectoryWorkflow", "report"]


@workflow.defn(name="TrajectoryWorkflow", failure_exception_types=[ValidationError])
class TrajectoryWorkflow:
    """Runs one episode; a broken env or worker ends it as `failed` (never scored), bad input fails the workflow."""

    def __init__(self) -> None:
        self._episode: Episode | None = None
        self._agents = AgentRoster()

    @workflow.query(name="turns")
    def turns(self) -> int:
        """How many turns have been played so far."""
        return len(self._episode.turns) if self._episode else 0

    @workflow.update(name=CHAT_UPDATE)
    async def chat(self, req: ChatInput) -> ChatReply:
        """One chat request of the agent program playing this trajectory: a turn, sampled and recorded."""
        return await self._agents.find(req).chat(req)

    @chat.validator
    def _admit_chat(self, req: ChatInput) -> None:
        """Refuse a request that cannot be played (not an agent's trajectory, over, past max_turns, continuing a
        history it does not hold) before it is accepted: a refused request leaves nothing in the history (the
        handler checks again, under its lock)."""
        self._agents.find(req).check(req)

    @workflow.run
    async def run(
        self, args: TrajectoryInput | TrajectoryArgs, task: TaskSpec | None = None
    ) -> TrajectoryResult | None:
        """Play the episode. Started by a training workflow (`args` and its `task` apart), it returns its result only
        if the report did not reach the parent; started alone (a `TrajectoryInput`), it returns it."""
        inp = TrajectoryArgs.whole(args, task)
        self._episode = Episode(TemporalCalls(), inp, inp.trajectory_id or workflow.info().workflow_id)
        send = Reporter(inp.report_to)
        if inp.task.is_agent:
            result = await self._agents.add(AgentEpisode(self._episode)).play(send)
            await workflow.wait_condition(workflow.all_handlers_finished)
        else:
            [result] = await play([self._episode], send)
        show_outcome([result])
        return result if send.undelivered else None
