"""The training workflow's bookkeeping as plain code: admission arithmetic, the staleness filter, batches."""

from __future__ import annotations

from rollart.contracts.activities import SampleRef
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import InFlight, TrainingInput, TrainingState
from rollart.infra.config import JobSpec, TrainingConfig
from rollart.workflows.training import TrainingWorkflow
from tests.support.tasks import frozenlake_task


def loop(bound: int = 1, batch: int = 8, group: int = 4, **state: object) -> TrainingWorkflow:
    job = JobSpec(
        tasks=[frozenlake_task(group_size=group)], training=TrainingConfig(batch_size=batch, async_bound=bound)
    )
    return TrainingWorkflow(TrainingInput(job=job, job_id="j", run_dir="/r", state=TrainingState(**state)))


def sample(tid: str, group: str, version: int) -> SampleRef:
    return SampleRef(
        trajectory_id=tid,
        task="frozenlake",
        group_id=group,
        reward=1.0,
        success=True,
        turn_keys=[],
        policy_version_min=version,
        policy_version_max=version,
    )


def test_admission_keeps_bound_plus_one_batches_in_flight_and_buffered() -> None:
    wf = loop(bound=1, batch=8, group=4)  # capacity (1 + 1) x 8 = 16
    wf.s.in_flight = {f"t{i}": InFlight(group="g", workflow="w") for i in range(8)}
    wf.s.buffer = [sample(f"b{i}", "h", 0) for i in range(4)]
    assert wf._capacity() == 16 and wf._can_launch()  # 12 + 4 ≤ 16
    wf.s.buffer.append(sample("b4", "h", 0))
    assert not wf._can_launch()  # 13 + 4 > 16
    assert loop(bound=0, batch=8)._capacity() == 8
    paused = loop(paused=True)
    assert not paused._can_launch()


def test_stale_groups_are_dropped_and_counted_fresh_ones_batched_whole() -> None:
    wf = loop(bound=1, batch=8, group=4, step=3)
    wf.s.buffer = (
        [sample(f"a{i}", "old", 1) for i in range(4)]  # 3 - 1 = 2 > 1: stale
        + [sample(f"b{i}", "ok", 2) for i in range(4)]  # 3 - 2 = 1: admissible
        + [sample(f"c{i}", "new", 3) for i in range(4)]  # on-policy
        + [sample(f"d{i}", "open", 3) for i in range(2)]
    )  # group not complete yet
    wf.s.ready_groups = ["old", "ok", "new"]
    assert wf._batch_ready()  # 8 admissible in complete groups
    wf._drop_stale()
    assert wf.s.dropped == 4 and wf.s.ready_groups == ["ok", "new"]
    batch = wf._take_batch()
    assert [x.group_id for x in batch] == ["ok"] * 4 + ["new"] * 4
    assert [x.trajectory_id for x in wf.s.buffer] == ["d0", "d1"]  # the open group waits


def test_signals_fill_groups_and_mask_failures() -> None:
    wf = loop(group=2)
    wf.s.in_flight = {"g-0": InFlight(group="g", workflow="w0"), "g-1": InFlight(group="g", workflow="w1")}
    wf.s.unfinished = {"g": 2}
    wf.s.started = 2
    ok = TrajectoryResult(
        trajectory_id="g-0",
        task="frozenlake",
        seed=1,
        status="completed",
        group_id="g",
        reward=0.5,
        success=False,
        policy_version_min=0,
        policy_version_max=0,
    )
    wf.trajectories_done([ok])
    assert wf.s.ready_groups == [] and len(wf.s.buffer) == 1
    failed = TrajectoryResult(trajectory_id="g-1", task="frozenlake", seed=1, status="failed", group_id="g", error="x")
    wf.trajectories_done([failed, ok])  # the repeat of g-0 is a duplicate: ignored, counted
    assert wf.s.failed == 1 and wf.s.duplicates_ignored == 1 and wf.s.ready_groups == ["g"]
    assert wf.s.ledger_balanced  # 2 started = 1 buffered + 1 failed


def test_a_partial_batch_trains_when_nothing_else_can_happen() -> None:
    wf = loop(bound=0, batch=8, group=8)
    wf.s.buffer = [sample(f"a{i}", "g", 0) for i in range(6)]  # two members of the group of 8 failed
    wf.s.ready_groups = ["g"]
    assert not wf._batch_ready() and not wf._can_launch() and wf._stalled()
