"""Automatic affinity: the planner (spec/placement.py), the GPU rooflines it can start from (spec/hardware.py) and
the token profile a run records for it (uncached prompt tokens per trajectory, tokens per task per step)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rollart.cli.main import run as cli_run
from rollart.contracts.activities import SampleRef
from rollart.contracts.generation import Completion, GenerateResult
from rollart.contracts.training import StepRecord, TaskTokens
from rollart.spec import placement
from rollart.spec.hardware import engine_rates
from rollart.spec.placement import PoolRates, TaskLoad, evaluate, plan, reasons, size_pools
from rollart.workflows.driver.episode import uncached_prompt_tokens
from rollart.workflows.training.records import task_tokens

# a prefill-heavy pool (fast compute) and a decode-heavy one (fast memory), 2 engines each
H800 = PoolRates("h800", 2, prefill_tokens_per_s=40_000, decode_tokens_per_s=2_000)
H20 = PoolRates("h20", 2, prefill_tokens_per_s=6_000, decode_tokens_per_s=2_400)
# a long-prompt, short-answer task and a short-prompt, long-answer one
AGENT = TaskLoad("agent", trajectories=32, uncached_prompt_tokens=6_000, decode_tokens=200)
MATH = TaskLoad("math", trajectories=64, uncached_prompt_tokens=100, decode_tokens=600)


def test_a_pool_shares_a_task_over_its_engines() -> None:
    seconds = H800.seconds(AGENT)  # 32 x (6000 / 40000 + 200 / 2000) / 2 engines
    assert seconds == pytest.approx(32 * (0.15 + 0.1) / 2)


def test_prefill_heavy_work_goes_to_the_compute_pool_and_decode_heavy_to_the_bandwidth_pool() -> None:
    chosen = plan([AGENT, MATH], [H800, H20])
    assert chosen.assignment == {"agent": "h800", "math": "h20"}
    swapped = evaluate({"agent": "h20", "math": "h800"}, [AGENT, MATH], [H800, H20])
    assert chosen.makespan_s < swapped.makespan_s


def test_the_plan_is_the_best_of_every_assignment() -> None:
    loads = [TaskLoad(f"t{i}", 8 + 3 * i, 500 * (i % 3 + 1), 100 * (4 - i % 4)) for i in range(6)]
    rates = [H800, H20, PoolRates("l40s", 1, 10_000, 1_500)]
    best = min(
        evaluate(dict(zip((t.task for t in loads), combo)), loads, rates).makespan_s
        for combo in itertools.product([r.pool for r in rates], repeat=len(loads))
    )
    assert plan(loads, rates).makespan_s == pytest.approx(best)


def test_past_the_exhaustive_limit_greedy_and_moves_come_within_a_task_of_the_best(monkeypatch) -> None:
    loads = [TaskLoad(f"t{i}", 8 + 3 * i, 500 * (i % 3 + 1), 100 * (4 - i % 4)) for i in range(6)]
    exact = plan(loads, [H800, H20])
    monkeypatch.setattr(placement, "EXHAUSTIVE_LIMIT", 1)
    heuristic = plan(loads, [H800, H20])
    largest = max(min(H800.seconds(t), H20.seconds(t)) for t in loads)
    assert exact.makespan_s <= heuristic.makespan_s <= exact.makespan_s + largest


def test_a_task_stays_on_the_pools_it_may_use() -> None:
    chosen = plan([AGENT, MATH], [H800, H20], allowed={"agent": ["h20"]})
    assert chosen.assignment["agent"] == "h20"
    with pytest.raises(ValueError, match="'agent' may run on no pool"):
        plan([AGENT], [H800], allowed={"agent": []})


def test_a_pool_without_rates_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"no rates for pool\(s\) \['l40s'\]"):
        evaluate({"agent": "l40s"}, [AGENT], [H800])


def test_the_reasons_name_the_busiest_pool_and_the_gain_over_the_declared_placement() -> None:
    declared = evaluate({"agent": "h20", "math": "h800"}, [AGENT, MATH], [H800, H20])
    chosen = plan([AGENT, MATH], [H800, H20])
    text = "\n".join(reasons(chosen, [AGENT, MATH], declared))
    assert "agent -> h800" in text and "the step waits for" in text
    assert f"({declared.makespan_s / chosen.makespan_s:.2f}x)" in text


def test_pool_sizes_meet_the_step_time() -> None:
    one = [PoolRates(r.pool, 1, r.prefill_tokens_per_s, r.decode_tokens_per_s) for r in (H800, H20)]
    sizes = size_pools([AGENT, MATH], one, {"agent": "h800", "math": "h20"}, step_s=2.0)
    sized = [PoolRates(r.pool, sizes[r.pool], r.prefill_tokens_per_s, r.decode_tokens_per_s) for r in one]
    assert evaluate({"agent": "h800", "math": "h20"}, [AGENT, MATH], sized).makespan_s <= 2.0
    fewer = [PoolRates(r.pool, max(1, sizes[r.pool] - 1), r.prefill_tokens_per_s, r.decode_tokens_per_s) for r in one]
    assert evaluate({"agent": "h800", "math": "h20"}, [AGENT, MATH], fewer).makespan_s > 2.0


def test_rooflines_make_the_h800_the_prefill_pool_and_the_h20_the_decode_pool() -> None:
    h800, h20 = engine_rates("NVIDIA-H800", 7e9), engine_rates("NVIDIA-H20", 7e9)
    assert h800.prefill_tokens_per_s == pytest.approx(989e12 * 0.5 / 14e9)  # compute bound
    assert h800.prefill_tokens_per_s > 6 * h20.prefill_tokens_per_s
    # per GPU the H20 decodes about as fast (bandwidth bound), so decode is its relative strength
    assert h20.decode_tokens_per_s / h20.prefill_tokens_per_s > 5 * h800.decode_tokens_per_s / h800.prefill_tokens_per_s
    small = engine_rates("NVIDIA-H20", 7e9, batch=8, context=8192)  # long contexts, small batch: memory bound
    assert small.decode_tokens_per_s > engine_rates("NVIDIA-H800", 7e9, batch=8, context=8192).decode_tokens_per_s
    assert engine_rates("NVIDIA-H800", 7e9, gpus=2).prefill_tokens_per_s == pytest.approx(2 * h800.prefill_tokens_per_s)
    with pytest.raises(ValueError, match="no roofline for GPU 'A100'"):
        engine_rates("A100", 7e9)


def _gen(prompt: int, completion: int) -> GenerateResult:
    done = Completion(text="x", num_tokens=completion, finish_reason="stop")
    return GenerateResult(
        completions=[done], prompt_tokens=prompt, policy_version=0, policy_version_end=0, data_key="k"
    )


def test_a_turn_prefills_only_what_is_new_since_the_turn_before() -> None:
    # turn 1: 100 prompt, 10 reply; turn 2: the 110 before + 20 new; turn 3: a re-rendered prompt shorter than
    # the context so far (its whole prompt may be cached: nothing new counted)
    assert uncached_prompt_tokens([_gen(100, 10), _gen(130, 5), _gen(120, 5)]) == 100 + 20 + 0
    assert uncached_prompt_tokens([]) == 0


def test_a_step_record_profiles_each_task_s_tokens() -> None:
    def sample(task: str, prompt: int, uncached: int | None, completion: int) -> SampleRef:
        return SampleRef(
            trajectory_id=f"{task}-{prompt}",
            task=task,
            group_id="g",
            reward=0.0,
            success=False,
            turn_keys=[],
            policy_version_min=0,
            policy_version_max=0,
            completion_tokens=completion,
            prompt_tokens=prompt,
            uncached_prompt_tokens=uncached,
        )

    tokens = task_tokens([sample("lake", 300, 120, 8), sample("lake", 200, 90, 6), sample("math", 40, None, 3)])
    assert tokens["lake"] == TaskTokens(trajectories=2, prompt=500, uncached_prompt=210, completion=14)
    assert tokens["math"] == TaskTokens(trajectories=1, prompt=40, uncached_prompt=40, completion=3)  # None: all of it


JOB = """
name: placed
tasks:
  - {name: lake, env: frozenlake, reward: success, generate_pool: h20, max_turns: 8}
  - {name: sums, env: arithmetic, reward: exact_match, generate_pool: h800, max_turns: 1}
