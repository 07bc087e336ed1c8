"""Three training steps with each agentic env of the examples, on the real stack: GEM's Sokoban, the sandboxed
tool-use env, and FrozenLake behind an OpenEnv server process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from rollart.client.train import MetricsWriter, follow, start_training
from rollart.contracts.training import TrainingStatus
from rollart.infra.local.devserver import free_port
from rollart.spec.config import JobSpec, TaskSpec, TrainingConfig, load_job
from rollart.workers.env_server import wait_healthy
from tests.support.paths import REPO

pytestmark = pytest.mark.integration


def example_task(name: str, **overrides: object) -> TaskSpec:
    """The first task of examples/NAME.yaml, groups of 4, with `overrides`."""
    task = load_job(REPO / "examples" / f"{name}.yaml").tasks[0]
    return task.model_copy(update={"group_size": 4, **overrides})


@contextlib.contextmanager
def env_server(log: Path) -> Iterator[str]:
    """`rollart env-server` serving FrozenLake (the standard map) on a free port; its URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "rollart.cli",
        "env-server",
        "--env",
        "frozenlake",
        "--env-args",
        '{"maps": "standard"}',
        "--port",
        str(port),
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120, proc)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize("env", ["sokoban", "tool_use", "openenv"])
async def test_three_training_steps(client: Client, stack_job: JobSpec, tmp_path: Path, env: str) -> None:
    with contextlib.ExitStack() as stack:
        if env == "sokoban":
            task = example_task("sokoban", max_turns=4)
        elif env == "tool_use":  # the session stack's engine holds 256 tokens: shorter prompts, shorter answers
            base = example_task("tool_use")
            task = example_task(
                "tool_use",
                env_args={**base.env_args, "max_observation_chars": 200},
                max_turns=2,
                sampling=base.sampling.model_copy(update={"max_tokens": 8}),
            )
        else:
            url = stack.enter_context(env_server(tmp_path / "env-server.log"))
            task = example_task("openenv", env_args={"base_url": url}, max_turns=4)
        job = stack_job.model_copy(
            update={
                "tasks": [TaskSpec.model_validate(task.model_dump())],
                "training": TrainingConfig(steps=3, batch_size=8),
            }
        )
        job_id = f"agentic-{env}-{uuid.uuid4().hex[:6]}"
        handle = await start_training(client, job, job_id, tmp_path / job_id)
        rows: list[dict] = []
        result = await follow(handle, MetricsWriter(tmp_path / job_id), rows.append, poll_s=0.2)
        status = await handle.query("status", result_type=TrainingStatus)
    assert result.version == 3 and [r.step for r in status.history] == [0, 1, 2]
    assert status.ledger_balanced and result.failed == 0 and result.trained == 24
    assert all(set(row["task_success"]) == {task.name} and row["train"]["tokens"] > 0 for row in rows)
