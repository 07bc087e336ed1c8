"""Forward passes in lockstep over ranks whose forward is a collective (FSDP2: each layer's weights are gathered
in it): a rank with fewer micro-batches in a pass than another runs no-loss "filler" micro-batches until it has
run as many, or the ranks' all-gathers would pair up wrongly and hang.

A filler is one sequence of two pad tokens whose only completion token is masked out of the loss, with no
advantage and no entropy bonus: its loss and metrics are 0 and its gradient is 0, but its forward and
backward take part in every collective like a real micro-batch's.
"""

from __future__ import annotations

from rollart.activities.rl.action_entropy import ActionTerm
from rollart.activities.rl.batch import MicroBatch, TrainSequence, micro_batch
from rollart.activities.training.ranks import Ranks

__all__ = ["filler", "fillers", "in_lockstep"]


def filler(pad_id: int, task: str = "") -> TrainSequence:
    """A sequence that contributes nothing to the loss (`task`: a task the entropy over actions knows)."""
    return TrainSequence([pad_id], [pad_id], [0.0], 0.0, prox_logprobs=[0.0], task=task, bonus=0.0, loss_mask=[0])


def fillers(
    ranks: Ranks | None, count: int, pad_id: int, actions: ActionTerm | None = None, packed: bool = False
) -> list[MicroBatch]:
    """The filler micro-batches this rank runs besides its `count` real ones in a pass (none unless the ranks'
    forward passes are collectives), `packed` like the real ones (`trainer.packing`). A collective itself: call it
    on every rank *before* the pass's forwards."""
    if ranks is None or not ranks.forward_in_lockstep:
        return []
    most = ranks.max_over_data(count)
    task = next(iter(actions.spaces), "") if actions is not None else ""
    return [micro_batch([filler(pad_id, task)], pad_id, packed=packed) for _ in range(most - count)]


def in_lockstep(
    ranks: Ranks | None,
    batches: list[MicroBatch],
    pad_id: int,
    actions: ActionTerm | None = None,
    packed: bool = False,
) -> list[MicroBatch]:
    """`batches` followed by this rank's fillers (see `fillers`)."""
    return [*batches, *fillers(ranks, len(batches), pad_id, actions, packed)]
