"""The training workflow's ledger as plain code: results in, staleness, dynamic sampling, batches, step records.

Every test runs the pure modules of workflows/training/ on a `TrainingState`, no server; the last two play
whole jobs through them as the workflow's loop does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollart.contracts.activities import TrainStepResult
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import InFlight, TrainingPlan, TrainingState
from rollart.workflows.training import admission, filtering, ledger, records, staleness
from tests.support.tasks import frozenlake_task
from tests.support.training_plans import completed, plan, sample


def running(*groups: tuple[str, int]) -> TrainingState:
    """A state with groups (id, members) in flight, as a launch leaves it."""
    state = TrainingState()
    for group, size in groups:
        state.unfinished[group] = size
        for m in range(size):
            state.in_flight[f"{group}-{m}"] = InFlight(group=group, workflow=f"{group}-{m}")
            state.started += 1
    return state


def test_results_fill_groups_failures_are_masked_and_repeats_ignored() -> None:
    p, state = plan(frozenlake_task(group_size=2)), running(("g", 2))
    assert ledger.accept(p, state, [completed("g-0", "g", 0.5)]) == 1
    assert state.ready_groups == [] and len(state.buffer) == 1 and state.unfinished == {"g": 1}
    failed = TrajectoryResult(trajectory_id="g-1", task="frozenlake", seed=1, status="failed", group_id="g", error="x")
    assert ledger.accept(p, state, [failed, completed("g-0", "g")]) == 1  # the repeat of g-0: ignored, counted
    assert state.failed == 1 and state.duplicates_ignored == 1 and state.ready_groups == ["g"]
    assert state.unfinished == {} and state.ledger_balanced  # 2 started = 1 buffered + 1 failed
    assert ledger.accept(p, state, [completed("g-1", "g")]) == 0  # nothing in flight: no progress


def test_a_completed_result_without_a_reward_counts_as_failed_and_restores_add_up() -> None:
    p, state = plan(frozenlake_task(group_size=1)), running(("g", 1))
    unscored = completed("g-0", "g").model_copy(update={"reward": None, "restores": 2})
    ledger.accept(p, state, [unscored])
    assert state.failed == 1 and state.buffer == [] and state.restores == 2
    assert state.ready_groups == [] and state.ledger_balanced  # nothing of it to train on: never ready


def test_a_group_whose_members_all_failed_never_asks_for_a_step() -> None:
    """Found by the simulator: such a group, once ready, made a stalled job train on an empty batch."""
    p, state = plan(frozenlake_task(group_size=2), batch_size=8), running(("g", 2))
    failed = [
        TrajectoryResult(trajectory_id=f"g-{m}", task="frozenlake", seed=1, status="failed", group_id="g", error="x")
        for m in range(2)
    ]
    ledger.accept(p, state, failed)
    state.stop_requested = True  # nothing more is launched
    assert not ledger.train_partial(p, state) and ledger.take_batch(p, state) == []


def test_stale_groups_are_dropped_and_counted_fresh_ones_batched_whole() -> None:
    p = plan(async_bound=1, batch_size=8)
    state = TrainingState(step=3, started=14, ready_groups=["old", "ok", "new"])
    state.buffer = (
        [sample(f"a{i}", "old", 1) for i in range(4)]  # 3 - 1 = 2 > 1: stale
        + [sample(f"b{i}", "ok", 2) for i in range(4)]  # 3 - 2 = 1: admissible
        + [sample(f"c{i}", "new", 3) for i in range(4)]  # on-policy
        + [sample(f"d{i}", "open", 3) for i in range(2)]  # group not complete yet
    )
    assert ledger.batch_ready(p, state) and staleness.stale_ready(state, 1)  # 8 admissible in complete groups
    assert staleness.drop_stale(state, 1) == 4
    assert state.dropped == 4 and state.ready_groups == ["ok", "new"] and not staleness.stale_ready(state, 1)
    batch = ledger.take_batch(p, state)
    assert [x.group_id for x in batch] == ["ok"] * 4 + ["new"] * 4
    assert [x.trajectory_id for x in state.buffer] == ["d0", "d1"]  # the open group waits


def test_a_batch_is_whole_groups_so_it_may_run_over_the_batch_size() -> None:
    p = plan(frozenlake_task(group_size=3), async_bound=0, batch_size=6)
    sizes = {"g0": 2, "g1": 3, "g2": 3, "g3": 3}  # one member of g0 failed
    state = TrainingState(
        ready_groups=list(sizes), buffer=[sample(f"{g}-{m}", g) for g, n in sizes.items() for m in range(n)]
    )
    assert [x.group_id for x in ledger.take_batch(p, state)] == ["g0"] * 2 + ["g1"] * 3 + ["g2"] * 3  # 5 < 6: one more
    assert state.ready_groups == ["g3"] and len(state.buffer) == 3


def test_a_partial_batch_trains_only_when_nothing_else_can_happen() -> None:
    p = plan(frozenlake_task(group_size=8), async_bound=0, batch_size=8)
    state = TrainingState(ready_groups=["g"], buffer=[sample(f"a{i}", "g") for i in range(6)])  # two members failed
    assert not ledger.batch_ready(p, state) and not admission.can_launch(p, state) and ledger.train_partial(p, state)
    state.paused = True
    assert not ledger.train_partial(p, state)  # paused: waiting is what was asked for
    state.paused, state.in_flight = False, {"t": InFlight(group="h", workflow="t")}
    assert not ledger.train_partial(p, state)  # something may still report
    stale = TrainingState(step=2, ready_groups=["g"], buffer=[sample(f"a{i}", "g", 0) for i in range(6)])
    assert not ledger.train_partial(p, stale)  # only a stale group: nothing to train on


def flat_group(state: TrainingState, group: str, reward: float, size: int = 2) -> None:
    state.buffer += [sample(f"{group}-{m}", group, reward=reward) for m in range(size)]


def test_dynamic_sampling_filters_flat_groups_and_counts_them() -> None:
    p = plan(frozenlake_task(group_size=2), batch_size=4, dynamic_sampling={"enabled": True, "max_filtered_batches": 1})
    state = TrainingState()
    flat_group(state, "flat", 1.0)
    state.buffer += [sample("mixed-0", "mixed", reward=1.0), sample("mixed-1", "mixed", reward=0.0)]
    assert filtering.filter_flat(p, state, "flat") and not filtering.filter_flat(p, state, "mixed")
    assert [x.group_id for x in state.buffer] == ["mixed", "mixed"]
    assert (state.filtered, state.filtered_since_step, state.filtered_successes_since_step) == (2, 2, 2)
    flat_group(state, "flat2", 0.0)
    assert filtering.filter_flat(p, state, "flat2") and state.filtered_since_step == 4  # a batch's worth now
    flat_group(state, "flat3", 0.0)
    assert not filtering.filter_flat(p, state, "flat3")  # kept: the job must go on
    assert not filtering.filter_flat(plan(frozenlake_task(group_size=2), batch_size=4), state, "flat3")  # off


def test_groups_of_one_are_never_filtered() -> None:
    p = plan(frozenlake_task(group_size=1), batch_size=4, dynamic_sampling=True)
    state = TrainingState()
    flat_group(state, "g", 1.0, size=1)
    assert not filtering.filter_flat(p, state, "g") and state.filtered == 0


def test_a_completed_flat_group_never_becomes_ready() -> None:
    p, state = plan(frozenlake_task(group_size=2), batch_size=4, dynamic_sampling=True), running(("g", 2))
    ledger.accept(p, state, [completed("g-0", "g"), completed("g-1", "g")])
    assert state.ready_groups == [] and state.filtered == 2 and state.ledger_balanced


def result(version: int, **metrics: float) -> TrainStepResult:
    return TrainStepResult(step=version - 1, version=version, weights_key="w", metrics=metrics)


def test_a_step_advances_the_version_and_records_what_was_played() -> None:
    p = plan(frozenlake_task(group_size=2), batch_size=4)
    state = TrainingState(step=2, started=10, filtered=2, filtered_since_step=2, filtered_successes_since_step=2)
    batch = [sample("a", "g", 2, 1.0), sample("b", "g", 1, 0.0), sample("c", "h", 2, 1.0), sample("d", "h", 2, 0.0)]
    record = records.apply_step(state, p.trainer, batch, result(3, loss=0.5), now=100.0)
    assert state.step == 3 and state.trained == 4 and state.history == [record]
    assert (record.step, record.version, record.time, record.samples) == (2, 3, 100.0, 4)
    assert record.success_rate == 0.5 and record.success_sampled == pytest.approx(4 / 6)  # the filtered 2 succeeded
    assert (record.staleness_mean, record.staleness_max, record.train) == (0.25, 1, {"loss": 0.5})
    assert record.task_success == {"frozenlake": 0.5} and record.filtered == 2
    assert state.filtered_since_step == state.filtered_successes_since_step == 0


def test_entropy_control_sets_the_next_steps_weight() -> None:
    p = plan(frozenlake_task(group_size=2), batch_size=2)
    loss = p.trainer.loss.model_copy(update={"entropy_target": 0.3, "entropy_coef": 0.002, "entropy_coef_step": 0.001})
    trainer = p.trainer.model_copy(update={"loss": loss})
    state = TrainingState()
    records.apply_step(state, trainer, [sample("a", "g"), sample("b", "g")], result(1, entropy=0.1), now=0.0)
    assert state.entropy_coef == pytest.approx(0.003)  # below the target: up by a step
    records.apply_step(state, p.trainer, [sample("a", "g"), sample("b", "g")], result(2, entropy=0.1), now=0.0)
    assert state.entropy_coef == pytest.approx(0.003)  # no target: unchanged


def test_the_stop_rule_ends_the_job_once_held_and_never_at_the_cap() -> None:
    p = plan(frozenlake_task(group_size=2), batch_size=2, steps=3, stop_when={"success": 1.0, "steps": 2})
    state, batch = TrainingState(), [sample("a", "g"), sample("b", "g")]
    ended = [records.learned(p, state, records.apply_step(state, p.trainer, batch, result(v), now=0.0)) for v in (1, 2)]
    assert ended == [False, True] and state.ended_by == "stop_when" and state.stop_held == 2
    at_cap = TrainingState(step=2, stop_held=1)
    assert not records.learned(p, at_cap, records.apply_step(at_cap, p.trainer, batch, result(3), now=0.0))
    assert records.ended_by(p, at_cap) == "steps" and records.ended_by(p, TrainingState(step=1)) == "stop_signal"
    assert not records.learned(plan(), TrainingState(), records.step_record(state, 0, batch, result(1), 0.0))


Score = Callable[[int, int], float | None]
"""Member m of group g's reward; None: its env broke (failed)."""


