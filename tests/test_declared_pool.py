"""A pool added in YAML only: a generation pool named `l40s` serves a rollout on the local stack.

The session stack (control, cpu, h800, serverless, trainer) runs everything else; `rollart worker --pool l40s
--job JOB` is started beside it, as on a machine of that pool, and the task generates there. No code knows
the name: the worker learns its role from the job's declaration.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.infra.temporal.history import activity_spans
from rollart.spec.config import JobSpec
from rollart.workers.local_stack import LocalStack
from tests.support.paths import REPO
from tests.support.processes import wait_for_output
from tests.support.tasks import frozenlake_task

pytestmark = pytest.mark.integration

ROLLART = [sys.executable, "-m", "rollart.cli"]
L40S = {"l40s": {"role": "generation", "gpu": {"product": "NVIDIA-L40S", "count": 1}}}


async def test_a_declared_generation_pool_serves_a_rollout(
    stack: LocalStack, client: Client, stack_job: JobSpec, tmp_path: Path
) -> None:
    task = frozenlake_task(generate_pool="l40s", max_turns=3, env_args={"maps": "standard"})
    job = JobSpec.model_validate(
        {**stack_job.model_dump(), "name": "l40s", "pools": L40S, "tasks": [task.model_dump()]}
    )
    spec = tmp_path / "job.json"
    spec.write_text(job.model_dump_json())
    cmd = [*ROLLART, "worker", "--pool", "l40s", "--job", str(spec), "--temporal-address", stack.address]
    cmd += ["--engine", "hf"]  # a second vLLM engine beside the stack's would only cost start-up time here
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        ready = wait_for_output(proc, "ready: pool=l40s", 300)
        assert "queues=[l40s, l40s@l40s-" in ready, ready[-2000:]  # the pool's queue and its own (session affinity)

        job_id = f"l40s-{uuid.uuid4().hex[:6]}"
        outcomes = await run_rollout(client, plan_trajectories(job, 2, seed=5, job_id=job_id), job_id)
        assert [o.status for o in outcomes] == ["completed"] * 2, [o.result.error for o in outcomes if o.result]
        for o in outcomes:
            spans = activity_spans(await client.get_workflow_handle(o.workflow_id).fetch_history())
            generated = [a for a in spans if a.activity_type == "generate"]
            assert generated and generated[0].task_queue == "l40s", spans  # later turns: on the first one's worker
            assert all(a.task_queue == f"l40s@{generated[0].worker_identity}" for a in generated[1:]), spans
            assert all(a.worker_identity.startswith("l40s-") for a in generated), generated
            assert {a.pool for a in spans if a.activity_type == "reset"} == {"cpu"}  # the rest on the stack
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0  # drained and stopped on SIGTERM
