"""Pools as data: the declaration (`pools:` over the six defaults), its queries, and what reads it.

Pure: no server, no worker process. The integration test of a declared pool serving a rollout is in
tests/test_declared_pool.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rollart.spec.config import JobSpec, load_job
from rollart.spec.pools import (
    DEFAULT_POOLS,
    Pool,
    PoolSpec,
    check_fixed_roles,
    is_generation,
    merge_declared,
    pools_with_role,
    role_problem,
)
from rollart.workers.local_stack import pools_for_job
from rollart.workers.settings import WorkerSettings
from tests.support.cli import rollart
from tests.support.tasks import frozenlake_task

L40S = {"l40s": {"role": "generation", "gpu": {"product": "NVIDIA-L40S", "count": 1}}, "sandbox": {"role": "env"}}
"""The issue's declaration: a generation pool on L40S GPUs and a second env pool."""


def l40s_job(**overrides: object) -> JobSpec:
    task = frozenlake_task(generate_pool="l40s").model_dump()
    return JobSpec.model_validate({"tasks": [task], "pools": L40S, **overrides})


# ---------------------------------------------------------------- the declaration


def test_every_job_has_the_six_defaults_with_their_roles() -> None:
    job = JobSpec(tasks=[frozenlake_task()])
    assert {name: spec.role for name, spec in job.pools.items()} == {
        "control": "control",
        "cpu": "env",
        "h800": "generation",
        "h20": "generation",
        "serverless": "reward",
        "trainer": "trainer",
    }
    assert job.pools["h800"].gpu is not None and job.pools["h800"].gpu.product == "NVIDIA-H800"
    assert job.pools["cpu"].gpu is None
    assert [p.value for p in Pool] == ["h20", "h800", "cpu", "serverless", "trainer", "control"]  # the constants
    assert set(DEFAULT_POOLS) == {p.value for p in Pool}


def test_declared_pools_join_the_defaults_in_declaration_order() -> None:
    job = l40s_job()
    assert list(job.pools) == ["control", "cpu", "h800", "h20", "serverless", "trainer", "l40s", "sandbox"]
    assert job.pools["l40s"] == PoolSpec(role="generation", gpu={"product": "NVIDIA-L40S", "count": 1})
    assert pools_with_role(job.pools, "generation") == ["h800", "h20", "l40s"]
    assert pools_with_role(job.pools, "env", "generation") == ["cpu", "h800", "h20", "l40s", "sandbox"]
    assert is_generation(job.pools, "l40s") and not is_generation(job.pools, "sandbox")
    assert not is_generation(job.pools, "b200")  # not declared


def test_the_scaling_section_of_today_keeps_working(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "tasks:\n  - {name: a, env: frozenlake, reward: success}\n"
        "pools: {serverless: {min_workers: 0, max_workers: 4}}\n"
    )
    job = load_job(spec)
    scaling = job.elastic("serverless")
    assert (scaling.role, scaling.min_workers, scaling.max_workers, scaling.max_concurrent_activities) == (
        "reward",
        0,
        4,
        16,
    )


def test_a_default_is_merged_field_by_field() -> None:
    pools = merge_declared({"h800": {"gpu": {"product": "NVIDIA-A100-SXM4-80GB"}}, "serverless": {"max_workers": 8}})
    assert pools["h800"] == {"role": "generation", "gpu": {"product": "NVIDIA-A100-SXM4-80GB"}}
    assert pools["serverless"] == {"role": "reward", "max_workers": 8}
    assert pools["cpu"] is DEFAULT_POOLS["cpu"]  # the others as they are
    two = merge_declared({"h20": {"gpu": {"count": 2}}})["h20"]
    assert two == {"role": "generation", "gpu": {"product": "NVIDIA-H20", "count": 2}}  # the product kept