"""


def _profiled_run(tmp_path: Path) -> tuple[Path, Path]:
    """A job whose declared placement is backwards, and a run dir whose metrics say so: `lake` prefills long
    prompts and decodes little, `sums` the opposite."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tokens = {
        "lake": TaskTokens(trajectories=32, prompt=32 * 9000, uncached_prompt=32 * 6000, completion=32 * 200),
        "sums": TaskTokens(trajectories=64, prompt=64 * 100, uncached_prompt=64 * 100, completion=64 * 600),
    }
    rows = [StepRecord(step=s, version=s + 1, time=0.0, samples=96, reward_mean=0.0, success_rate=0.0) for s in (0, 1)]
    lines = [r.model_copy(update={"task_tokens": tokens}).model_dump_json() for r in rows]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return job, run_dir


def test_rollart_plan_moves_each_task_to_the_pool_its_tokens_suit(tmp_path: Path, capsys) -> None:
    job, run_dir = _profiled_run(tmp_path)
    assert cli_run(["plan", str(job), "--profile", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "lake -> h800" in out and "sums -> h20" in out
    assert "in the job spec: lake: generate_pool: h800, sums: generate_pool: h20" in out
    gain = float(out.split("this plan: ")[1].split("(")[1].split("x)")[0])
    assert gain > 1.5  # the declared placement puts the prefill-heavy task on the slow-compute pool


def test_rollart_plan_compares_an_auto_task_where_the_run_placed_it(tmp_path: Path, capsys) -> None:
    """`generate_pool: auto`: the placement to beat is the one the run's last step record names."""
    job, run_dir = _profiled_run(tmp_path)
    job.write_text(JOB.replace("generate_pool: h20", "generate_pool: auto"))
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = StepRecord.model_validate_json(rows[-1]).model_copy(update={"placement": {"lake": "h800"}})
    (run_dir / "metrics.jsonl").write_text("\n".join([*rows[:-1], last.model_dump_json()]) + "\n")
    assert cli_run(["plan", str(job), "--profile", str(run_dir)]) == 0
    assert "in the job spec: sums: generate_pool: h20" in capsys.readouterr().out  # lake is where it goes already


def test_rollart_k8s_plan_sizes_the_pools_for_a_step_time(tmp_path: Path, capsys) -> None:
    job, run_dir = _profiled_run(tmp_path)
    assert cli_run(["k8s", "plan", str(job), "--profile", str(run_dir), "--step-s", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "kubernetes:\n  pools:\n    h800: {replicas: " in out and "    h20: {replicas: " in out
    assert cli_run(["k8s", "plan", str(job), "--profile", str(run_dir)]) != 0
    assert "give --step-s" in capsys.readouterr().err


def test_rollart_plan_says_what_is_wrong_with_a_run_dir_or_a_flag(tmp_path: Path, capsys) -> None:
    job, _ = _profiled_run(tmp_path)
    assert cli_run(["plan", str(job), "--profile", str(tmp_path)]) != 0
    assert "metrics.jsonl" in capsys.readouterr().err
    assert cli_run(["plan", str(job), "--profile", str(tmp_path / "run"), "--rates", "h800=fast"]) != 0
    assert "expected POOL=VALUE" in capsys.readouterr().err
