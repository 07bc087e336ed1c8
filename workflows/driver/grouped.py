"""What one GroupRolloutWorkflow plays, by its input: the one place that picks how grouped rollouts run.

The workflow (workflows/group_rollout.py) and the in-process path (`rollart eval`, client/in_process.py) both call
`play_groups`, so that a grouped unit plays the same way with and without Temporal.
"""

from __future__ import annotations

import asyncio

from rollart.contracts.rollouts import GroupRolloutInput, TrajectoryResult
from rollart.spec.routing import Unit, unit_of
from rollart.workflows.driver.agent import AgentRoster
from rollart.workflows.driver.calls import Calls
from rollart.workflows.driver.free_members import play_free
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.lockstep import Report, play
from rollart.workflows.driver.single_turn import play_single_turn

__all__ = ["play_groups"]


async def play_groups(
    calls: Calls, inp: GroupRolloutInput, report: Report | None, agents: AgentRoster | None = None
) -> list[TrajectoryResult]:
    """Everything a GroupRolloutWorkflow plays, by its input: a single-turn wave (one `generate_batch` for all), or
    multi-turn groups, each on its own (free members or lockstep) or, in batch mode, all phase by phase together
    (an agent program's members play free in any mode: their requests come to `agents`). Each group reports as
    soon as it is done (a wave, once)."""
    if unit_of(inp.task) is Unit.SINGLE_TURN_WAVE:  # else multi-turn groups, whatever the task's rollout_unit
        results = await play_single_turn(calls, inp)
        if report is not None:
            await report(results)
        return results
    if inp.task.is_agent or (inp.group_play == "free" and not inp.lockstep):
        per_group = await asyncio.gather(*(play_free(calls, inp, g, report, agents) for g in inp.groups))
    elif inp.lockstep:
        return await play([GroupEpisode(calls, inp, g) for g in inp.groups], report)
    else:
        per_group = await asyncio.gather(*(play([GroupEpisode(calls, inp, g)], report) for g in inp.groups))
    return [r for results in per_group for r in results]
