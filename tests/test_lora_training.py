"""A `trainer.lora` job trained through the local stack: every step publishes an adapter, never full weights,
and the generation worker started from the job's spec serves each version on its base weights.

The session stack runs the rest (its trainer takes the job's trainer section with each step); the job's
generation goes to a pool of its own, `lora`, whose worker is started from the job's spec as `rollart worker`
would be on a machine of that pool (with the HF engine: the vLLM path is tests/test_lora_serving.py's).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

from rollart.infra.store.adapters import latest_adapter
from rollart.infra.store.payload import LocalStore
from rollart.infra.store.weights import latest_weights
from rollart.spec.config import JobSpec
from rollart.workers.local_stack import LocalStack
from tests.support.paths import REPO
from tests.support.processes import wait_for_output
from tests.support.training_runs import run_job

pytestmark = pytest.mark.integration

ROLLART = [sys.executable, "-m", "rollart.cli"]


async def test_a_lora_job_trains_and_serves_adapters_through_the_stack(
    stack: LocalStack, client: Client, stack_job: JobSpec, tmp_path: Path
) -> None:
    job = JobSpec.model_validate(
        {
            **stack_job.model_dump(),
            "name": "lora",
            "pools": {"lora": {"role": "generation"}},
            "trainer": {"lora": {"rank": 8, "alpha": 16}, "lr": 0.01},
        }
    )
    assert job.engine.max_lora_rank == 8  # the workers' engines follow trainer.lora
    spec = tmp_path / "job.json"
    spec.write_text(job.model_dump_json())
    cmd = [*ROLLART, "worker", "--pool", "lora", "--job", str(spec), "--temporal-address", stack.address]
    proc = subprocess.Popen(
        [*cmd, "--engine", "hf"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    try:
        wait_for_output(proc, "ready: pool=lora", 300)
        run, result, status, _ = await run_job(
            client, job, tmp_path, "group", task={"generate_pool": "lora", "reward": "progress"}, async_bound=0
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert result.version == 3 and [r.step for r in status.history] == [0, 1, 2]
    store = LocalStore(stack_job.store.path)
    assert latest_adapter(store, run.name).version == 3
    assert latest_weights(store, run.name) is None  # no full weights were ever published
    for r in status.history:
        assert r.staleness_max == 0
        # sampled by the worker with the adapter of the version the trainer held: the same logprobs
        assert r.train["logprob_diff_behav"] < 1e-4, r.train
    assert any(r.train["grad_norm"] > 0 for r in status.history)
