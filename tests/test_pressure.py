"""Admission by engine pressure as plain code (workflows/training/pressure.py): the AIMD cap on trajectories in
flight, under the async bound's cap, from what the engines report with each trajectory. No server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollart.contracts.activities import TrainStepResult
from rollart.contracts.generation import EnginePressure
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import InFlight, TrainingPlan, TrainingState
from rollart.spec.config import AdmissionConfig, TrainingConfig
from rollart.workflows.training import admission, ledger, pressure, records
from tests.support.tasks import frozenlake_task
from tests.support.training_plans import completed, plan, sample

CALM = EnginePressure(running=8, kv_usage=0.3)


def report(tid: str, p: EnginePressure = CALM, engine: str = "e1") -> TrajectoryResult:
    """A finished trajectory whose last turn's engine reported `p`."""
    return completed(tid, "g").model_copy(update={"engine_worker": engine, "pressure": p})


def flying(state: TrainingState, *tids: str) -> list[str]:
    """Track `tids` as in flight (observe only counts what is), and return them."""
    for t in tids:
        state.in_flight[t] = InFlight(group="g", workflow=t)
    return list(tids)


def observe(p: TrainingPlan, state: TrainingState, *reports: TrajectoryResult) -> None:
    flying(state, *(r.trajectory_id for r in reports))
    pressure.observe(p, state, reports)
    for r in reports:
        state.in_flight.pop(r.trajectory_id)


def preempting(n: int, start: int = 0, engine: str = "e1") -> list[TrajectoryResult]:
    """`n` reports of one engine that preempts a request between each two (its count only grows)."""
    return [report(f"{engine}-p{start + i}", EnginePressure(preempted=start + i), engine) for i in range(n)]


def calm(n: int, tag: str = "c") -> list[TrajectoryResult]:
    return [report(f"{tag}{i}") for i in range(n)]


def test_the_cap_starts_at_the_bounds_and_never_leaves_floor_and_ceiling() -> None:
    p = plan(frozenlake_task(group_size=4), async_bound=1, batch_size=8)  # the bound's cap: 16
    state = TrainingState()
    assert pressure.ceiling(p) == 16 and pressure.floor(p) == 4 and pressure.current_cap(p, state) == 16
    assert pressure.increase(p) == 4  # a group (a sixteenth of 16 is less)
    observe(p, state, *preempting(200))  # preempting all along: cut at the end of every round, down to a group
    assert pressure.current_cap(p, state) == 4 and state.admission.cuts >= 4
    observe(p, state, *calm(200))
    assert pressure.current_cap(p, state) == 16  # grown back, never above the bound's cap
    assert pressure.current_cap(plan(admission=False), state) is None


def test_a_round_is_judged_at_its_end_by_its_preemptions_per_finished_trajectory() -> None:
    p = plan(frozenlake_task(group_size=2), async_bound=1, batch_size=16)  # ceiling 32: a round is 32 finishes
    state = TrainingState()
    observe(p, state, *preempting(31))  # 30 preemptions so far (the first report has no count to compare with)
    assert pressure.current_cap(p, state) == 32 and state.admission.round_preempted == 30  # the round is not over
    observe(p, state, report("last", EnginePressure(preempted=30)))
    assert pressure.current_cap(p, state) == 22 and state.admission.cuts == 1  # 32 x 0.7
    counts = [30] * 18 + [31, 32, 33, 34, 35]  # 5 preemptions in the next round of 23: under 0.25 each
    observe(p, state, *(report(f"f{i}", EnginePressure(preempted=c)) for i, c in enumerate(counts)))
    assert pressure.current_cap(p, state) == 24 and state.admission.cuts == 1  # 22.4 + 2 (a group = 32 / 16)


def test_a_full_kv_cache_presses_only_with_requests_waiting() -> None:
    p = plan(frozenlake_task(group_size=4), async_bound=1, batch_size=8)  # rounds of 16
    state = TrainingState()
    observe(p, state, *(report(f"a{i}", EnginePressure(kv_usage=0.97)) for i in range(16)))  # full, nothing waits
    assert state.admission.cuts == 0 and pressure.current_cap(p, state) == 16
    observe(p, state, report("w", EnginePressure(kv_usage=0.95, waiting=3)), *calm(15))
    assert state.admission.cuts == 1 and pressure.current_cap(p, state) == 11  # 16 x 0.7, floored


