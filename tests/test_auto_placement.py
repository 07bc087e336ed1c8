"""`generate_pool: auto`: the spec's rules, and the training workflow's placement as plain code (no server).

The placement starts as a spread, takes each finished trajectory's tokens and its engine's rate counts from the
results, and re-plans every `every_steps` steps from them; the admission launches auto tasks on their planned
pool.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollart.contracts.generation import EnginePressure
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import InFlight, StepRecord, TaskTokens, TrainingPlan, TrainingState
from rollart.spec.config import JobSpec, TrainingConfig
from rollart.workflows import stalls
from rollart.workflows.training import admission, placement
from tests.support.tasks import frozenlake_task
from tests.support.training_plans import arithmetic_task


def auto_job(**placement_cfg: object) -> JobSpec:
    """FrozenLake (long prompts, short replies) and arithmetic (short prompts, long replies), both `auto`."""
    tasks = [frozenlake_task(generate_pool="auto", group_size=4), arithmetic_task(generate_pool="auto", group_size=4)]
    training = TrainingConfig(batch_size=8, async_bound=1, placement={"every_steps": 2, **placement_cfg})
    return JobSpec(tasks=tasks, training=training)


def step(n: int) -> StepRecord:
    """Step n's record (the plan made after it goes in it)."""
    return StepRecord(step=n, version=n + 1, time=0.0, samples=8, reward_mean=0.0, success_rate=0.0)


def finished(state: TrainingState, tokens: dict[str, tuple[int, int, int]]) -> None:
    """What finished since the last plan: task → (trajectories, uncached prompt tokens, completion tokens) each."""
    assert state.placement is not None
    state.placement.finished = {
        t: TaskTokens(trajectories=k, prompt=k * u, uncached_prompt=k * u, completion=k * c)
        for t, (k, u, c) in tokens.items()
    }


def report(state: TrainingState, *results: TrajectoryResult) -> None:
    """The results of trajectories in flight, as the workflow's signal hands them to the placement."""
    for r in results:
        state.in_flight[r.trajectory_id] = InFlight(group="g", workflow=r.trajectory_id)
    placement.observe(state, list(results))
    for r in results:
        del state.in_flight[r.trajectory_id]


def engine_report(
    worker: str, pool: str, prefill: tuple[int, float], decode: tuple[int, float], steps: int = 0, max_batch: int = 0
) -> TrajectoryResult:
    """A trajectory served on `pool` by `worker`, whose engine counted (tokens, seconds) of prefill and of decode
    (in `steps` steps, of at most `max_batch` sequences)."""
    pressure = EnginePressure(
        prefill_tokens=prefill[0],
        prefill_s=prefill[1],
        decode_tokens=decode[0],
        decode_s=decode[1],
        decode_steps=steps,
        max_batch=max_batch,
    )
    return TrajectoryResult(
        trajectory_id=f"t-{worker}-{prefill[0]}",
        task="frozenlake",
        seed=0,
        status="completed",
        prompt_tokens=300,
        uncached_prompt_tokens=120,
        completion_tokens=8,
        engine_worker=worker,
        engine_pool=pool,
        pressure=pressure,
    )


def test_auto_is_a_placement_not_a_pool_and_the_rules_say_where() -> None:
    job = auto_job()
    assert job.placement_pools() == ["h800", "h20"]
    assert sorted(job.needs().generate_pools) == ["h20", "h800"]  # workers for both pools
    assert job.unplaced(job.tasks[0]).generate_pool == "h800"  # a rollout outside training: the first pool
    with pytest.raises(ValidationError, match=r"training.placement.pools.0: pool 'cpu' has role env"):
        auto_job(pools=["cpu"])
    with pytest.raises(ValidationError, match="colocated"):
        JobSpec(tasks=[frozenlake_task(generate_pool="auto", reward_placement="colocated")])
    with pytest.raises(ValidationError, match="rates names h100"):
        auto_job(rates={"h100": (1.0, 1.0)})
    with pytest.raises(ValidationError, match="`auto` is not a pool name"):
        JobSpec(tasks=[frozenlake_task()], pools={"auto": {"role": "generation"}})