def play_job(p: TrainingPlan, score: Score) -> tuple[TrainingState, list[str]]:
    """The workflow's loop without Temporal: launch, report (every result at once), drop stale, train when a batch
    (or, stalled, a partial one) is ready. Every step trains whole groups within the bound, and the ledger balances
    all along; the final state and the trajectories trained, in order."""
    state, trained = TrainingState(), []
    for _ in range(1000):
        if state.step >= p.training.steps:
            break
        for launch in admission.launches(p, state, "j"):
            results = []
            for tid, group in launch.members():
                reward = score(int(group.group_id[-6:]), int(tid.rsplit("-", 1)[1]))
                if reward is None:
                    failed = {"task": "frozenlake", "seed": 0, "status": "failed", "group_id": group.group_id}
                    results.append(TrajectoryResult(trajectory_id=tid, **failed))
                else:
                    results.append(completed(tid, group.group_id, reward=reward, version=state.step))
            ledger.accept(p, state, results)
            assert state.ledger_balanced
        staleness.drop_stale(state, p.training.async_bound)
        if ledger.batch_ready(p, state) or ledger.train_partial(p, state):
            batch = ledger.take_batch(p, state)
            assert all(state.step - x.policy_version_min <= p.training.async_bound for x in batch)
            assert all(sum(x.group_id == y.group_id for y in batch) == 2 for x in batch)  # whole groups
            trained += [x.trajectory_id for x in batch]
            records.apply_step(state, p.trainer, batch, result(state.step + 1), now=0.0)
        assert state.ledger_balanced
    assert state.step == p.training.steps, "the job stopped moving"
    assert len(trained) == len(set(trained)) == state.trained
    return state, trained


