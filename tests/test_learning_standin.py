"""The learning stand-in (client/standin.py) computes what the trainer computes, only cheaper."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from bench.learning import bench_job
from rollart.activities.rl.action_entropy import ActionTerm, load_action_spaces
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.client.standin import SharedPromptPolicy, sample_groups, sequences, train


def test_one_forward_per_state_gives_the_trainers_loss_and_update(tiny_model: Path) -> None:
    """The same sampled batch through `TorchPolicy` and through the stand-in's policy, which runs the model once
    per distinct prompt: the same loss, entropy and log-prob metrics, and weights within float noise after the
    step's two PPO updates."""
    spec = bench_job("frozenlake", [f"model_dir={tiny_model}"], None)
    cfg = spec.trainer.over(spec.training.steps).with_task_envs(spec.tasks)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    actions = ActionTerm(load_action_spaces(str(tiny_model), cfg.task_envs), cfg.loss.action_bonus)
    cpu = torch.device("cpu")
    full, shared = TorchPolicy(tiny_model, cfg, cpu), SharedPromptPolicy(tiny_model, cfg, cpu)
    groups = sample_groups(full.model, tok, spec, groups=2, gen=torch.Generator().manual_seed(0), seed0=0)
    seqs = sequences(groups, cfg, spec.tasks[0].name)
    assert len(seqs) > 16  # many turns, at most 16 distinct prompts
    a, b = train(full, seqs, cfg, 0, actions), train(shared, seqs, cfg, 0, actions)
    for key in ("loss", "pg_loss", "entropy", "clip_frac"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    for (name, p), q in zip(full.model.named_parameters(), shared.model.parameters()):
        assert torch.allclose(p, q, atol=1e-4), name
