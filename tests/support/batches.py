"""A training batch as `generate` would have stored it: the tiny model's own samples and logprobs, in groups."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rollart.client.local import published_tensors
from rollart.contracts.activities import SampleRef, TrainStepInput, turn_key
from rollart.infra.store.payload import LocalStore
from rollart.spec.config import TrainerConfig

__all__ = [
    "JOB",
    "PROMPTS",
    "frozenlake_batch",
    "load_model",
    "max_published_diff",
    "sample_record",
    "train_step_input",
]

JOB = "job"
PROMPTS = ["SFFF\nFHFH\nFFFH\nHFFG\nmove:", "SAFF\nFHFH\nFFFH\nHFFG\nmove:", "SFFF\nAHFH\nFFFH\nHFFG\nmove:"]


def load_model(model_dir: Path) -> torch.nn.Module:
    """The tiny model as the trainer loads it (float32, eval mode)."""
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def sample_record(model: torch.nn.Module, prompt_ids: list[int], n: int, max_tokens: int, gen: torch.Generator) -> dict:
    """What `generate` would store: n sampled completions with their behaviour logprobs (raw log-softmax)."""
    completions = []
    for _ in range(n):
        ids: list[int] = []
        lps: list[float] = []
        for _ in range(max_tokens):
            logp = torch.log_softmax(model(torch.tensor([prompt_ids + ids])).logits[0, -1], -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            lps.append(float(logp[tok]))
        completions.append({"text": "", "token_ids": ids, "logprobs": lps, "finish_reason": "length"})
    return {
        "prompt": "",
        "prompt_ids": prompt_ids,
        "policy_version": 0,
        "policy_version_end": 0,
        "completions": completions,
    }


def frozenlake_batch(store: LocalStore, model: torch.nn.Module, tok, *, seed: int = 0) -> list[SampleRef]:
    """16 samples in 4 groups of 4 (n=4 completions per record), one of them a two-turn trajectory."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for g in range(4):
        prompt_ids = tok(PROMPTS[g % len(PROMPTS)], add_special_tokens=False)["input_ids"]
        key = turn_key(JOB, f"g{g}", 0)
        store.put_json(key, sample_record(model, prompt_ids, 4, 2, gen))
        for i in range(4):
            keys = [key]
            if g == 0 and i == 0:  # a second turn for one trajectory
                keys.append(turn_key(JOB, "g0-0", 1))
                store.put_json(keys[1], sample_record(model, prompt_ids, 1, 2, gen))
            reward = float(rng.random() < 0.5)
            samples.append(
                SampleRef(
                    trajectory_id=f"g{g}-{i}",
                    task="frozenlake",
                    group_id=f"g{g}",
                    reward=reward,
                    success=reward > 0,
                    turn_keys=keys,
                    policy_version_min=0,
                    policy_version_max=0,
                    completion_index=i if len(keys) == 1 else 0,
                )
            )
    return samples


def train_step_input(
    model_dir: Path, run_dir: Path, n: int, samples: list[SampleRef], **trainer: object
) -> TrainStepInput:
    """Step `n` of the job whose run dir is `run_dir` (its name is the job id), with `trainer`'s settings."""
    return TrainStepInput(
        job_id=run_dir.name,
        step=n,
        samples=samples,
        model_dir=str(model_dir),
        run_dir=str(run_dir),
        trainer=TrainerConfig(**trainer),
    )


def max_published_diff(store: LocalStore, key_a: str, key_b: str) -> float:
    """The largest difference between two published weight versions (which must hold the same tensors)."""
    a, b = published_tensors(store, key_a), published_tensors(store, key_b)
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)
