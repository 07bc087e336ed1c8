"""The cluster simulator (rollart.simulator; its setups in bench/simulate): virtual time, rooflines, the engine's
batching and priority, and rollart's scheduling code driven on them (docs/simulator.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
import time
from typing import Any

import pytest

from bench.simulate.setups import calibration, paper
from bench.workload import frozenlake_task
from rollart.contracts.rollouts import TrajectoryInput
from rollart.contracts.training import InFlight, TrainingState
from rollart.simulator.calls import SimCalls
from rollart.simulator.clock import SimulationDeadlock, run_virtual
from rollart.simulator.cluster import Cluster, PoolSpec
from rollart.simulator.engine import SimEngine
from rollart.simulator.models import Lognormal, Overheads, TaskProfile
from rollart.simulator.roofline import H800, MODELS, EngineRoofline
from rollart.simulator.run import simulate
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.lockstep import play
from rollart.workflows.training import ledger

pytestmark = pytest.mark.timeout(30)


def test_the_virtual_clock_advances_without_wall_time() -> None:
    async def main() -> tuple[float, list[float]]:
        loop = asyncio.get_running_loop()

        async def nap(d: float) -> float:
            await asyncio.sleep(d)
            return loop.time()

        ends = await asyncio.gather(nap(3600.0), nap(10.0), nap(7200.0))
        return loop.time(), ends

    t0 = time.perf_counter()
    now, ends = run_virtual(main())
    assert (now, ends) == (7200.0, [3600.0, 10.0, 7200.0])
    assert time.perf_counter() - t0 < 0.5


def test_a_wait_for_nothing_is_a_deadlock_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimulationDeadlock):
        run_virtual(main())


def test_the_roofline_of_a_7b_model_on_one_h800() -> None:
    roof = EngineRoofline(H800, MODELS["7b"], tp=1, mfu=1.0, mbu=1.0, overhead_s=0.0)
    weights = 7.6e9 * 2
    assert roof.iteration_s(1, 0) == pytest.approx(weights / 3.35e12)  # decode: one read of the weights, 4.5 ms
    assert roof.prefill_s(1000) == pytest.approx(2 * 7.6e9 * 1000 / 989e12)  # prefill: compute-bound, 15.4 ms
    assert roof.prefill_s(10) == pytest.approx(weights / 3.35e12, rel=1e-3)  # a short prompt: bandwidth-bound
    assert roof.iteration_s(512, 0) > roof.iteration_s(1, 0)  # a big enough batch turns compute-bound
    assert 400_000 < roof.kv_capacity_tokens < 1_200_000  # (72 GB - 15.2 GB) / 56 KiB a token


def _engine(max_num_seqs: int = 256) -> SimEngine:
    roof = EngineRoofline(H800, MODELS["7b"], overhead_s=0.0)
    return SimEngine("h800-0", "h800", roof, version=lambda: 0, max_num_seqs=max_num_seqs)


def test_continuous_batching_shares_each_decode_step() -> None:
    async def finish(requests: int) -> float:
        engine = _engine()
        done = await asyncio.gather(*(engine.submit(100, 200) for _ in range(requests)))
        return max(f.finished_at for f in done)

    one, eight = run_virtual(finish(1)), run_virtual(finish(8))
    assert eight < 1.2 * one  # 8 requests share each of the 200 decode steps (memory-bound): not 8x as long
    assert one == pytest.approx(200 * _engine().roofline.iteration_s(1, 100 + 100), rel=0.05)


def test_a_request_arriving_mid_decode_joins_at_the_next_iteration() -> None:
    async def main() -> tuple[float, float]:
        engine = _engine()
        first = engine.submit(100, 1000)
        await asyncio.sleep(0.5)
        second = await engine.submit(100, 10)
        return (second.admitted_at, (await first).finished_at)

    admitted, first_done = run_virtual(main())
    assert 0.5 <= admitted < 0.52  # not after the first request's 1,000 tokens
    assert first_done > admitted


def test_the_engine_serves_lower_priority_values_first() -> None:
    async def main() -> list[str]:
        engine = _engine(max_num_seqs=1)
        order: list[str] = []

        async def one(name: str, priority: int) -> None:
            await engine.submit(100, 50, priority=priority)
            order.append(name)

        running = asyncio.ensure_future(one("running", 0))
        await asyncio.sleep(0)
        await asyncio.gather(running, one("fifo first", 0), one("later, ranked", -5), one("fifo second", 0))
        return order

    assert run_virtual(main()) == ["running", "later, ranked", "fifo first", "fifo second"]


def test_async_beats_sync_when_env_latency_has_a_long_tail() -> None:
    _, sync = simulate(calibration("batch", 0, steps=6))
    _, asyn = simulate(calibration("trajectory", 1, steps=6))
    assert sync["steps"] == asyn["steps"] == 6
    assert asyn["sim_s"] < 0.8 * sync["sim_s"]
    assert asyn["busy_h800"] > sync["busy_h800"]


def test_a_simulated_run_balances_its_ledger_with_failures_and_drops() -> None:
    out, row = simulate(paper("trajectory", 1, horizon_s=600.0, scale=0.01, unit="group"))
    s = out.state
    assert row["failed"] > 0 and row["trained"] > 0 and row["steps"] > 0
    assert s.ledger_balanced
    assert s.started == s.trained + s.dropped + s.filtered + s.failed + len(s.in_flight) + len(s.buffer)
    assert out.failed == s.failed  # every failed report is counted once, as failed


def test_the_index_decides_as_the_ledger_does() -> None:
    setup = calibration("trajectory", 2, steps=8)
    rows = []
    for exact in (True, False):
        _, row = simulate(dataclasses.replace(setup, exact=exact))
        row.pop("wall_s"), row.pop("cpu_s")
        rows.append(row)
    assert rows[0] == rows[1]


def test_a_failed_env_masks_its_trajectory_it_is_not_scored_zero() -> None:
    profile = TaskProfile("frozenlake", step=Lognormal(0.01, 0.1), step_failure_p=1.0, done_p=0.0)

    async def main() -> list:
        cluster = Cluster([PoolSpec("h800", "h800", 1)], MODELS["7b"], version=lambda: 0)
        calls = SimCalls(cluster, {"frozenlake": profile}, Overheads(), random.Random(0))
        inp = TrajectoryInput(task=frozenlake_task(), seed=1, job_id="sim", group_id="sim-g0")
        return await play([Episode(calls, inp, "sim-g0-m0")])

    [result] = run_virtual(main())
    assert result.status == "failed" and result.reward is None and "EnvBroken" in (result.error or "")
    state = TrainingState(started=1, in_flight={"sim-g0-m0": InFlight(group="sim-g0", workflow="w")})
    state.unfinished["sim-g0"] = 1
    plan = calibration("trajectory", 1).plan
    ledger.accept(plan, state, [result])
    assert state.failed == 1 and state.buffer == [] and state.ledger_balanced


def test_the_paper_setup_sizes_its_pools_from_its_knobs() -> None:
    full = paper("trajectory", 1, scale=1.0)
    assert sum(p.gpus for p in full.pools) + full.trainer.gpus == 3008
    assert full.plan.training.in_flight_limit == 10_240
    small = paper("trajectory", 1, scale=0.1, gen_share=0.25, max_num_seqs=8)
    assert [(p.gpus, p.max_num_seqs) for p in small.pools] == [(24, 8), (24, 8)]


def test_the_placement_planner_picks_the_hand_written_placement_the_simulator_finds_best() -> None:
    """spec/placement.py on the paper-like setup's own profiles and rooflines: multi-turn tasks on h800 and the
    long single-turn answers on h20, as declared (the swap simulates 5 % slower, docs/simulator.md)."""
    from bench.simulate.placement import HAND_WRITTEN, planned

    chosen, hand = planned(0.1)
    assert chosen.assignment == HAND_WRITTEN["declared"]
    assert hand["swapped"].makespan_s > 1.5 * hand["declared"].makespan_s


def test_an_engine_counts_its_prefill_and_decode_work() -> None:
    """The counts a vLLM worker reports (EnginePressure): every uncached prompt token prefilled, every generated
    token decoded, and the seconds of each kind of work; their ratios are the engine's rates."""

    async def main() -> SimEngine:
        engine = _engine()
        first = engine.submit(1000, 200)
        await asyncio.sleep(0.3)  # the second joins mid-decode: two segments, two prefills
        await asyncio.gather(first, engine.submit(500, 50, new_tokens=100))
        return engine

    engine = run_virtual(main())
    roof = engine.roofline
    assert engine.prefill_tokens == 1100
    assert engine.prefill_s == pytest.approx(roof.compute_s(1100))
    assert engine.decode_tokens == engine.tokens_out == 250
    assert 0 < engine.decode_s <= engine.busy_s - engine.prefill_s + 1e-9
    assert engine.prefill_tokens / engine.prefill_s > 10 * engine.decode_tokens / engine.decode_s  # compute vs HBM


