"""Temporal workflows only: deterministic orchestration, no I/O, no torch or vLLM."""

from rollart.workflows.batch_rollout import BatchRolloutWorkflow
from rollart.workflows.group_rollout import GroupRolloutWorkflow
from rollart.workflows.training import TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

ALL_WORKFLOWS: list[type] = [TrajectoryWorkflow, BatchRolloutWorkflow, GroupRolloutWorkflow, TrainingWorkflow]
"""Every workflow the control pool's worker registers."""

__all__ = ["ALL_WORKFLOWS", "BatchRolloutWorkflow", "GroupRolloutWorkflow", "TrainingWorkflow", "TrajectoryWorkflow"]
