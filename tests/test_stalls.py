"""Stall bookkeeping (workflows/stalls.py): queue descriptions over time → stalls, thresholds, clearing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollart.contracts.activities import QueueState
from rollart.contracts.training import StallWatch, TrainingPlan, TrainingStatus
from rollart.spec.config import JobSpec, StallConfig, TrainingConfig
from rollart.workflows import stalls
from tests.support.tasks import frozenlake_task

CFG = StallConfig(check_every_s=15, no_worker_after_s=60, no_progress_factor=10, no_progress_min_s=30)


def q(backlog: int, pollers: int) -> QueueState:
    return QueueState(queue="x", backlog=backlog, pollers=pollers)


def run_checks(
    seen: list[tuple[float, dict[str, QueueState]]],
    watch: StallWatch | None = None,
    in_flight: int = 0,
    cfg: StallConfig = CFG,
) -> StallWatch:
    """The watch after a series of checks at the given workflow times."""
    watch = watch or StallWatch()
    for now, queues in seen:
        watch = stalls.check(watch, queues, now, in_flight, cfg)
    return watch


def test_a_pool_with_work_and_no_worker_is_reported_after_the_threshold() -> None:
    idle = {"h800": q(10, 0), "cpu": q(0, 1)}
    watch = run_checks([(100.0, idle), (130.0, idle)])
    assert watch.stalls == [] and [x.pool for x in watch.open] == ["h800"]  # seen, not yet reported
    watch = run_checks([(160.0, idle)], watch)
    [stall] = watch.stalls
    assert (stall.reason, stall.pool, stall.since, stall.backlog) == ("no_worker", "h800", 100.0, 10)
    assert stall.describe() == "no worker on h800 for 60 s, 10 activities waiting"
    assert stalls.summary(watch.stalls, now=190.0) == "stalled: no worker on h800 for 90 s, 10 activities waiting"


def test_the_stall_clears_when_a_worker_polls_or_the_backlog_drains() -> None:
    watch = run_checks([(0.0, {"h800": q(10, 0)}), (60.0, {"h800": q(10, 0)})])
    assert watch.stalls
    assert run_checks([(75.0, {"h800": q(10, 1)})], watch).open == []
    assert run_checks([(75.0, {"h800": q(0, 0)})], watch).open == []
    again = run_checks([(75.0, {"h800": q(0, 0)}), (90.0, {"h800": q(3, 0)})], watch)
    assert again.open[0].since == 90.0 and not again.open[0].reported  # a new stall starts its own clock


def test_busy_or_idle_pools_are_not_stalled() -> None:
    watch = run_checks([(t, {"h800": q(50, 2), "cpu": q(0, 0)}) for t in range(0, 600, 15)])
    assert watch.open == []


def seen(backlog: int, workers: int | None, last_seen_s_ago: float | None, pollers: int = 0) -> QueueState:
    """A description with worker heartbeats read (`workers` None: a server that keeps none)."""
    return QueueState(queue="x", backlog=backlog, pollers=pollers, workers=workers, last_seen_s_ago=last_seen_s_ago)


def test_a_dead_worker_is_reported_from_its_last_sign_of_life_not_from_the_first_check() -> None:
    # killed 65 s ago: its stale heartbeat and poll are still listed, so the second check that sees it reports it
    first = run_checks([(100.0, {"h800": seen(10, workers=0, last_seen_s_ago=65.0, pollers=1)})])
    assert first.stalls == [] and first.open[0].since == 35.0  # over the threshold, but seen once: not yet
    [stall] = run_checks([(115.0, {"h800": seen(10, workers=0, last_seen_s_ago=80.0, pollers=1)})], first).stalls
    assert (stall.pool, stall.since, stall.reported) == ("h800", 35.0, True)
    early = run_checks([(100.0, {"h800": seen(10, workers=0, last_seen_s_ago=20.0)})])
    assert early.stalls == [] and early.open[0].since == 80.0  # seen, under the 60 s threshold
    # Temporal forgets the dead worker: the clock keeps the since it had
    later = run_checks([(130.0, {"h800": seen(10, workers=0, last_seen_s_ago=None)})], early)
    assert later.open[0].since == 80.0 and not later.stalls
    assert run_checks([(140.0, {"h800": seen(10, workers=0, last_seen_s_ago=None)})], later).stalls


def test_a_busy_worker_that_heartbeats_is_no_stall_even_without_polling() -> None:
    busy = {"h800": seen(40, workers=1, last_seen_s_ago=2.0, pollers=0)}
    assert run_checks([(t, busy) for t in range(0, 600, 15)]).open == []


def test_without_heartbeats_a_recent_poll_is_the_sign_of_life() -> None:
    polling = {"h800": seen(5, workers=None, last_seen_s_ago=1.0, pollers=1)}
    assert run_checks([(t, polling) for t in range(0, 600, 15)]).stalls == []
    gone = {"h800": seen(5, workers=None, last_seen_s_ago=61.0, pollers=1)}  # listed, but silent for 61 s
    assert run_checks([(600.0, gone)]).stalls == []  # one sight: maybe a task a waiting long poll is about to take
    later = {"h800": seen(5, workers=None, last_seen_s_ago=76.0, pollers=1)}
    assert [x.pool for x in run_checks([(600.0, gone), (615.0, later)]).stalls] == ["h800"]
    taken = {"h800": seen(0, workers=None, last_seen_s_ago=76.0, pollers=1)}  # the task was taken: no stall
    assert run_checks([(600.0, gone), (615.0, taken)]).open == []


def test_no_progress_uses_the_median_interval_with_a_floor() -> None:
    watch = StallWatch()
    for t in (0.0, 2.0, 4.0, 6.0, 6.0, 8.0):  # reports every 2 s (two at once count once)
        watch = stalls.progressed(watch, t, finished=True)
    assert stalls.median_interval(watch.finishes) == 2.0
    assert run_checks([(30.0, {})], watch, in_flight=4).open == []  # 22 s silent: under the 30 s floor
    [stall] = run_checks([(40.0, {})], watch, in_flight=4).stalls
    assert (stall.reason, stall.since, stall.in_flight) == ("no_progress", 8.0, 4)
    assert stall.describe() == "no trajectory finished for 32 s, 4 in flight"
    assert run_checks([(40.0, {})], watch, in_flight=0).open == []  # nothing in flight: nothing to wait for
    busy = stalls.progressed(watch, 39.0, finished=False)  # a step trained: progress too
    assert run_checks([(40.0, {})], busy, in_flight=4).open == []


def test_no_progress_needs_a_few_reports_to_judge_by() -> None:
    watch = stalls.progressed(stalls.progressed(StallWatch(), 0.0, finished=True), 1.0, finished=True)
    assert stalls.median_interval(watch.finishes) is None
    assert run_checks([(1000.0, {})], watch, in_flight=8).open == []


def test_fail_after_names_the_overdue_stall() -> None:
    seen = [(t, {"h20": q(4, 0)}) for t in (0.0, 15.0, 60.0, 90.0)]
    assert stalls.overdue(run_checks(seen), CFG) is None  # no fail_after_s: wait forever
    cfg = CFG.model_copy(update={"fail_after_s": 90.0})
    assert stalls.overdue(run_checks(seen[:3], cfg=cfg), cfg) is None
    over = stalls.overdue(run_checks(seen, cfg=cfg), cfg)
    assert over is not None and over.pool == "h20"


def test_watched_pools_are_the_queues_the_tasks_use() -> None:
    tasks = [frozenlake_task(), frozenlake_task(name="b", generate_pool="h20", reward_placement="colocated")]
    assert stalls.watched_pools(tasks) == ["cpu", "h800", "serverless", "h20", "trainer"]


def test_the_spec_validates_the_thresholds_and_the_plan_carries_them() -> None:
    spec = JobSpec(
        name="s",
        tasks=[frozenlake_task()],
        training=TrainingConfig(batch_size=8, stall={"check_every_s": 2, "fail_after_s": 30}),
    )
    assert TrainingPlan.of(spec).training.stall == StallConfig(check_every_s=2, fail_after_s=30)
    for bad in ({"check_every_s": 0}, {"no_progress_factor": 1}, {"fail_after_s": -1}, {"no_worker_after": 5}):
        with pytest.raises(ValidationError):
            TrainingConfig(stall=bad)


def test_old_status_and_state_payloads_still_decode() -> None:
    status = TrainingStatus(
        job_id="j",
        step=0,
        steps=1,
        version=0,
        async_bound=1,
        rollout_mode="trajectory",
        started=0,
        trained=0,
        dropped=0,
        failed=0,
        in_flight=0,
        buffered=0,
        paused=False,
        stopping=False,
        done=False,
        ledger_balanced=True,
    )
    assert status.stalls == []
    assert TrainingConfig.model_validate({"steps": 3}).stall.enabled


def test_rollart_status_prints_the_stall(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from rollart.cli import status as cli_status
    from rollart.cli.main import build_parser
    from rollart.client import train as client_train
    from rollart.contracts.training import Stall
    from rollart.infra.temporal import connection as temporal

    now = time.time()
    stall = Stall(reason="no_worker", pool="h800", since=now - 60, seen_at=now - 1, backlog=10, reported=True)
    status = TrainingStatus(
        job_id="j",
        step=1,
        steps=3,
        version=1,
        async_bound=1,
        rollout_mode="trajectory",
        started=8,
        trained=4,
        dropped=0,
        failed=0,
        in_flight=4,
        buffered=0,
        paused=False,
        stopping=False,
        done=False,
        ledger_balanced=True,
        stalls=[stall],
    )

    class _Client:
        def get_workflow_handle(self, job_id: str) -> str:
            return job_id

    async def connect(*_: object) -> _Client:
        return _Client()

    async def status_of(_: object) -> TrainingStatus:
        return status

    monkeypatch.setattr(temporal, "connect", connect)
    monkeypatch.setattr(client_train, "status_of", status_of)
    args = build_parser().parse_args(["status", "j", "--temporal-address", "127.0.0.1:1"])  # as a user types it
    assert cli_status.run(args) == 0
    assert "STALLED: no worker on h800 for 60 s, 10 activities waiting (since " in capsys.readouterr().out


async def test_follow_hands_each_status_to_the_progress_bar(tmp_path) -> None:
    import asyncio

    from rollart.client.train import MetricsWriter, follow
    from rollart.contracts.training import Stall, TrainingResult

    stall = Stall(reason="no_worker", pool="h20", since=0.0, seen_at=5.0, backlog=3, reported=True)

    class _Handle:
        queries = 0

        async def query(self, name: str, result_type: type) -> TrainingStatus:
            self.queries += 1
            return TrainingStatus(
                job_id="j",
                step=0,
                steps=1,
                version=0,
                async_bound=1,
                rollout_mode="trajectory",
                started=0,
                trained=0,
                dropped=0,
                failed=0,
                in_flight=0,
                buffered=0,
                paused=False,
                stopping=False,
                done=False,
                ledger_balanced=True,
                stalls=[stall] if self.queries < 3 else [],
            )

        async def result(self) -> TrainingResult:
            await asyncio.sleep(0.2)
            return TrainingResult(
                job_id="j",
                steps=1,
                version=1,
                started=0,
                trained=0,
                dropped=0,
                failed=0,
                cancelled_in_flight=0,
                buffered_unused=0,
            )

    seen: list[str] = []
    await follow(
        _Handle(),
        MetricsWriter(tmp_path),
        lambda row: None,
        poll_s=0.01,  # type: ignore[arg-type]
        on_status=lambda s: seen.append(stalls.summary(s.stalls)),
    )
    assert seen[:2] == ["stalled: no worker on h20 for 5 s, 3 activities waiting"] * 2 and seen[-1] == ""
