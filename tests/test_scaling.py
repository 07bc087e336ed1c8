"""The autoscaler's decision as a pure function (sequences of backlogs in, worker counts out), and its bookkeeping."""

from __future__ import annotations

import itertools
import random
import subprocess
import time
from pathlib import Path

import pytest

from rollart.infra.temporal.backlog import QueueStats
from rollart.spec.pools import ElasticPoolConfig, Pool
from rollart.workers import autoscaler as mod
from rollart.workers.scaling import ScaleState, decide, recommend
from rollart.workers.settings import WorkerSettings

CFG = ElasticPoolConfig(
    min_workers=0,
    max_workers=4,
    max_concurrent_activities=2,
    scale_up_cooldown_s=6,
    scale_down_cooldown_s=30,
    poll_interval_s=2,
)


def play(cfg: ElasticPoolConfig, observations: list[tuple[int, float]], dt: float = 2.0) -> list[int]:
    """The target after each (backlog, add_rate) observation, one every `dt` seconds."""
    state = ScaleState.initial(cfg, now=0.0)
    targets = []
    for i, (backlog, rate) in enumerate(observations, start=1):
        state, decision = decide(cfg, state, backlog, rate, now=i * dt)
        assert decision.target == state.target
        targets.append(state.target)
    return targets


def test_recommendation_adds_a_worker_per_backlog_share_within_bounds() -> None:
    assert recommend(CFG, current=0, backlog=1, add_rate=1.0) == 1
    assert recommend(CFG, current=1, backlog=4, add_rate=1.0) == 3
    assert recommend(CFG, current=3, backlog=100, add_rate=9.0) == 4  # never above max
    assert recommend(CFG, current=3, backlog=0, add_rate=2.0) == 3  # absorbing the arrivals: keep
    assert recommend(CFG, current=3, backlog=0, add_rate=0.0) == 0  # idle: min
    floor = CFG.model_copy(update={"min_workers": 2})
    assert recommend(floor, current=3, backlog=0, add_rate=0.0) == 2


def test_backlog_rising_starts_workers_with_a_cooldown_between_scale_ups() -> None:
    targets = play(CFG, [(3, 1.0)] + [(6, 3.0)] * 6)
    assert targets[0] == 2  # 0 + ceil(3/2): straight from zero, no waiting
    assert targets[1] == 2 and targets[2] == 2  # 6 s cooldown: the backlog count lags, don't double count
    assert targets[3] == 4 and max(targets) == 4


def test_drained_queue_scales_down_to_min_after_the_cooldown_only() -> None:
    targets = play(CFG, [(8, 4.0)] + [(0, 0.0)] * 20)
    assert targets[0] == 4
    down = targets.index(0)
    assert all(t == 4 for t in targets[:down])
    assert (down + 1) * 2.0 - 2.0 >= CFG.scale_down_cooldown_s  # 30 s after the scale-up
    assert targets[-1] == 0


def test_work_still_arriving_without_backlog_keeps_the_workers() -> None:
    targets = play(CFG, [(4, 2.0)] + [(0, 2.0)] * 30)
    assert targets[0] == 2 and set(targets) == {2}


def test_a_flapping_backlog_does_not_flap_the_workers() -> None:
    targets = play(CFG, [(6, 3.0), (0, 0.0)] * 30)
    assert targets[0] == 3
    assert all(a <= b for a, b in itertools.pairwise(targets))  # only up (the backlog persists); dips never last 30 s
    assert targets[-1] == CFG.max_workers


def test_scale_down_goes_to_the_highest_recent_need() -> None:
    cfg = CFG.model_copy(update={"min_workers": 1})
    # 4 workers; then a little work keeps arriving (keep), then idle: down to min only after 30 s of idling
    targets = play(cfg, [(20, 5.0)] + [(1, 1.0)] + [(0, 0.0)] * 25)
    assert targets[0] == 4 and targets[-1] == 1
    first_down = next(i for i, t in enumerate(targets) if t < 4)
    assert targets[first_down] == 1


@pytest.mark.parametrize("seed", range(20))
def test_random_backlogs_respect_bounds_and_cooldowns(seed: int) -> None:
    rng = random.Random(seed)
    cfg = ElasticPoolConfig(
        min_workers=rng.randint(0, 2),
        max_workers=rng.randint(2, 6),
        max_concurrent_activities=4,
        scale_up_cooldown_s=rng.choice([0, 4, 6]),
        scale_down_cooldown_s=rng.choice([10, 30]),
    )
    obs = [(rng.choice([0, 0, 0, rng.randint(1, 40)]), rng.choice([0.0, 0.0, 3.0])) for _ in range(300)]
    state = ScaleState.initial(cfg, now=0.0)
    last_change, last_up = 0.0, -1e9
    for i, (backlog, rate) in enumerate(obs, start=1):
        now = i * 2.0
        before = state.target
        state, _d = decide(cfg, state, backlog, rate, now)
        assert cfg.min_workers <= state.target <= cfg.max_workers
        if state.target > before:
            assert now - last_up >= cfg.scale_up_cooldown_s
            last_up = last_change = now
        elif state.target < before:
            assert now - last_change >= cfg.scale_down_cooldown_s  # never down right after a change
            last_change = now


@pytest.mark.integration
def test_autoscaler_keeps_the_processes_at_the_target_and_replaces_the_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`observe` + `reconcile` with stand-in processes (`sleep`), no server: start, replace, drain."""

    def fake_spawn(settings: WorkerSettings, name: str, home: Path) -> mod.WorkerProcess:
        ready = tmp_path / f"{name}.ready"
        ready.write_text(name)
        proc = subprocess.Popen(["sleep", "60"])
        return mod.WorkerProcess(
            name=name, proc=proc, log_file=tmp_path / "log", ready_file=ready, started_at=time.monotonic()
        )

    monkeypatch.setattr(mod, "spawn_worker", fake_spawn)
    cfg = ElasticPoolConfig(
        min_workers=1, max_workers=3, max_concurrent_activities=2, scale_up_cooldown_s=0, scale_down_cooldown_s=0
    )
    scaler = mod.Autoscaler(cfg=cfg, procs=mod.WorkerProcesses(WorkerSettings(pool=Pool.SERVERLESS), tmp_path))
    scaler._state = ScaleState.initial(cfg, now=0.0)
    try:
        scaler.reconcile()
        assert len(scaler.procs.serving) == 1  # min
        scaler.observe(QueueStats(backlog=9, backlog_age_s=1.0, add_rate=3.0, dispatch_rate=0.0), now=1.0)
        scaler.reconcile()
        assert len(scaler.procs.serving) == 3  # 1 + ceil(9/2) = 6, capped at max
        victim = scaler.procs.serving[0]
        victim.proc.kill()
        victim.proc.wait()
        scaler.reconcile()
        assert len(scaler.procs.serving) == 3 and victim not in scaler.procs.serving  # replaced at once
        assert any(e.kind == "exit" and e.pid == victim.pid and "died" in e.detail for e in scaler.events)
        scaler.observe(QueueStats(backlog=0, backlog_age_s=0.0, add_rate=0.0, dispatch_rate=0.0), now=2.0)
        scaler.reconcile()
        assert len(scaler.procs.serving) == 1 and len(scaler.procs.draining) == 2  # SIGTERM sent: draining
        for w in scaler.procs.draining:
            w.proc.wait(5)
        scaler.reconcile()
        assert (
            scaler.procs.draining == [] and sum(e.kind == "exit" and "drained" in e.detail for e in scaler.events) == 2
        )
    finally:
        scaler.procs.stop_all(timeout_s=5)