def test_auto_placement_moves_tasks_off_a_bad_start_on_measured_rates() -> None:
    """Every task `generate_pool: auto`, started all on h20 (h800 idle): the shell re-plans after each step as the
    workflow does, the first plan moves work onto h800 (not measured yet: its roofline prior), and from then on
    both pools' engines report their own prefill and decode counts, by which it plans."""
    everything_on_h20 = {"frozenlake": "h20", "sokoban": "h20", "arithmetic": "h20"}
    setup = paper("trajectory", 1, horizon_s=400.0, scale=0.01, auto_every=1, start_placement=everything_on_h20)
    out, row = simulate(setup)
    p = out.state.placement
    assert p is not None and row["placement_start"] == everything_on_h20
    assert p.plans >= 5 and p.moves >= 1
    first_move = out.placements[1]
    assert first_move[1] == 1 and "h800" in first_move[2].values()  # after step 1, off the bad start
    assert {m.pool for m in p.engines.values()} == {"h800", "h20"}  # engines of both pools reported
    assert all(m.counts.prefill_s > 0 and m.counts.decode_s > 0 for m in p.engines.values())
    for pool, engines in (("h800", 5), ("h20", 4)):
        seen, prefill, decode = p.rates[pool]
        assert seen == engines and prefill > 0 and decode > 0  # measured (decode: at the engines' full batch)
    assert p.rates["h800"][1] > 5 * p.rates["h20"][1]  # the H800's compute: 6.7x the H20's prefill
    assert row["busy_h800"] > 0 and out.state.ledger_balanced