def test_waiting_requests_press_only_when_a_limit_is_set() -> None:
    busy = EnginePressure(waiting=50, kv_usage=0.1)
    assert not pressure.full(plan(), busy)
    assert pressure.full(plan(admission={"max_waiting": 10}), busy)


def test_repeated_reports_and_reports_without_an_engine_are_ignored() -> None:
    p, state = plan(), TrainingState()
    pressure.observe(p, state, [report("not-in-flight", EnginePressure(kv_usage=1.0))])
    observe(p, state, completed("no-engine", "g"))
    assert state.admission.cap is None and state.admission.engines == {}


def test_admission_holds_in_flight_under_the_cap_and_the_bound_exactly() -> None:
    p = plan(frozenlake_task(group_size=2), async_bound=1, batch_size=8)  # bound: 16 in flight + buffered
    state = TrainingState()
    state.admission.cap = 6.0
    launched = admission.launches(p, state, "j")
    assert len(state.in_flight) == 6 and len(launched) == 6  # three groups of 2: the next would make 8 > 6
    state.admission.cap = None
    state.buffer = [sample(f"b{i}", "old") for i in range(9)]
    admission.launches(p, state, "j")
    assert len(state.in_flight) + len(state.buffer) == 15  # 6 + 9, +2 would exceed 16: the bound still holds


def test_the_status_and_step_record_report_the_cap_and_the_engines() -> None:
    p, state = plan(frozenlake_task(group_size=4), async_bound=1, batch_size=8), TrainingState()
    observe(p, state, report("a", EnginePressure(kv_usage=0.95, waiting=2, prefix_queries=100, prefix_hits=80)))
    observe(p, state, report("b", EnginePressure(preempted=3, prefix_queries=100, prefix_hits=20), engine="e2"))
    observe(p, state, *calm(14))  # the round of 16 ends: e1 was full with requests waiting
    status = records.status("j", p, state, done=False)
    assert status.admission_cap == 11 and status.in_flight_limit == 16 and status.admission_cuts == 1
    assert set(status.engines) == {"e1", "e2"}
    batch = [sample(f"s{i}", "g") for i in range(4)]
    state.buffer, state.ready_groups = batch, ["g"]
    rec = records.apply_step(
        state, p.trainer, ledger.take_batch(p, state), TrainStepResult(step=0, version=1, weights_key="k"), 0.0, 11
    )
    assert rec.admission_cap == 11 and rec.kv_usage == 0.3 and rec.preempted == 3 and rec.prefix_hit_rate == 0.2


def test_the_admission_config_reads_well_and_names_bad_values() -> None:
    assert TrainingConfig.model_validate({"admission": False}).admission.adaptive is False
    assert TrainingConfig().admission == AdmissionConfig(adaptive=True, kv_high=0.9, max_preempted=0.25, backoff=0.7)
    with pytest.raises(ValidationError, match=r"admission\.backoff"):
        TrainingConfig.model_validate({"admission": {"backoff": 1.5}})


def test_rollart_status_and_the_run_report_show_the_cap_and_the_engines() -> None:
    from rollart.cli.status import engine_lines
    from rollart.client.report_html import _engines_section

    p, state = plan(frozenlake_task(group_size=4), async_bound=1, batch_size=8), TrainingState()
    full = EnginePressure(running=3, waiting=1, kv_usage=0.95, prefix_queries=10, prefix_hits=5)
    observe(p, state, *(report(f"a{i}", full) for i in range(16)))  # a round with the engine full: one cut
    lines = engine_lines(records.status("j", p, state, done=False))
    assert lines[0].startswith("admission: at most 11 in flight by engine pressure (the async bound allows 16 ")
    assert lines[0].endswith("cut 1 time)")
    assert lines[2] == "  e1: 3 running, 1 waiting, KV 95%, 0 preempted, prefix-cache hits 50%"
    assert engine_lines(records.status("j", plan(admission=False), TrainingState(), done=False)) == []
    rows = [{"step": 0, "admission_cap": 16, "kv_usage": 0.5, "preempted": 0, "prefix_hit_rate": 0.25}]
    page = _engines_section([{"step": 0}, *rows])
    assert "Engines and admission" in page and page.count("<tr>") == 2 and ">25%<" in page
    assert _engines_section([{"step": 0, "admission_cap": None}]) == ""  # no engine reported: no section
