"""`rollart show` and `rollart trajectories`: the printing on hand-built data, then both commands on the stack."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from rollart.cli.show import header_lines, turn_lines
from rollart.client.job_trajectories import TrajectoryRow, pick_rows
from rollart.client.trajectory_loader import workflow_candidates
from rollart.client.trajectory_view import CallInfo, TrajectoryView, TurnView, summarize_logprobs
from rollart.contracts.rollouts import TrajectoryResult
from tests.support.cli import rollart

# ------------------------------------------------------------------ unit: hand-built data


def _turn(i: int, **kw: object) -> TurnView:
    base = {
        "index": i,
        "observation": f"obs {i}",
        "action": f"act {i}",
        "data_key": f"trajectories/j/t/turn-{i:03d}",
        "env_reward": 0.0,
        "done": False,
        "info": {"cell": i},
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "finish_reason": "stop",
        "policy_version": 2,
        "policy_version_end": 2,
        "logprobs": summarize_logprobs([-0.5, -1.0, -1.5]),
        "generate": CallInfo("generate", "h800-ab12", "h800", 0.01, 0.25, True),
        "step": CallInfo("step", "cpu-cd34", "cpu@cpu-cd34", 0.002, 0.004, True),
    }
    return TurnView(**{**base, **kw})  # type: ignore[arg-type]


def test_logprob_summary() -> None:
    s = summarize_logprobs([-0.5, -1.0, -1.5])
    assert s is not None and (s.n, s.total, s.mean, s.min) == (3, -3.0, -1.0, -1.5)
    assert abs(s.perplexity - 2.718281828) < 1e-6
    assert summarize_logprobs([]) is None


def test_a_turn_prints_its_observation_action_tokens_env_and_workers() -> None:
    lines = turn_lines(_turn(1, done=True, env_reward=1.0, policy_version_end=3))
    text = "\n".join(lines)
    assert lines[0] == "observation: obs 1" and lines[1] == "action: act 1"
    assert "tokens: prompt 40, completion 3 (stop)" in text and "logprobs mean -1.000 min -1.500 sum -3.00" in text
    assert "policy v2→v3" in text
    assert 'env: reward 1 · done yes · info {"cell": 1}' in text
    assert "generate on h800-ab12 0.250s (queued 0.010s)" in text and "step on cpu-cd34 0.004s" in text


def test_a_turn_without_store_record_says_why_and_long_text_is_cut() -> None:
    text = "\n".join(turn_lines(_turn(0, logprobs=None, store_note="no store", observation="x" * 50), width=10))
    assert "logprobs: no store" in text and "observation: xxxxxxxxxx… (+40 chars)" in text


def test_header_names_outcome_versions_worker_and_ui() -> None:
    r = TrajectoryResult(
        trajectory_id="j-frozenlake-0000",
        task="frozenlake",
        seed=7,
        status="completed",
        reward=1.0,
        success=True,
        turns=2,
        policy_version_min=2,
        policy_version_max=2,
        prompt_tokens=80,
        completion_tokens=6,
        env_worker="cpu-cd34",
    )
    view = TrajectoryView(
        trajectory_id=r.trajectory_id,
        workflow_id=r.trajectory_id,
        run_id="run",
        workflow_type="TrajectoryWorkflow",
        workflow_status="completed",
        result=r,
        turns=[_turn(0), _turn(1)],
    )
    text = "\n".join(header_lines(view, "http://ui/x"))
    assert "trajectory j-frozenlake-0000: completed" in text and "reward 1.000 · success yes · 2 turn(s)" in text
    assert "policy versions v2..v2 · env worker cpu-cd34" in text and "Temporal UI: http://ui/x" in text


def test_member_ids_map_to_their_group_or_batch_workflow() -> None:
    assert workflow_candidates("job-frozenlake-0000") == ["job-frozenlake-0000", "job-frozenlake"]
    assert workflow_candidates("job-g000003-5") == ["job-g000003-5", "job-g000003"]
    assert workflow_candidates("plain") == ["plain"]


def test_rows_filter_and_sort() -> None:
    rows = [
        TrajectoryRow("a", "a", "t1", "completed", reward=0.5),
        TrajectoryRow("b", "b", "t2", "completed", reward=1.0),
        TrajectoryRow("c", "c", "t1", "failed", error="boom"),
        TrajectoryRow("d", "d", "t1", "completed", reward=0.0),
    ]
    assert [r.trajectory_id for r in pick_rows(rows, worst=2)] == ["d", "a"]
    assert [r.trajectory_id for r in pick_rows(rows, best=1)] == ["b"]
    assert [r.trajectory_id for r in pick_rows(rows, task="t1")] == ["a", "c", "d"]
    assert [r.trajectory_id for r in pick_rows(rows, failed=True)] == ["c"]
    assert pick_rows(rows[:2], failed=True) == []


# ------------------------------------------------------------------ integration: the session stack


@pytest.mark.integration
def test_show_prints_every_turn_of_a_rollout(capsys, stack, stack_job, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job_file = tmp_path / "job.json"
    job_file.write_text(stack_job.model_dump_json())
    where = ["--temporal-address", stack.address, "--store-path", str(stack_job.store.path), "--ui-url", "http://ui"]
    done = rollart(capsys, "rollout", str(job_file), "-n", "2", "--temporal-address", stack.address, "--seed", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"^job (\S+): starting", done.stdout, re.MULTILINE).group(1)  # type: ignore[union-attr]

    listed = rollart(capsys, "trajectories", job_id, "--json", *where)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"completed"}
    table = rollart(capsys, "trajectories", job_id, *where)
    assert table.returncode == 0 and all(r["trajectory_id"] in table.stdout for r in rows), table.stdout
    failed = rollart(capsys, "trajectories", job_id, "--failed", "--json", *where)
    assert failed.returncode == 0 and failed.stdout == "", failed.stdout + failed.stderr

    for row in rows:
        shown = rollart(capsys, "show", row["trajectory_id"], *where)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        out = shown.stdout
        assert out.count("observation: ") == row["turns"] and out.count("action: ") == row["turns"], out
        assert f"reward {row['reward']:.3f}" in out and "policy versions v0..v0" in out
        assert re.search(r"generate on h800-\S+", out) and re.search(r"step on cpu-\S+", out), out
        assert f"Temporal UI: http://ui/namespaces/default/workflows/{row['workflow_id']}/" in out
        as_json = json.loads(rollart(capsys, "show", row["trajectory_id"], "--json", *where).stdout)
        assert len(as_json["turns"]) == row["turns"]
        assert all(t["logprobs"] and t["logprobs"]["n"] == t["completion_tokens"] for t in as_json["turns"])

    unknown = rollart(capsys, "show", f"{job_id}-nope", *where)
    assert unknown.returncode == 2 and f"{job_id}-nope" in unknown.stderr and "rollart trajectories" in unknown.stderr


@pytest.mark.integration
async def test_show_finds_a_member_of_a_group_workflow(stack, stack_job, client) -> None:  # type: ignore[no-untyped-def]
    from rollart.client.rollout import plan_trajectories, run_rollout
    from rollart.client.trajectory_loader import load_trajectory
    from rollart.infra.store.payload import LocalStore
    from tests.support.tasks import frozenlake_task

    task = frozenlake_task(group_size=2, max_turns=3, env_args={"maps": "standard"}, rollout_unit="group")
    job_id = f"show-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(stack_job.model_copy(update={"tasks": [task]}), 2, seed=3, job_id=job_id)
    outcomes = await run_rollout(client, inputs, job_id)
    for o in outcomes:
        assert o.result is not None and o.result.status == "completed"
        view = await load_trajectory(client, o.result.trajectory_id, LocalStore(stack_job.store.path))
        assert view.workflow_type == "GroupRolloutWorkflow" and view.workflow_id == o.workflow_id
        assert len(view.turns) == o.result.turns and all(t.step and t.generate for t in view.turns)
        assert [t.action for t in view.turns] and all(t.logprobs for t in view.turns)