def test_a_whole_job_played_through_the_pure_modules_balances_its_ledger() -> None:
    """Every third group's env breaks; elsewhere member m of group g scores m × (g odd): even groups are flat."""
    p = plan(frozenlake_task(group_size=2), async_bound=1, batch_size=4, steps=6, dynamic_sampling=True)
    state, _ = play_job(p, lambda g, m: None if g % 3 == 2 else float(m * (g % 2)))
    assert state.failed > 0 and state.filtered > 0
    final = records.result("j", p, state)
    assert final.started == (
        final.trained
        + final.dropped
        + final.filtered
        + final.failed
        + final.cancelled_in_flight
        + final.buffered_unused
    )
    status = records.status("j", p, state, done=True)
    assert status.ledger_balanced and status.done and [r.step for r in status.history] == list(range(6))


def test_dynamic_sampling_keeps_groups_when_nothing_has_a_signal() -> None:
    """A policy that solves everything: after a batch's worth filtered since the last step, groups are kept again,
    so every step trains a full batch instead of the job waiting forever."""
    ds = {"enabled": True, "max_filtered_batches": 1}
    p = plan(frozenlake_task(group_size=2), async_bound=0, batch_size=4, steps=3, dynamic_sampling=ds)
    state, trained = play_job(p, lambda g, m: 1.0)
    assert len(trained) == 12 and state.filtered >= 3 * 4  # a batch's worth before each step
    assert [r.success_sampled for r in state.history] == [1.0, 1.0, 1.0]
