"""train_step with the torch backend under FSDP2 through the trainer worker's rank group: real rank processes.

The activity runs as the trainer worker runs it (`TrainerActivities` with a `RankGroup`), on the tiny model,
against the torch backend in one process on the same batch: the published weights agree. Checkpoints are
sharded by torch.distributed.checkpoint and resume at another world size: two steps on 2 ranks (each
checkpointed), then a third on 4 ranks, which resharded the model and AdamW's moments, and a fourth in one
FSDP rank; each publishes what the one-process trainer does. A LoRA step on 2 ranks publishes the adapter the
one-process LoRA trainer does (gathered and published by rank 0 alone).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from rollart.activities.trainer import TrainerActivities
from rollart.contracts.activities import SampleRef, TrainStepInput
from rollart.infra.store.payload import LocalStore
from rollart.spec.config import StoreConfig
from rollart.workers.trainer_ranks import RankGroup
from tests.support.batches import frozenlake_batch, load_model, max_published_diff, train_step_input

pytestmark = pytest.mark.integration  # real rank processes


@pytest.fixture
def setup(tiny_model: Path, tmp_path: Path) -> tuple[LocalStore, list[SampleRef]]:
    store = LocalStore(tmp_path / "store")
    return store, frozenlake_batch(store, load_model(tiny_model), AutoTokenizer.from_pretrained(tiny_model))


@pytest.fixture
def group(tmp_path: Path) -> Iterator[RankGroup]:
    g = RankGroup(store=StoreConfig(path=tmp_path / "store"))
    yield g
    g.close()


def step(model_dir: Path, run_dir: Path, n: int, samples: list[SampleRef], **trainer: object) -> TrainStepInput:
    """A step that checkpoints (the resumes below read them), with AdamW's eps at 1e-6."""
    return train_step_input(model_dir, run_dir, n, samples, eps=1e-6, checkpoint_every=1, **trainer)


async def test_fsdp_steps_publish_what_one_process_does_and_resume_at_other_world_sizes(
    tiny_model: Path, setup, group: RankGroup, tmp_path: Path
) -> None:
    store, samples = setup
    env = ActivityEnvironment()
    one = TrainerActivities(store)
    sharded = TrainerActivities(store, ranks=group)
    for n, ranks in enumerate([2, 2, 4, 1]):
        t = await env.run(one.train_step, step(tiny_model, tmp_path / "torch", n, samples))
        f = await env.run(sharded.train_step, step(tiny_model, tmp_path / "fsdp", n, samples, fsdp={"ranks": ranks}))
        assert (f.step, f.version, f.replayed) == (n, n + 1, False)
        assert group._spec is not None and group._spec.world_size == ranks  # a new launch at each world size
        diff = max_published_diff(store, t.weights_key, f.weights_key)
        assert diff < 1e-6, (n, diff)  # 5.7e-7 at every step and world size
        assert f.metrics["loss"] == pytest.approx(t.metrics["loss"], abs=1e-6)
    assert f.metrics["logprob_diff_behav"] > 1e-3  # later steps train on v0's data: the policy moved
    files = {p.name for p in (tmp_path / "fsdp" / "checkpoints" / "step-000002").iterdir()}  # written by 4 ranks
    assert files == {"meta.json", ".metadata", *(f"__{r}_0.distcp" for r in range(4))}


async def test_an_fsdp_lora_step_publishes_the_adapter_one_process_does(
    tiny_model: Path, setup, group: RankGroup, tmp_path: Path
) -> None:
    from safetensors.torch import load as st_load

    store, samples = setup
    env = ActivityEnvironment()
    lora = {"lora": {"rank": 4}, "lr": 0.01}
    t = await env.run(TrainerActivities(store).train_step, step(tiny_model, tmp_path / "torch", 0, samples, **lora))
    f = await env.run(
        TrainerActivities(store, ranks=group).train_step,
        step(tiny_model, tmp_path / "fsdp", 0, samples, fsdp={"ranks": 2}, **lora),
    )
    want, got = st_load(store.get(t.weights_key)), st_load(store.get(f.weights_key))
    assert set(got) == set(want) and any("lora_B" in k for k in got)
    # AdamW's first step is ~lr x sign(g): lr 0.01 turns summation-order noise of tiny gradients into ~5e-6
    assert max(float((want[k] - got[k]).abs().max()) for k in want) < 1e-5
    assert max(float(got[k].abs().max()) for k in got if "lora_B" in k) > 1e-3  # B moved from its zeros
