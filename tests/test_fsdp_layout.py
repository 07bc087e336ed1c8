"""`trainer.fsdp` outside the ranks: what the config accepts, how many ranks each place sizes the trainer by
(the rank agent, Kubernetes, `rollart worker --nnodes`), the lockstep fillers that keep FSDP ranks' forward
passes paired, and the checkpoint check (pure, no process group)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from rollart.activities.rl.batch import collate
from rollart.activities.rl.losses import policy_loss
from rollart.activities.training.fsdp_checkpoint import CheckpointMismatch, load_dcp
from rollart.activities.training.lockstep import filler, fillers, in_lockstep
from rollart.activities.training.ranks import OneProcess
from rollart.cli.errors import UserError
from rollart.cli.main import build_parser
from rollart.cli.worker import worker_settings
from rollart.infra.deploy.render import render
from rollart.spec.config import LossConfig, StoreConfig, TrainerConfig, load_job
from rollart.workers.rank_messages import LaunchSpec
from tests.support.k8s import EXAMPLES, container, workloads_by_pool


class _Lockstep(OneProcess):
    """A rank whose peers hold `most` micro-batches at most."""

    forward_in_lockstep = True

    def __init__(self, most: int) -> None:
        self.most = most

    def max_over_data(self, value: int) -> int:
        return max(value, self.most)


def test_fsdp_sets_the_trainers_ranks_and_refuses_megatron() -> None:
    assert TrainerConfig(fsdp={"ranks": 4}).ranks == 4
    assert TrainerConfig().ranks == 1
    assert TrainerConfig(backend="megatron", parallel={"tensor": 2, "data": 3}).ranks == 6
    with pytest.raises(ValidationError, match="drop fsdp or set backend: torch"):
        TrainerConfig(backend="megatron", fsdp={"ranks": 2})
    assert TrainerConfig(fsdp={"ranks": 2}, lora={}).lora is not None  # peft wraps, then FSDP shards


def _spec(**trainer: Any) -> LaunchSpec:
    return LaunchSpec(
        job_id="j",
        model_dir="m",
        run_dir="r",
        trainer=TrainerConfig(**trainer),
        store=StoreConfig(path="s"),
        keep_weight_versions=2,
        nnodes=1,
        rdzv="h:1",
    )


def test_the_rank_agent_launches_fsdp_ranks_and_relaunches_when_their_number_changes() -> None:
    two = _spec(fsdp={"ranks": 2})
    assert two.world_size == 2 and two.per_node == 2
    assert two.same_ranks(_spec(fsdp={"ranks": 2}, lr=0.5))  # a hyper-parameter: the same ranks go on
    assert not two.same_ranks(_spec(fsdp={"ranks": 4}))
    assert not two.same_ranks(_spec(fsdp={"ranks": 2, "reshard_after_forward": False}))


def test_kubernetes_gives_the_trainer_one_gpu_per_fsdp_rank() -> None:
    job = load_job(EXAMPLES["frozenlake"], {"trainer": {"fsdp": {"ranks": 4}, "device": "cuda"}})
    assert job.needs().trainer_world_size == 4
    trainer = workloads_by_pool(render(job))["trainer"]
    assert container(trainer)["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_a_rank_with_fewer_micro_batches_runs_fillers_up_to_the_most_any_rank_has() -> None:
    real = [collate([filler(3)], 3)]
    assert len(in_lockstep(_Lockstep(most=3), real, 3)) == 3
    assert fillers(_Lockstep(most=0), 0, 3) == []
    assert fillers(OneProcess(), 0, 3) == [] and fillers(None, 0, 3) == []


def test_a_filler_adds_nothing_to_the_loss_but_keeps_the_graph() -> None:
    mb = fillers(_Lockstep(most=1), 0, 0)[0]
    logits = torch.randn(1, 2, 7, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, :, 0]
    terms = policy_loss(
        logp,
        mb.behav_logprobs,
        mb.advantages,
        mb.completion_mask,
        LossConfig(kl_coef=0.1, entropy_coef=0.01),
        total_tokens=5,
        total_sequences=1,
        logp_prox=mb.prox_logprobs,
        logp_ref=logp.detach(),
        entropy=logp,
        bonus_weight=mb.bonus,
    )
    terms.loss.backward()  # every rank's backward is a collective too: it must run
    assert float(terms.loss.detach()) == 0.0 and all(v == 0.0 for v in terms.metrics.values())
    assert logits.grad is not None and float(logits.grad.abs().max()) == 0.0


def test_an_fsdp_trainer_refuses_another_backends_checkpoint_saying_which(tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    assert load_dcp(tmp_path, model, optimizer) is None  # no checkpoint: a fresh start
    (tmp_path / "step-000004").mkdir()
    (tmp_path / "step-000004" / "meta.json").write_text(json.dumps({"step": 4, "backend": "torch"}))
    with pytest.raises(CheckpointMismatch, match="written by the torch backend, not the torch backend with fsdp"):
        load_dcp(tmp_path, model, optimizer)


def test_a_trainer_worker_refuses_fsdp_ranks_that_do_not_split_over_its_nodes() -> None:
    job = load_job(EXAMPLES["frozenlake"], {"trainer": {"fsdp": {"ranks": 3}}})
    argv = ["worker", "--pool", "trainer", "--job", "job.yaml", "--nnodes", "2", "--node-rank", "0"]
    with pytest.raises(UserError, match=r"trainer\.fsdp ranks 3 = 3 ranks do not split over --nnodes 2"):
        worker_settings(build_parser().parse_args([*argv, "--rdzv", "h:29500"]), job)