def test_the_plan_carries_the_pools_and_the_priors_rooflines_or_given() -> None:
    assert TrainingPlan.of(JobSpec(tasks=[frozenlake_task()])).placement_pools == []  # no auto task: nothing
    given = TrainingPlan.of(auto_job(rates={"h20": (100.0, 50.0)}))
    assert given.placement_pools == ["h800", "h20"] and given.placement_rates == {"h20": (100.0, 50.0)}
    roofline = TrainingPlan.of(auto_job(model_params=7e9)).placement_rates  # the default pools' GPUs: H800, H20
    assert roofline["h800"][0] > 30_000  # 989 TFLOPS x 0.5 / 14 GFLOPs per token
    assert roofline["h800"][0] > 6 * roofline["h20"][0]  # the H20 has 15 % of its FLOPs


def test_auto_tasks_start_spread_and_launch_on_their_pool() -> None:
    p, state = TrainingPlan.of(auto_job()), TrainingState()
    placement.start(p, state)
    assert state.placement is not None
    assert state.placement.assignment == {"frozenlake": "h800", "math": "h20"}
    assert state.placement.describe().startswith("placement (initial spread): frozenlake → h800, math → h20")
    pools = {
        launch.groups[0].task.name: launch.groups[0].task.generate_pool for launch in admission.launches(p, state, "j")
    }
    assert pools == {"frozenlake": "h800", "math": "h20"}
    assert stalls.watched_pools(p.tasks, p.placement_pools) == ["cpu", "h800", "h20", "serverless", "trainer"]


def test_engine_counts_become_pool_rates_and_unmeasured_pools_take_the_mean() -> None:
    p, state = TrainingPlan.of(auto_job()), TrainingState()
    placement.start(p, state)
    report(state, engine_report("w1", "h800", (1000, 1.0), (100, 1.0)))
    report(state, engine_report("w2", "h800", (3000, 1.0), (300, 1.0)))
    report(state, engine_report("w1", "h800", (2000, 1.0), (200, 1.0)))  # w1's newer counts replace its older
    placement.observe(state, [engine_report("w3", "h800", (9000, 1.0), (900, 1.0))])  # not in flight: a repeat
    rates = {r.pool: r for r in placement.pool_rates(p, state, p.placement_pools)}
    h800, h20 = rates["h800"], rates["h20"]
    assert (h800.engines, h800.prefill_tokens_per_s, h800.decode_tokens_per_s) == (2, 2500, 250)
    assert (h20.engines, h20.prefill_tokens_per_s) == (1, 2500)  # not measured: the mean of those measured
    assert state.placement.finished["frozenlake"] == TaskTokens(
        trajectories=3, prompt=900, uncached_prompt=360, completion=24
    )  # the load: each trajectory that finished (the repeat left out)


def test_a_decode_rate_is_scaled_from_the_batch_it_ran_at_to_the_engines_full_batch() -> None:
    """An engine that decoded 2 sequences a step at 100 tokens/s could decode 64 at ~3,200: a pool given little
    work must not look slow for it (a decode step reads the weights once for the whole batch)."""
    p, state = TrainingPlan.of(auto_job()), TrainingState()
    placement.start(p, state)
    report(state, engine_report("busy", "h800", (1000, 1.0), (6400, 1.0), steps=100, max_batch=64))
    report(state, engine_report("idle", "h20", (1000, 1.0), (100, 1.0), steps=50, max_batch=64))
    report(state, engine_report("hf", "h20", (1000, 1.0), (100, 1.0), steps=50))  # one request at a time: as is
    rates = {r.pool: r.decode_tokens_per_s for r in placement.pool_rates(p, state, p.placement_pools)}
    assert rates == {"h800": 6400, "h20": pytest.approx((3200 + 100) / 2)}


def test_a_replan_moves_tasks_to_the_pools_their_tokens_suit_and_is_shown() -> None:
    """h800 prefills 10x faster, h20 decodes 10x faster: the long prompts go to h800, the long replies to h20,
    the opposite of where the spread... put them, once swapped by hand."""
    p, state = TrainingPlan.of(auto_job()), TrainingState()
    placement.start(p, state)
    state.placement.assignment = {"frozenlake": "h20", "math": "h800"}  # backwards
    report(
        state,
        engine_report("a", "h800", (10_000, 1.0), (100, 1.0)),
        engine_report("b", "h20", (1000, 1.0), (1000, 1.0)),
    )
    state.history = [step(0), step(1)]
    state.step = 1
    assert not placement.due(p, state)  # every 2 steps
    state.step = 2
    assert placement.due(p, state)
    finished(state, {"frozenlake": (8, 2000, 20), "math": (8, 40, 400)})
    assert placement.replan(p, state)
    assert state.placement.assignment == {"frozenlake": "h800", "math": "h20"}
    assert state.placement.planned_at == 2 and state.placement.moves == 1 and not placement.due(p, state)
    assert any("x)" in line for line in state.placement.reasons) and state.placement.reasons[-1] == "moved"
    launched = {
        launch.groups[0].task.name: launch.groups[0].task.generate_pool for launch in admission.launches(p, state, "j")
    }
    assert launched == {"frozenlake": "h800", "math": "h20"}


