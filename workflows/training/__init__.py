"""The training job: `TrainingWorkflow` (workflow.py), a thin shell over pure decisions it takes on its state.

- loop.py: the loop's reactions, once (what a report does, when it wakes, what a step trains with and what
  follows it); the workflow and the simulator's shell (simulator/shell.py) both call it;
- continuation.py: when a run continues as new, before its history or signals near the server's limits;
- admission.py: how much may be in flight, which task group g draws, what one launch starts;
- placement.py: which generation pool each `generate_pool: auto` task goes to, re-planned from measurements;
- lengths.py: each task's recent trajectory length, which `engine.priority: predicted` ranks by;
- pressure.py: the cap on trajectories in flight that the engines' pressure allows (AIMD, below the bound's);
- ledger.py: results into the buffer and groups, batches out, the partial batch of a stalled job;
- staleness.py and filtering.py: groups too old for the step, groups without a GRPO signal;
- records.py: what a trained step does to the state, its record, the status and the result.

Entropy control (workflows/entropy_control.py), the stop rule (workflows/stopping.py) and the stall rules
(workflows/stalls.py) are pure modules of their own. None of these needs a server to be tested.
"""

from rollart.workflows.training.workflow import TrainingWorkflow

__all__ = ["TrainingWorkflow"]
