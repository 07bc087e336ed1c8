"""The loop's `Ledger` at 10,000 trajectories in flight: the same answers, kept incrementally.

`loop.Ledger` answers `batch_ready`, `train_partial` and `stale_ready` with the pure modules, which scan the
whole buffer once per complete group (`staleness.is_stale`): O(groups × buffer) each time the loop wakes. The
workflow wakes once per workflow task; the simulator would wake once per report, and at 10,000 in flight that
alone costs hours. This index, behind the same interface, keeps per complete group its members in the buffer
and their oldest policy version, updated through the ledger's hooks as results are accepted, so the same
answers cost O(complete groups). It decides nothing of its own (the loop core still acts: launches, accept),
but for `take_batch` and `drop_stale`, which it redoes in one pass over the buffer instead of one or two per
complete group (same groups, same order). Tests check that both give the same run.
"""

from __future__ import annotations

import math

from rollart.contracts.activities import SampleRef
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import TrainingPlan, TrainingState
from rollart.workflows.training import admission, loop

__all__ = ["Indexed"]


class Indexed(loop.Ledger):
    """The same answers from a per-group index: members buffered and the oldest version among them, and for the
    complete groups, their members and their number by that oldest version (a group's staleness is a function
    of it and the step), so each answer costs O(versions in the buffer), a few."""

    def __init__(self, plan: TrainingPlan) -> None:
        super().__init__(plan)
        self._count: dict[str, int] = {}
        self._oldest: dict[str, float] = {}
        self._ready = 0  # complete groups indexed (a prefix of the state's ready_groups)
        self._members_by_oldest: dict[float, int] = {}
        self._groups_by_oldest: dict[float, int] = {}

    def accepting(self, state: TrainingState, results: list[TrajectoryResult]) -> None:
        """Index what `ledger.accept` will buffer: completed results of trajectories in flight (its own test)."""
        for r in results:
            if r.trajectory_id not in state.in_flight:
                continue
            if r.status == "completed" and r.reward is not None and r.policy_version_min is not None:
                g = r.group_id
                self._count[g] = self._count.get(g, 0) + 1
                self._oldest[g] = min(self._oldest.get(g, math.inf), r.policy_version_min)

    def accepted(self, state: TrainingState) -> None:
        """`ledger.accept` appended the groups it completed to the ready list: index them."""
        for g in state.ready_groups[self._ready :]:
            self._add(g)
        self._ready = len(state.ready_groups)

    def _add(self, g: str) -> None:
        oldest = self._oldest.get(g, math.inf)
        self._members_by_oldest[oldest] = self._members_by_oldest.get(oldest, 0) + self._count.get(g, 0)
        self._groups_by_oldest[oldest] = self._groups_by_oldest.get(oldest, 0) + 1

    def settled(self, state: TrainingState) -> None:
        live = set(state.ready_groups) | set(state.unfinished)
        for g in [g for g in self._count if g not in live]:
            del self._count[g], self._oldest[g]
        self._members_by_oldest, self._groups_by_oldest = {}, {}
        for g in state.ready_groups:
            self._add(g)
        self._ready = len(state.ready_groups)

    def _stale(self, s: TrainingState, g: str) -> bool:
        return self._too_old(s, self._oldest.get(g, math.inf))

    def _too_old(self, s: TrainingState, oldest: float) -> bool:
        return s.step - oldest > self.plan.training.async_bound

    def batch_ready(self, s: TrainingState) -> bool:
        fresh = sum(n for v, n in self._members_by_oldest.items() if not self._too_old(s, v))
        return fresh >= self.plan.training.batch_size

    def train_partial(self, s: TrainingState) -> bool:
        if s.in_flight or s.paused or admission.can_launch(self.plan, s):
            return False
        return any(n and not self._too_old(s, v) for v, n in self._groups_by_oldest.items())

    def stale_ready(self, s: TrainingState) -> bool:
        return any(n and self._too_old(s, v) for v, n in self._groups_by_oldest.items())

    def drop_stale(self, s: TrainingState) -> int:
        """`staleness.drop_stale` in one pass over the buffer (it scans the buffer once per complete group, and the
        loop drops each time a stale group completes: at 10,000 in flight that was most of the run)."""
        gone = {g for g in s.ready_groups if self._stale(s, g)}
        if not gone:
            return 0
        keep = [x for x in s.buffer if x.group_id not in gone]
        dropped = len(s.buffer) - len(keep)
        s.buffer = keep
        s.ready_groups = [g for g in s.ready_groups if g not in gone]
        s.dropped += dropped
        return dropped

    def take_batch(self, s: TrainingState) -> list[SampleRef]:
        """`ledger.take_batch` in one pass over the buffer: whole ready groups, oldest first, until the batch is
        full; each group's members in buffer order (it scans the buffer twice per group)."""
        taken: list[str] = []
        size = 0
        while size < self.plan.training.batch_size and s.ready_groups:
            g = s.ready_groups.pop(0)
            taken.append(g)
            size += self._count.get(g, 0)
        members: dict[str, list[SampleRef]] = {g: [] for g in taken}
        rest: list[SampleRef] = []
        for x in s.buffer:
            members.get(x.group_id, rest).append(x)
        s.buffer = rest
        return [x for g in taken for x in members[g]]
