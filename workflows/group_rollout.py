"""GroupRolloutWorkflow: whole GRPO groups, a few activities for many samples.

Single-turn: an episode needs no env session — one `prompts` call for all seeds, one `generate_batch` for
every group's prompt with n = group size, one `check` and one `reward_batch` (workflows/driver/single_turn.py).

Multi-turn (`rollout_unit: group`): each group plays in lockstep inside one env session holding all its
members (`reset_group`), one `generate_batch` and one `step_group` per turn for the members still
playing, then one `reward_batch` (workflows/driver/group.py). Groups advance independently of each other
and each reports as soon is done — or, with `lockstep` (batch mode), all groups advance phase by
phase together, the synchronous baseline's barrier. Per trajectory that is ~2.4 activities instead of
~19 for 8-turn episodes in groups of 8: the unit to pick when Temporal's per-activity cost, not the env,
dominates a turn. A slow member holds its group back.

Free members (`group_play: free`, not in batch mode): each member plays on its own with its own env session and
calls, concurrently inside this workflow, and the group reports once (workflows/driver/free_members.py): the
trajectory-level asynchrony of per-episode workflows without a child workflow and a signal per episode. A chat
env's members play so, and an agent program's (`env: agent`): each runs its own program, whose chat requests are
this workflow's `chat` updates naming their member.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.agent import CHAT_UPDATE, ChatInput, ChatReply
    from rollart.contracts.rollouts import GroupRolloutArgs, GroupRolloutInput, TrajectoryResult
    from rollart.spec.config import TaskSpec
    from rollart.workflows.driver.agent import AgentRoster
    from rollart.workflows.driver.grouped import play_groups
    from rollart.workflows.reporting import Reporter
    from rollart.workflows.temporal_calls import TemporalCalls
    from rollart.workflows.ui_summary import show_outcome

__all__ = ["GroupRolloutWorkflow"]


@workflow.defn(name="GroupRolloutWorkflow", failure_exception_types=[ValidationError])
class GroupRolloutWorkflow:
    """Single-turn: prompts → generate_batch (n = group size) → check → reward_batch; multi-turn: see `GroupEpisode`."""

    def __init__(self) -> None:
        self._agents = AgentRoster()

    @workflow.update(name=CHAT_UPDATE)
    async def chat(self, req: ChatInput) -> ChatReply:
        """One chat request of the agent program playing member `req.trajectory`: a turn, sampled and recorded."""
        return await self._agents.find(req).chat(req)

    @chat.validator
    def _admit_chat(self, req: ChatInput) -> None:
        """Refuse a request that cannot be played before it is accepted (as a TrajectoryWorkflow does)."""
        self._agents.find(req).check(req)

    @workflow.run
    async def run(
        self, args: GroupRolloutInput | GroupRolloutArgs, task: TaskSpec | None = None
    ) -> list[TrajectoryResult]:
        """Play the groups; return the results whose report did not reach the training workflow (all of them when
        there is none: a rollout a client waits on)."""
        inp = GroupRolloutArgs.whole(args, task)
        send = Reporter(inp.report_to)
        results = await play_groups(TemporalCalls(), inp, send, self._agents)
        await workflow.wait_condition(workflow.all_handlers_finished)
        show_outcome(results)
        return send.undelivered