def test_a_job_round_trips_through_its_dump() -> None:
    """The pods load the job as `rollart k8s render` dumps it, and flags are laid over a dump: same job back."""
    job = l40s_job(pools={**L40S, "serverless": {"min_workers": 0}})
    assert JobSpec.model_validate(job.model_dump()) == job
    assert JobSpec.model_validate_json(job.model_dump_json()) == job


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        (
            {"b200": {"gpu": {"product": "NVIDIA-B200"}}},
            "pools.b200: a pool that is not one of the defaults (control, cpu, h800, h20, serverless, trainer) needs "
            "a role (role: control | env | generation | reward | trainer)",
        ),
        ({"b200": {"role": "decode"}}, "Input should be 'control', 'env', 'generation', 'reward' or 'trainer'"),
        (
            {"l40s": {"role": "generation", "max_workers": 8}},
            "max_workers: generation pools have a fixed set of workers; only reward pools (serverless) scale",
        ),
        ({"L40S": {"role": "generation"}}, "String should match pattern"),  # it names Kubernetes objects
        ({"l40s": {"role": "generation", "gpu": {"count": 2}}}, "gpu.product\n  Field required"),
        ({"cpu": {"role": "trainer"}}, "pools.cpu: role trainer belongs to pool 'trainer' alone"),
        ({"control": {"role": "env"}}, "pools.control.role is env, but the workflows send control work to 'control'"),
    ],
)
def test_bad_declarations_say_what_to_fix(pools: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({"tasks": [frozenlake_task().model_dump()], "pools": pools})
    assert message in str(err.value), str(err.value)


def test_role_problems_name_what_is_declared() -> None:
    pools = {**DEFAULT_POOLS, "l40s": PoolSpec(role="generation")}
    assert role_problem(pools, "l40s", ("generation",), "tasks.0.generate_pool") is None
    assert role_problem(pools, "l40", ("generation",), "tasks.0.generate_pool") == (
        "tasks.0.generate_pool: pool 'l40' is not declared (pools: control, cpu, h800, h20, serverless, trainer, "
        "l40s); declare it under `pools:` with role generation, or use one of the generation pools: h800, h20, l40s"
    )
    assert role_problem(pools, "serverless", ("env", "generation"), "tasks.1.env_pool") == (
        "tasks.1.env_pool: pool 'serverless' has role reward, not env or generation; env or generation pools: "
        "cpu, h800, h20, l40s"
    )
    assert check_fixed_roles(DEFAULT_POOLS) == []


# ---------------------------------------------------------------- tasks route to declared pools


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"generate_pool": "l40"}, "tasks.0.generate_pool: pool 'l40' is not declared"),
        ({"generate_pool": "sandbox"}, "tasks.0.generate_pool: pool 'sandbox' has role env, not generation"),
        ({"env_pool": "trainer"}, "tasks.0.env_pool: pool 'trainer' has role trainer, not env or generation"),
        ({"reward_pool": "cpu"}, "tasks.0.reward_pool: pool 'cpu' has role env, not reward; reward pools: serverless"),
    ],
)
def test_a_task_naming_a_pool_of_another_role_is_refused(task: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({"tasks": [frozenlake_task(**task).model_dump()], "pools": L40S})
    assert message in str(err.value), str(err.value)


def test_a_second_reward_pool_takes_the_rewards_of_the_tasks_sent_there() -> None:
    rm = {"rm": {"role": "reward", "min_workers": 0, "max_workers": 2}}
    job = JobSpec.model_validate({"tasks": [frozenlake_task(reward_pool="rm").model_dump()], "pools": {**L40S, **rm}})
    assert job.tasks[0].reward_queue == "rm" and job.elastic("rm").max_workers == 2
    assert pools_for_job(job) == ["control", "cpu", "h800", "rm"]  # no serverless worker: nothing goes there
    with pytest.raises(ValueError, match=r"pool 'l40s' is not elastic; only reward pools scale: serverless, rm"):
        job.elastic("l40s")


def test_the_local_stack_starts_the_declared_pools_the_tasks_use() -> None:
    task = frozenlake_task(generate_pool="l40s", env_pool="sandbox").model_dump()
    job = JobSpec.model_validate({"tasks": [task], "pools": L40S})
    assert pools_for_job(job, training=True) == ["control", "cpu", "sandbox", "l40s", "serverless", "trainer"]


# ---------------------------------------------------------------- workers serve by role


def test_a_worker_serves_what_its_pools_role_says() -> None:
    colocated = frozenlake_task(generate_pool="l40s", reward_placement="colocated").model_dump()
    job = JobSpec.model_validate({"tasks": [colocated], "pools": L40S})
    settings = WorkerSettings.from_job(job, "l40s")
    assert (settings.pool, settings.role, settings.serve_rewards) == ("l40s", "generation", True)
    assert WorkerSettings.from_job(job, "sandbox").role == "env"
    assert WorkerSettings(pool="h20").role == "generation"  # a default pool needs no job
    with pytest.raises(ValidationError, match=r"pool 'l40s' is not one of the default pools .*\(pass --job\)"):
        WorkerSettings(pool="l40s")
    with pytest.raises(ValueError, match=r"pool 'b200' is not declared in job 'job'; its pools: control, cpu,"):
        WorkerSettings.from_job(job, "b200")


def test_rollart_worker_takes_a_declared_pool_from_its_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from rollart.cli.main import build_parser
    from rollart.cli.worker import worker_settings

    spec = tmp_path / "job.json"
    spec.write_text(l40s_job(model_dir=tmp_path / "no-model").model_dump_json())
    done = rollart(capsys, "worker", "--pool", "l40s")
    assert done.returncode == 2
    assert "--pool: 'l40s' is not one of the default pools (control, cpu, h800, h20, serverless, trainer): pass " in (
        done.stderr
    )
    done = rollart(capsys, "worker", "--pool", "b200", "--job", str(spec))
    assert done.returncode == 2 and f"--pool: {spec} declares no pool 'b200'; its pools: control," in done.stderr
    args = build_parser().parse_args(["worker", "--pool", "sandbox", "--job", str(spec)])
    settings = worker_settings(args, load_job(spec))
    assert (settings.pool, settings.role) == ("sandbox", "env")
    done = rollart(capsys, "worker", "--pool", "l40s", "--job", str(spec))  # a generation worker needs its model
    assert done.returncode == 2 and "no-model" in done.stderr, done.stderr


# ---------------------------------------------------------------- the plot and the report


def test_the_timeline_orders_pools_by_their_declared_role() -> None:
    from rollart.client.plot import timeline_pools

    rows = [
        {"pool": "serverless", "role": "reward"},
        {"pool": "l40s", "role": "generation"},
        {"pool": "h20", "role": "generation"},
        {"pool": "sandbox", "role": "env"},
        {"pool": "trainer", "role": "trainer"},
        {"pool": "h800", "role": "generation"},
        {"pool": "cpu", "role": "env"},
    ]
    assert timeline_pools(rows) == [
        ("cpu", "env"),
        ("sandbox", "env"),
        ("h800", "generation"),
        ("h20", "generation"),
        ("l40s", "generation"),
        ("serverless", "reward"),
        ("trainer", "trainer"),
    ]
    # a run dir from before roles were recorded: the defaults' roles, any other pool last
    assert timeline_pools([{"pool": "trainer"}, {"pool": "x-cpu"}, {"pool": "h20"}]) == [
        ("h20", "generation"),
        ("trainer", "trainer"),
        ("x-cpu", None),
    ]


def test_the_timeline_records_each_pools_role_from_the_declaration() -> None:
    from rollart.client.timeline import _role

    pools = l40s_job().pools
    assert _role(pools, "it-l40s", "it-") == "generation"
    assert _role(pools, "sandbox", "") == "env"
    assert _role(pools, "elsewhere", "") is None


def test_the_report_shows_each_pools_role() -> None:
    from rollart.client.report_html import _timeline_section

    rows = [
        {"pool": "l40s", "role": "generation", "start": 0.0, "end": 2.0},
        {"pool": "cpu", "role": "env", "start": 1.0, "end": 4.0},
    ]
    html = _timeline_section(rows)
    assert "<th>role</th>" in html
    assert html.index("<td>cpu</td><td>env</td>") < html.index("<td>l40s</td><td>generation</td>")


# ---------------------------------------------------------------- a cluster file the job names


def test_a_job_takes_its_pools_from_the_cluster_file_it_names(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(
        "pools:\n  l40s: {role: generation, gpu: {product: NVIDIA-L40S, count: 1}}\n  sandbox: {role: env}\n"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "cluster: cluster.yaml\n"  # relative to the job's file
        "tasks:\n  - {name: a, env: frozenlake, reward: success, generate_pool: l40s}\n"
        "pools: {l40s: {gpu: {product: NVIDIA-L40S, count: 2}}, serverless: {min_workers: 0}}\n"
    )
    job = load_job(spec)
    assert list(job.pools)[-2:] == ["l40s", "sandbox"]
    assert job.pools["l40s"].role == "generation" and job.pools["l40s"].gpu.count == 2  # the job's over the cluster's
    assert job.pools["serverless"].min_workers == 0
    assert JobSpec.model_validate(job.model_dump()) == job  # the pods' copy needs no cluster file


def test_a_cluster_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    from rollart.spec.config import JobSpecError

    spec = tmp_path / "job.yaml"
    spec.write_text("cluster: nowhere.yaml\ntasks:\n  - {name: a, env: frozenlake, reward: success}\n")
    with pytest.raises(JobSpecError, match=r"nowhere.yaml: cannot read cluster file"):
        load_job(spec)
    (tmp_path / "nowhere.yaml").write_text("pools: {}\nkubernetes: {}\n")
    with pytest.raises(JobSpecError, match=r"nowhere.yaml: a cluster file holds one section, `pools:`"):
        load_job(spec)
