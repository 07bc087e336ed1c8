"""End to end on the real local stack: Temporal dev server, worker processes per pool, vLLM generation."""

from __future__ import annotations

import json
import math
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer
from transformers import AutoTokenizer

from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.contracts.rollouts import TrajectoryInput
from rollart.infra.local.devserver import find_temporal_cli
from rollart.infra.store.payload import LocalStore
from rollart.infra.temporal.connection import data_converter
from rollart.infra.temporal.history import activity_spans
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import JobSpec, WorkerTuning
from rollart.workers.local_stack import LocalStack
from rollart.workflows import ALL_WORKFLOWS
from tests.support.cli import rollart
from tests.support.history import payload_sizes
from tests.support.tasks import frozenlake_task

pytestmark = pytest.mark.integration


async def test_sixteen_trajectories_run_on_their_pools(client: Client, stack_job: JobSpec, tmp_path: Path) -> None:
    job_id = f"pools-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(stack_job, 16, seed=7, job_id=job_id)
    outcomes = await run_rollout(client, inputs, job_id)
    assert [o.status for o in outcomes] == ["completed"] * 16, [o.result.error for o in outcomes if o.result]

    store = LocalStore(stack_job.store.path)
    tokenizer = AutoTokenizer.from_pretrained(stack_job.model_dir)
    threshold = stack_job.store.payload_threshold_bytes
    histories = []
    for o in outcomes:
        r = o.result
        assert r is not None and r.reward is not None and 1 <= r.turns <= 6
        history = await client.get_workflow_handle(o.workflow_id).fetch_history()
        histories.append(history)
        runs = activity_spans(history)
        session_queue, engine_queue = f"cpu@{r.env_worker}", f"h800@{r.engine_worker}"
        expected = [("reset", "cpu"), ("generate", "h800"), ("step", session_queue)]  # later turns: on its engine
        expected += [("generate", engine_queue), ("step", session_queue)] * (r.turns - 1)
        expected += [("reward", "serverless"), ("close", session_queue)]
        assert [(a.activity_type, a.task_queue) for a in runs] == expected
        for a in runs:  # each ran on a worker of its pool; steps on the very worker holding the session
            pool = {"reset": "cpu", "reward": "serverless"}.get(a.activity_type)
            if pool:
                assert a.worker_identity.startswith(f"{pool}-"), a
            elif a.activity_type == "generate":  # every turn on the engine that served its first
                assert a.worker_identity == r.engine_worker and r.engine_worker.startswith("h800-"), a
            else:
                assert a.worker_identity == r.env_worker
        assert max(payload_sizes(history)) < threshold

        actions = _step_actions(history)
        assert len(r.turn_keys) == r.turns == len(actions)
        completion_tokens = 0
        for key, action in zip(r.turn_keys, actions):
            record = store.get_json(key)
            (c,) = record["completions"]
            assert c["text"] == action
            assert len(c["token_ids"]) == len(c["logprobs"]) >= 1
            assert all(math.isfinite(lp) and lp <= 0 for lp in c["logprobs"])
            assert record["prompt_ids"] == tokenizer(record["prompt"])["input_ids"]
            assert record["policy_version"] == 0
            completion_tokens += len(c["token_ids"])
        assert completion_tokens == r.completion_tokens

    replayer = Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=data_converter(stack_job.store),
        workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
    )
    for history in histories:  # the recorded histories replay deterministically on this code
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


def _step_actions(history: WorkflowHistory) -> list[str]:
    """The action text of every `step` the workflow scheduled, decoded from history."""
    actions = []
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            if a.activity_type.name == "step":
                actions.append(json.loads(a.input.payloads[0].data)["action"])
    return actions


async def test_a_grouped_task_rolls_out_a_workflow_per_group(client: Client, stack_job: JobSpec) -> None:
    """rollout_unit group: a GroupRolloutWorkflow per group (the last one cut short), group activities only."""
    task = frozenlake_task(group_size=4, max_turns=4, env_args={"maps": "standard"}, rollout_unit="group")
    job_id = f"groups-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(stack_job.model_copy(update={"tasks": [task]}), 10, seed=3, job_id=job_id)
    outcomes = await run_rollout(client, inputs, job_id)
    assert [o.status for o in outcomes] == ["completed"] * 10
    assert [o.result.seed for o in outcomes if o.result] == [i.seed for i in inputs]
    assert len({o.result.trajectory_id for o in outcomes if o.result}) == 10
    workflows = list(dict.fromkeys(o.workflow_id for o in outcomes))
    assert [sum(o.workflow_id == w for o in outcomes) for w in workflows] == [4, 4, 2]
    for w in workflows:
        handle = client.get_workflow_handle(w)
        assert (await handle.describe()).workflow_type == "GroupRolloutWorkflow"
        kinds = [a.activity_type for a in activity_spans(await handle.fetch_history())]
        assert kinds[0] == "reset_group" and kinds[-2:] == ["reward_batch", "close"]
        assert set(kinds) <= {"reset_group", "generate_batch", "step_group", "reward_batch", "close"}