def test_a_small_gain_keeps_the_placement() -> None:
    """Equal pools, loads that differ a little: the best plan's gain is below MIN_GAIN, so nothing moves."""
    p, state = TrainingPlan.of(auto_job(every_steps=1)), TrainingState()
    placement.start(p, state)
    for w, pool in (("a", "h800"), ("b", "h20")):
        report(state, engine_report(w, pool, (1000, 1.0), (100, 1.0)))
    finished(state, {"frozenlake": (4, 100, 10), "math": (4, 100, 11)})
    state.history, state.step = [step(0)], 1
    assert not placement.replan(p, state)
    assert state.placement.assignment == {"frozenlake": "h800", "math": "h20"}
    assert state.placement.reasons[-1].startswith("kept") and state.placement.plans == 1


def test_fixed_tasks_load_their_pool_and_auto_tasks_avoid_it() -> None:
    """A fixed task fills h800: the one auto task, equal on both pools, goes to the idle h20."""
    tasks = [frozenlake_task(group_size=4), arithmetic_task(generate_pool="auto", group_size=4)]
    p = TrainingPlan.of(JobSpec(tasks=tasks, training=TrainingConfig(batch_size=8, placement={"every_steps": 1})))
    state = TrainingState()
    placement.start(p, state)
    assert state.placement.assignment == {"math": "h800"}  # the first pool, until measured
    finished(state, {"frozenlake": (4, 500, 50), "math": (4, 500, 50)})
    state.history, state.step = [step(0)], 1
    assert placement.replan(p, state)
    assert state.placement.assignment == {"math": "h20"}


def test_nothing_measured_yet_keeps_the_spread() -> None:
    p, state = TrainingPlan.of(auto_job(every_steps=1)), TrainingState()
    placement.start(p, state)
    state.history, state.step = [step(0)], 1
    assert not placement.replan(p, state)
    assert state.placement.reasons == ["no auto task has finished a trajectory since the last plan: placement kept"]


def test_rollart_status_and_the_report_show_the_placement_and_why() -> None:
    from rollart.cli.status import placement_lines
    from rollart.client.report_html import _placement_section
    from rollart.contracts.training import TrainingStatus

    p, state = TrainingPlan.of(auto_job()), TrainingState()
    placement.start(p, state)
    report(state, engine_report("a", "h800", (10_000, 1.0), (100, 1.0)))
    finished(state, {"frozenlake": (4, 2000, 20), "math": (4, 40, 400)})
    state.history, state.step = [step(0)], 1  # the plan follows step 0
    placement.replan(p, state)
    status = TrainingStatus.model_validate(
        {
            **dict.fromkeys(("step", "steps", "version", "async_bound", "started", "trained", "dropped"), 0),
            **dict.fromkeys(("failed", "in_flight", "buffered"), 0),
            "job_id": "j",
            "rollout_mode": "trajectory",
            **dict.fromkeys(("paused", "stopping", "done", "ledger_balanced"), False),
            "placement": state.placement,
        }
    )
    lines = placement_lines(status)
    assert lines[0].startswith("placement (step 1): frozenlake → ") and "1 plan(s)" in lines[0]
    assert any(line.startswith("  h800: 1 engine(s), prefill 10,000 tokens/s") for line in lines)
    assert state.history[-1].placement_plan[0] == state.placement.describe()  # the step record carries the plan
    section = _placement_section([r.model_dump(mode="json") for r in state.history])  # metrics.jsonl's rows
    assert '<h2 id="placement">Placement</h2>' in section and "placement (step 1)" in section
    assert _placement_section([step(0).model_dump(mode="json")]) == ""  # no auto task: no section
