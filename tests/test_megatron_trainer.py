"""train_step with the megatron backend through the trainer worker's rank group: real rank processes on gloo.

The activity runs as the trainer worker runs it (`TrainerActivities` with a `RankGroup`), on the
tiny model, against the torch backend on the same batch: the published weights agree within 1e-5
(AdamW eps 1e-6). Then what the rank group is for: a SIGKILLed rank fails the step with a
retryable error and the retry resumes from the sharded checkpoint exactly; two "nodes" (two agents
on loopback) run one job; a job asking for a GPU this machine lacks fails without retries.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from rollart.activities.trainer import TrainerActivities, step_record_path
from rollart.contracts.activities import SampleRef
from rollart.infra.local.devserver import free_port
from rollart.infra.store.payload import LocalStore
from rollart.spec.config import StoreConfig
from rollart.workers.trainer_ranks import RankGroup
from tests.support.batches import frozenlake_batch, load_model, max_published_diff, train_step_input

pytestmark = pytest.mark.integration  # real rank processes

MEGATRON_T2 = {"backend": "megatron", "parallel": {"tensor": 2}, "eps": 1e-6, "checkpoint_every": 1}


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def setup(tiny_model: Path, tok, tmp_path: Path) -> tuple[LocalStore, list[SampleRef]]:
    store = LocalStore(tmp_path / "store")
    return store, frozenlake_batch(store, load_model(tiny_model), tok)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[RankGroup]:
    g = RankGroup(store=StoreConfig(path=tmp_path / "store"))
    yield g
    g.close()


step = train_step_input


async def test_megatron_steps_publish_what_the_torch_backend_publishes(
    tiny_model: Path, setup, group: RankGroup, tmp_path: Path
) -> None:
    store, samples = setup
    env = ActivityEnvironment()
    torch_acts = TrainerActivities(store)
    meg_acts = TrainerActivities(store, ranks=group)
    for n in range(2):
        t = await env.run(torch_acts.train_step, step(tiny_model, tmp_path / "torch", n, samples, eps=1e-6))
        m = await env.run(meg_acts.train_step, step(tiny_model, tmp_path / "meg", n, samples, **MEGATRON_T2))
        assert (m.step, m.version, m.replayed) == (n, n + 1, False)
        assert max_published_diff(store, t.weights_key, m.weights_key) < 1e-5
        assert m.metrics["loss"] == pytest.approx(t.metrics["loss"], abs=1e-6)
    assert m.metrics["logprob_diff_behav"] > 1e-3  # step 1 trains on v0's data: the policy moved
    again = await env.run(meg_acts.train_step, step(tiny_model, tmp_path / "meg", 1, samples, **MEGATRON_T2))
    assert again.replayed and again.weights_key == m.weights_key
    shards = sorted(p.name for p in (tmp_path / "meg" / "checkpoints" / "step-000001").iterdir())
    assert shards == ["meta.json", "model-tp00.pt", "model-tp01.pt", "optim-tp00.pt", "optim-tp01.pt"]


async def test_the_trust_region_halves_an_update_alike_on_both_backends(
    tiny_model: Path, setup, group: RankGroup, tmp_path: Path
) -> None:
    """`trainer.max_logprob_change` on megatron's tensor-parallel ranks: a first AdamW step at lr 0.002 moves the
    tiny model's log-probs past 0.2 nats; both backends halve it the same number of times and publish the
    same weights (every rank measures the change through the vocabulary-parallel log-probs and decides alike)."""
    store, samples = setup
    env = ActivityEnvironment()
    limit = {"lr": 0.002, "max_logprob_change": 0.2}
    t = await env.run(
        TrainerActivities(store).train_step, step(tiny_model, tmp_path / "torch-tr", 0, samples, eps=1e-6, **limit)
    )
    m = await env.run(
        TrainerActivities(store, ranks=group).train_step,
        step(tiny_model, tmp_path / "meg-tr", 0, samples, **{**MEGATRON_T2, **limit}),
    )
    assert t.metrics["update_shrinks"] >= 1 and m.metrics["update_shrinks"] == t.metrics["update_shrinks"]
    assert t.metrics["logprob_change"] <= 0.2
    assert m.metrics["logprob_change"] == pytest.approx(t.metrics["logprob_change"], abs=1e-4)
    assert max_published_diff(store, t.weights_key, m.weights_key) < 1e-5


@pytest.mark.chaos  # kills a rank
async def test_a_killed_rank_fails_the_step_and_the_retry_resumes_exactly(
    tiny_model: Path, setup, group: RankGroup, tmp_path: Path
) -> None:
    store, samples = setup
    env = ActivityEnvironment()
    acts = TrainerActivities(store, ranks=group)
    ref = TrainerActivities(store)
    run = tmp_path / "meg"
    await env.run(acts.train_step, step(tiny_model, run, 0, samples, **MEGATRON_T2))
    first = group._procs[1].pid
    group._procs[1].send_signal(signal.SIGKILL)
    group._procs[1].wait()
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.train_step, step(tiny_model, run, 1, samples, **MEGATRON_T2))
    assert err.value.type == "TrainerRankFailed" and not err.value.non_retryable
    assert f"pid {first}" in err.value.message and "restart from the last checkpoint" in err.value.message
    assert not step_record_path(run, 1).exists()  # the step did not happen

    retried = await env.run(acts.train_step, step(tiny_model, run, 1, samples, **MEGATRON_T2))  # fresh ranks
    assert retried.step == 1 and not retried.replayed and group._procs[1].pid != first
    for n in range(2):  # the same two steps without a failure, on the torch backend
        want = await env.run(ref.train_step, step(tiny_model, tmp_path / "torch", n, samples, eps=1e-6))
    assert max_published_diff(store, want.weights_key, retried.weights_key) < 1e-5


async def test_two_nodes_run_one_job_and_a_gpu_the_machine_lacks_is_not_retried(
    tiny_model: Path, setup, tmp_path: Path
) -> None:
    store, samples = setup
    rdzv = f"127.0.0.1:{free_port()}"
    cfg = StoreConfig(path=tmp_path / "store")
    node0 = RankGroup(nnodes=2, node_rank=0, rdzv=rdzv, store=cfg)
    node1 = RankGroup(nnodes=2, node_rank=1, rdzv=rdzv, store=cfg)
    follower = threading.Thread(target=node1.follow, daemon=True)
    follower.start()
    try:
        acts = TrainerActivities(store, ranks=node0)
        env = ActivityEnvironment()
        r = await env.run(acts.train_step, step(tiny_model, tmp_path / "two", 0, samples, **MEGATRON_T2))
        assert r.version == 1 and len(node0._procs) == 1 and len(node1._procs) == 1  # rank 0 here, rank 1 there
        if not torch.cuda.is_available():
            with pytest.raises(ApplicationError) as err:
                await env.run(
                    acts.train_step,
                    step(
                        tiny_model,
                        tmp_path / "gpu",
                        0,
                        samples,
                        device="cuda",
                        backend="megatron",
                        parallel={"tensor": 2},
                    ),
                )
            assert err.value.non_retryable and "sees no GPU" in err.value.message
    finally:
        node1.close()
        node0.close()
        follower.join(timeout=30)
    assert not follower.is_alive() and not node1._procs
