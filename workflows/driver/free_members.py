"""A GRPO group whose members play free of lockstep: each advances on its own, inside the group's one workflow.

A lockstep group (workflows/driver/group.py) plays a turn for all its members at once, so a turn waits for the
slowest member and a group takes the sum of its per-turn maxima. A per-episode workflow frees each member, at the
cost of a child workflow and a result signal each. Here each member is an `Episode` with its own env session
and its own reset, generate, step and reward calls, played concurrently in the group's workflow: the group takes
its slowest member's own time, and reports once, when every member is done (GRPO scores a group as a whole).
Calls that finish together are answered in one workflow task, as Temporal batches whatever arrived.

The members share one engine pin (workflows/driver/affinity.py): their first prompt is the same (one seed),
so the engine that served one member's turn holds every member's prefix in its cache.

A chat env's members play here as they would as trajectories (each its own conversation, token by token). An
agent program's (`env: agent`) each run their own program, whose chat requests name their member
(`AgentRoster`): a job of chat or agent tasks holds its episodes in flight in a few group workflows rather than a
child workflow each, past the server's limit on pending children.
"""

from __future__ import annotations

import asyncio

from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryResult
from rollart.workflows.driver.agent import AgentEpisode, AgentRoster
from rollart.workflows.driver.calls import Calls
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.lockstep import Report, play

__all__ = ["play_free"]


async def play_free(
    calls: Calls, inp: GroupRolloutInput, group: GroupSeed, report: Report | None, agents: AgentRoster | None = None
) -> list[TrajectoryResult]:
    """Each member of `group` start → (generate → step)* → score → close on its own (an agent program's: its program,
    its requests served through `agents`); one report for the group.

    A member whose call fails for good ends `failed` (masked), the others play on. A bad input fails the run:
    the members still playing are cancelled (each closes its session) and the error is raised.
    """
    members = GroupEpisode(calls, inp, group).members
    if inp.task.is_agent:
        if agents is None:
            raise ValueError("an agent program's members need the roster their workflow's chat update serves")
        programs = [agents.add(AgentEpisode(ep, trajectory=ep.trajectory_id)) for ep in members]
        playing = [asyncio.ensure_future(_play_and_predict(ep, members, agent)) for ep, agent in zip(members, programs)]
    else:
        playing = [asyncio.ensure_future(_play_and_predict(ep, members)) for ep in members]
    try:
        per_member = await asyncio.gather(*playing)
    except GeneratorExit:
        raise  # torn down without a cancellation: nothing is owed (lockstep._then)
    except BaseException:
        for task in playing:
            task.cancel()
        await asyncio.gather(*playing, return_exceptions=True)
        raise
    results = [r for member in per_member for r in member]
    if report is not None:
        await report(results)
    return results


async def _play_and_predict(
    ep: Episode, members: list[Episode], agent: AgentEpisode | None = None
) -> list[TrajectoryResult]:
    """Play one member (by its program, for an agent's); once it is done its length predicts its siblings'
    (`engine.priority: predicted`, as Seer: members of one group, from one seed, run alike), the longest finished
    so far."""
    results = [await agent.play()] if agent is not None else await play([ep])
    for other in members:
        if other is not ep and not other.over:
            other.predicted_turns = max(other.predicted_turns or 0, len(ep.turns))
    return results