def _first_turn_priorities(priority: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The priority of each trajectory's first generation request, by env, in a short traj b1 run."""
    seen: dict[str, list[int]] = {}
    submit = SimCalls._submit

    def recording(self: SimCalls, prompt: str, queue: str, n: int, prio: int) -> tuple[Any, ...]:
        env, context, new = prompt.split(":")
        if context == new:  # nothing cached: its first turn
            seen.setdefault(env, []).append(prio)
        return submit(self, prompt, queue, n, prio)

    monkeypatch.setattr(SimCalls, "_submit", recording)
    simulate(paper("trajectory", 1, horizon_s=400.0, scale=0.01, priority=priority))
    return seen


def test_predicted_priority_ranks_the_longer_task_first_from_its_first_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """`engine.priority: predicted`: lengths.observe keeps each task's mean turns, admission passes it to the
    children, and their first requests rank by it (lower first): the Sokoban-like task (10 turns at most,
    done_p 0.1) ahead of the FrozenLake-like one (8, 0.15), both ahead of the single-turn answers (their task's
    length, 1, once known; 0 before); under `turns` every first request ranks 0."""
    turns = _first_turn_priorities("turns", monkeypatch)
    assert {p for ps in turns.values() for p in ps} == {0}
    predicted = _first_turn_priorities("predicted", monkeypatch)
    mean = {env: statistics.fmean(ps) for env, ps in predicted.items()}
    assert mean["gem"] < mean["frozenlake"] < min(predicted["arithmetic"]) and set(predicted["arithmetic"]) == {0, -1}
    assert min(predicted["gem"]) <= -5
