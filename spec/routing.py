"""Which workflow plays a task: the one routing decision that training, `rollart rollout`, `rollart eval` and the
benches all take.

A task's *unit* is the piece of work one workflow plays:

- `trajectory`: one episode in its own TrajectoryWorkflow, advancing on its own (multi-turn tasks, the default);
- `group`: GRPO groups inside one GroupRolloutWorkflow (multi-turn, `rollout_unit: group`), each in lockstep in
  one env session or its members free (`group_play`);
- `single_turn_wave`: single-turn groups, a wave of them in one GroupRolloutWorkflow (prompts → generate n →
  check → reward_batch: no env session);
- `lockstep_batch`: the per-episode tasks of a batch-mode batch, phase by phase in one BatchRolloutWorkflow.

Pure and deterministic: workflow code calls it too.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the job spec's own rules ask this module too (JobSpec)
    from rollart.spec.config.task import TaskSpec

__all__ = ["RolloutMode", "Unit", "unit_of"]

RolloutMode = Literal["trajectory", "batch"]
"""`training.rollout_mode`: every unit on its own, or the synchronous baseline's barrier after each phase.
`rollart rollout` and `rollart eval` play as `trajectory` does."""


class Unit(str, Enum):
    """What one workflow plays; the value names it in docs and logs."""

    TRAJECTORY = "trajectory"
    GROUP = "group"
    SINGLE_TURN_WAVE = "single_turn_wave"
    LOCKSTEP_BATCH = "lockstep_batch"

    @property
    def workflow(self) -> str:
        """The workflow type that plays this unit."""
        return _WORKFLOWS[self]

    @property
    def grouped(self) -> bool:
        """Whether a group's members play inside one workflow (a GroupRolloutWorkflow) rather than one each."""
        return self in (Unit.GROUP, Unit.SINGLE_TURN_WAVE)


_WORKFLOWS = {
    Unit.TRAJECTORY: "TrajectoryWorkflow",
    Unit.GROUP: "GroupRolloutWorkflow",
    Unit.SINGLE_TURN_WAVE: "GroupRolloutWorkflow",
    Unit.LOCKSTEP_BATCH: "BatchRolloutWorkflow",
}


def unit_of(task: TaskSpec, mode: RolloutMode = "trajectory") -> Unit:
    """The unit `task` plays in under `mode`.

    A single-turn episode needs no env session, so its groups always play as waves; a multi-turn task plays as
    its `rollout_unit` says, its groups phase by phase with the others in batch mode (`GroupRolloutInput.lockstep`),
    its episodes in one lockstep batch. An agent program's episode (`env: agent`) is never in lockstep, whatever the
    mode: the program, not a phase barrier, decides when each of its turns comes. It plays as its own trajectory, or
    as a free member of its group (`rollout_unit: group`, `group_play: free`).
    """
    if task.is_agent:
        return Unit.GROUP if task.rollout_unit == "group" else Unit.TRAJECTORY
    if task.max_turns == 1:
        return Unit.SINGLE_TURN_WAVE
    if task.rollout_unit == "group":
        return Unit.GROUP
    return Unit.LOCKSTEP_BATCH if mode == "batch" else Unit.TRAJECTORY