async def test_an_env_that_raises_fails_only_its_trajectory(client: Client) -> None:
    broken = frozenlake_task(name="broken", env="tests.support.envs:BrokenStepEnv", env_args={})
    inputs = [
        TrajectoryInput(task=t, seed=i) for i, t in enumerate([broken, frozenlake_task(), broken, frozenlake_task()])
    ]
    outcomes = await run_rollout(client, inputs, f"broken-{uuid.uuid4().hex[:6]}")
    statuses = [o.status for o in outcomes]
    assert statuses == ["failed", "completed", "failed", "completed"]
    for o in outcomes[0::2]:
        assert o.result and o.result.reward is None and o.result.success is None
        assert "EnvBroken" in (o.result.error or "") and "simulated sandbox crash" in (o.result.error or "")


async def test_oversize_payloads_never_reach_history(client: Client, stack_job: JobSpec) -> None:
    """A 300 KiB observation crosses cpu → control → h800 through the store; the prompt is then too long."""
    big = frozenlake_task(name="big", env="tests.support.envs:BigObservationEnv", env_args={"kib": 300})
    [o] = await run_rollout(client, [TrajectoryInput(task=big, seed=0)], f"big-{uuid.uuid4().hex[:6]}")
    assert o.status == "failed" and "RequestRejected" in (o.result.error or ""), o.result
    history = await client.get_workflow_handle(o.workflow_id).fetch_history()
    assert max(payload_sizes(history)) < stack_job.store.payload_threshold_bytes
    owned = stack_job.store.path / "payloads" / o.workflow_id  # kept under their owner (store.md#claims)
    assert any(p.stat().st_size > 300 * 1024 for p in owned.iterdir())
    attempts = [e for e in history.events if e.HasField("activity_task_started_event_attributes")]
    assert all(e.activity_task_started_event_attributes.attempt == 1 for e in attempts)  # rejected, not retried


async def test_unknown_env_fails_the_workflow_with_its_name(client: Client) -> None:
    handle = await client.start_workflow(
        "TrajectoryWorkflow",
        TrajectoryInput(task=frozenlake_task(env="frozenlak"), seed=0),
        id=f"unknown-{uuid.uuid4().hex[:6]}",
        task_queue="control",
    )
    with pytest.raises(WorkflowFailureError) as err:
        await handle.result()
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "UnknownComponent"
    assert "unknown env 'frozenlak'" in cause.message and "frozenlake" in cause.message


def _temporal(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [find_temporal_cli(), *args, "--address", stack.address]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


async def test_temporal_cli_start_valid_and_invalid_input(stack: LocalStack, client: Client, tmp_path: Path) -> None:
    good = tmp_path / "t.json"
    good.write_text(TrajectoryInput(task=frozenlake_task(), seed=3).model_dump_json())
    wid = f"cli-good-{uuid.uuid4().hex[:6]}"
    done = _temporal(
        stack,
        "workflow",
        "start",
        "--type",
        "TrajectoryWorkflow",
        "--task-queue",
        "control",
        "--workflow-id",
        wid,
        "--input-file",
        str(good),
    )
    assert done.returncode == 0, done.stderr
    result = await client.get_workflow_handle(wid).result()
    assert result["status"] == "completed"

    wid = f"cli-bad-{uuid.uuid4().hex[:6]}"
    bad = '{"task": {"name": "t", "env": "frozenlake", "max_turns": 0}, "seed": 1}'
    done = _temporal(
        stack,
        "workflow",
        "start",
        "--type",
        "TrajectoryWorkflow",
        "--task-queue",
        "control",
        "--workflow-id",
        wid,
        "--input",
        bad,
    )
    assert done.returncode == 0, done.stderr
    with pytest.raises(WorkflowFailureError) as err:
        await client.get_workflow_handle(wid).result()  # fails at once: no endless workflow-task retry
    message = str(err.value.cause)
    assert "task.reward" in message and "Field required" in message and "task.max_turns" in message
    history = await client.get_workflow_handle(wid).fetch_history()
    assert sum(e.HasField("workflow_task_failed_event_attributes") for e in history.events) == 0


def test_rollout_cli_against_a_running_stack(
    capsys: pytest.CaptureFixture[str], stack: LocalStack, stack_job: JobSpec, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(stack_job.model_dump_json())
    done = rollart(
        capsys, "rollout", str(job_file), "-n", "4", "--temporal-address", stack.address, "--ui-url", "http://ui"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4/4 completed" in done.stdout
    assert "http://ui/namespaces/default/workflows/itest-" in done.stdout


def test_rollout_cli_bad_input_fails_before_anything_starts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks:\n  - {name: a, env: frozenlake, reward: success, generate_pool: gpu}\n")
    done = rollart(capsys, "rollout", str(bad), "--temporal-address", "127.0.0.1:1")
    assert done.returncode == 2
    assert f"{bad}: invalid job spec" in done.stderr and "tasks.0.generate_pool" in done.stderr

    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("tasks:\n  - {name: a, env: frozenlak, reward: sucess}\n")
    done = rollart(capsys, "rollout", str(unknown), "--temporal-address", "127.0.0.1:1")
    assert done.returncode == 2
    assert "unknown env 'frozenlak'" in done.stderr and "unknown reward 'sucess'" in done.stderr
