"""Temporal workflows only: deterministic orchestration, no I/O, no torch or vLLM."""

from rollart.workflows.trajectory import TrajectoryWorkflow

ALL_WORKFLOWS: list[type] = [TrajectoryWorkflow]
"""Every workflow the control pool's worker registers."""

__all__ = ["ALL_WORKFLOWS", "TrajectoryWorkflow"]
