"""Job spec validation: readable errors that name the file and the field, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.spec.config import JobSpec, JobSpecError, StopWhen, TrainingConfig, WorkerTuning, load_job
from rollart.spec.pools import Pool

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_example_job_loads() -> None:
    job = load_job(REPO / "examples" / "frozenlake.yaml")
    assert job.tasks[0].env == "frozenlake"
    assert job.tasks[0].generate_pool == Pool.H800
    assert job.tasks[0].sampling.top_k == 0
    assert job.training.stop_when == StopWhen(success=0.95, steps=20) and job.training.steps == 200  # the cap


def test_json_and_yaml_are_equivalent(tmp_path: Path) -> None:
    y = write(tmp_path, "j.yaml", "tasks:\n  - {name: a, env: frozenlake, reward: success, generate_pool: h20}\n")
    j = write(
        tmp_path,
        "j.json",
        '{"tasks": [{"name": "a", "env": "frozenlake", "reward": "success", "generate_pool": "h20"}]}',
    )
    assert load_job(y) == load_job(j)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tasks: []", ["tasks: List should have at least 1 item"]),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success, generate_pool: gpu9}",
            ["tasks.0.generate_pool", "gpu9"],
        ),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success, generate_pool: cpu}",
            ["tasks.0.generate_pool: pool 'cpu' has role env, not generation; generation pools: h800, h20"],
        ),
        # pools are what the job declares (over the six defaults), each with the role its work needs
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success, generate_pool: l40}\n"
            "pools: {l40s: {role: generation, gpu: {product: NVIDIA-L40S}}}",
            [
                "tasks.0.generate_pool: pool 'l40' is not declared (pools: control, cpu, h800, h20, serverless, "
                "trainer, l40s); declare it under `pools:` with role generation, or use one of the generation pools: "
                "h800, h20, l40s"
            ],
        ),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success, env_pool: l40s}\npools: {l40s: {role: reward}}",
            ["tasks.0.env_pool: pool 'l40s' has role reward, not env or generation; env or generation pools: cpu, h8"],
        ),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success}\npools: {sandbox: {gpu: {product: X}}}",
            ["pools: Value error, pools.sandbox: a pool that is not one of the defaults", "needs a role"],
        ),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success}\npools: {cpu: {max_workers: 8}}",
            ["pools.cpu: Value error, max_workers: env pools have a fixed set of workers"],
        ),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success, max_turns: 0}",
            ["tasks.0.max_turns", "greater than or equal to 1"],
        ),
        (
            "tasks:\n  - {name: a, env: frozenlake, reward: success, sampling: {temprature: 1}}",
            ["tasks.0.sampling.temprature", "Extra inputs"],
        ),
        ("tasks:\n  - {name: a, env: frozenlake}", ["tasks.0.reward", "Field required"]),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\n  - {name: a, env: x, reward: y}",
            ["task names must be unique", "a"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\nstore: {payload_threshold_bytes: 4000000}",
            ["store.payload_threshold_bytes"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntrainer: {backend: megatron, parallel: {tensor: 2, pipeline: "
            "2}}",
            ["trainer.parallel.pipeline", "pipeline parallelism is not supported yet (got 2)"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntrainer: {parallel: {data: 2}}",
            ["trainer: Value error, parallel: tensor 1 x data 2 needs backend: megatron"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntrainer: {backend: deepspeed}",
            ["trainer.backend", "'torch' or 'megatron'"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntrainer: {device: tpu}",
            ["trainer.device", "'auto', 'cpu' or 'cuda'"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\nengine: {gpu_memory_utilization: 1.5}",
            ["engine.gpu_memory_utilization"],
        ),
        # checked at load, not inside workflows once the stack is up:
        (
            "tasks:\n  - {name: a, env: x, reward: y, sampling: {n: 4}}",
            ["tasks.0: Value error, sampling.n is 4, but a multi-turn task (max_turns 8)"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y, group_size: 8}\n  - {name: b, env: x, reward: y, group_size: 6}\n"
            "training: {batch_size: 16}",
            ["training.batch_size 16 is not a multiple of tasks.1 (b) group_size 6"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntemporal: {task_queue_prefix: 'a b'}",
            ["temporal.task_queue_prefix"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntraining: {stop_when: {success: 0, steps: 20}}",
            ["training.stop_when.success", "a share of the episodes in (0, 1], e.g. 0.95, got 0"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntraining: {stop_when: {success: 95, steps: 20}}",
            ["training.stop_when.success", "got 95 (did you mean 0.95?)"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntraining: {stop_when: {success: 0.9, steps: 0}}",
            ["training.stop_when.steps", "greater than or equal to 1"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntraining: {stop_when: {success: 0.9}}",
            ["training.stop_when.steps", "Field required"],
        ),
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntraining: {stop_when: {success: 0.9, step: 5}}",
            ["training.stop_when.step", "Extra inputs"],
        ),
        # every episode in flight is a child of the training workflow: past the server's limit the job would hang
        (
            "tasks:\n  - {name: a, env: x, reward: y}\ntraining: {batch_size: 1024, async_bound: 1}",
            [
                "(async_bound + 1) x batch_size = 2,048 episodes of a in flight",
                "temporal.max_pending_children is 2,000",
            ],
        ),
    ],
)
def test_invalid_specs_name_file_and_field(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(JobSpecError) as err:
        load_job(path)
    message = str(err.value)
    assert message.startswith(f"{path}: invalid job spec")
    for fragment in expected:
        assert fragment in message


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", "tasks:\n  - {name: a, env: [unclosed\n")
    with pytest.raises(JobSpecError, match=r"(?s)broken.yaml: not valid YAML.*line 2"):
        load_job(path)


def test_missing_file_and_wrong_top_level(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="cannot read job spec"):
        load_job(tmp_path / "nope.yaml")
    with pytest.raises(JobSpecError, match="mapping at the top level, got list"):
        load_job(write(tmp_path, "list.yaml", "- a\n- b\n"))


def test_overrides_merge_into_sections(tmp_path: Path) -> None:
    path = write(tmp_path, "j.yaml", "tasks:\n  - {name: a, env: x, reward: y}\ntemporal: {namespace: ns1}\n")
    job = load_job(path, {"temporal": {"address": "10.0.0.1:7233"}})
    assert job.temporal.address == "10.0.0.1:7233"
    assert job.temporal.namespace == "ns1"


def test_children_in_flight_are_checked_only_where_episodes_are_children() -> None:
    """Groups, lockstep batches and a raised server limit hold 2,048 in flight without 2,048 children."""
    big = {"batch_size": 1024, "async_bound": 1}
    episode = {"name": "a", "env": "x", "reward": "y", "group_size": 8}
    JobSpec(tasks=[{**episode, "rollout_unit": "group"}], training=big)
    JobSpec(tasks=[{**episode, "max_turns": 1}], training=big)
    JobSpec(tasks=[episode], training={**big, "rollout_mode": "batch"})
    raised = {"max_pending_children": 2048, "workers": {"max_cached_workflows": 4096}}  # the cache holds them too
    JobSpec(tasks=[episode], training=big, temporal=raised)
    JobSpec(tasks=[episode], training={**big, "async_bound": 0})  # 1,024: bench scale's largest
    with pytest.raises(ValueError, match="max_pending_children is 2,047"):
        JobSpec(tasks=[episode], training=big, temporal={"max_pending_children": 2047})


def test_the_local_dev_server_gets_the_jobs_child_limit(tmp_path: Path) -> None:
    from rollart.infra.local.devserver import DevServer

    cmd = DevServer(db_file=tmp_path / "t.db", max_pending_children=4096).command()
    assert "limit.numPendingChildExecutions.error=4096" in cmd
    assert "limit.historyCount.error=51200" in cmd and "history.maximumSignalsPerExecution=10000" in cmd


def test_the_local_dev_server_enforces_the_jobs_history_and_signal_limits(tmp_path: Path) -> None:
    """A job told of lower limits (`temporal.limits`, a Cloud namespace's say) meets the same ones locally."""
    from rollart.infra.local.devserver import DevServer

    job = JobSpec(
        tasks=[{"name": "a", "env": "x", "reward": "y"}], temporal={"limits": {"history_events": 3200, "signals": 625}}
    )
    cmd = DevServer(db_file=tmp_path / "t.db", limits=job.temporal.limits).command()
    assert "limit.historyCount.error=3200" in cmd and "limit.historyCount.warn=640" in cmd
    assert "history.maximumSignalsPerExecution=625" in cmd and f"limit.historySize.error={50 * 1024 * 1024}" in cmd


def test_task_lookup_lists_known_tasks() -> None:
    job = JobSpec(tasks=[{"name": "a", "env": "x", "reward": "y"}])
    assert job.task("a").name == "a"
    with pytest.raises(KeyError, match="tasks: a"):
        job.task("b")


def test_worker_tuning_from_the_spec_reaches_the_worker_options(tmp_path: Path) -> None:
    from temporalio.worker import UnsandboxedWorkflowRunner
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    from rollart.infra.temporal.worker_tuning import activity_worker_options, workflow_worker_options

    default = JobSpec(tasks=[{"name": "a", "env": "x", "reward": "y"}]).temporal.workers
    opts = workflow_worker_options(default)
    assert opts["workflow_task_poller_behavior"].maximum == 32 and opts["max_cached_workflows"] == 2048
    assert isinstance(opts["workflow_runner"], UnsandboxedWorkflowRunner)
    assert activity_worker_options(default)["activity_task_poller_behavior"].maximum == 32
    path = write(
        tmp_path,
        "j.yaml",
        "tasks:\n  - {name: a, env: x, reward: y}\ntemporal: {workers: {sandbox: strict, activity_task_pollers: 8}}\n",
    )
    tuned = load_job(path).temporal.workers
    assert isinstance(workflow_worker_options(tuned)["workflow_runner"], SandboxedWorkflowRunner)
    assert activity_worker_options(tuned)["activity_task_poller_behavior"].maximum == 8
    scaled = WorkerTuning(pollers="autoscaling", workflow_task_pollers=16)
    polls = workflow_worker_options(scaled)["workflow_task_poller_behavior"]
    assert (polls.minimum, polls.maximum, polls.initial) == (1, 16, 5)
    assert activity_worker_options(scaled)["activity_task_poller_behavior"].maximum == 32
    with pytest.raises(JobSpecError, match="workflow_task_pollers"):
        load_job(
            write(
                tmp_path,
                "bad.yaml",
                "tasks:\n  - {name: a, env: x, reward: y}\ntemporal: {workers: {workflow_task_pollers: 1}}\n",
            )
        )


def test_dynamic_sampling_is_on_or_off_and_widens_admission_by_its_oversample() -> None:
    assert TrainingConfig(batch_size=64, async_bound=1).in_flight_limit == 128
    on = TrainingConfig(batch_size=64, async_bound=1, dynamic_sampling=True)
    assert on.dynamic_sampling.enabled and on.in_flight_limit == 160  # 128 + 25 %
    assert TrainingConfig(batch_size=64, dynamic_sampling={"enabled": True, "oversample": 0}).in_flight_limit == 128
    assert not TrainingConfig(dynamic_sampling=False).dynamic_sampling.enabled
    with pytest.raises(ValueError, match="oversample"):
        TrainingConfig(dynamic_sampling={"enabled": True, "oversample": -1})


def test_stop_when_is_off_unless_given_and_takes_the_whole_range() -> None:
    assert TrainingConfig().stop_when is None
    assert TrainingConfig(stop_when={"success": 1.0, "steps": 1}).stop_when == StopWhen(success=1.0, steps=1)
    assert TrainingConfig(stop_when=None).stop_when is None
    for bad in (-0.1, 0.0, 1.01):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            StopWhen(success=bad, steps=5)
    assert StopWhen(success=0.8, steps=1).describe() == "success ≥ 0.8 held for 1 step"


def test_a_job_whose_workflows_in_flight_outnumber_the_sticky_cache_is_refused() -> None:
    """An evicted workflow replays its whole history on every workflow task: every episode in flight (and the
    training workflow) must fit the control worker's cache; groups need far fewer workflows."""
    episode = {"name": "a", "env": "x", "reward": "y", "max_turns": 2, "group_size": 8}
    big = {"batch_size": 512, "async_bound": 1}  # 1,024 episodes in flight
    with pytest.raises(ValueError, match="max_cached_workflows is 1,000"):
        JobSpec(tasks=[episode], training=big, temporal={"workers": {"max_cached_workflows": 1000}})
    JobSpec(tasks=[episode], training=big)  # the default, 2,048, holds them
    JobSpec(
        tasks=[{**episode, "rollout_unit": "group"}], training=big, temporal={"workers": {"max_cached_workflows": 100}}
    )
