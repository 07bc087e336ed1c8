"""Packed vs padded micro-batches (`trainer.packing`): tokens/s of the trainer's forward+backward on an agentic batch.

The batch is shaped like the agentic examples: most sequences are one short turn (20–120 tokens), some are whole
20–30-turn trajectories (long-tailed up to 2,000 tokens) whose env messages are masked out of the loss. Each mode
runs `accumulate_gradients` (the trainer's forward and backward over every micro-batch, no optimizer step) of the
torch backend on the same weights and sequences: padded micro-batches of `micro_batch_size` sequences (the
default 64, and a small one that pads less), and packed ones of `max_tokens`, with the attention packing picks
on a CPU (`rollart_varlen_sdpa`: sdpa per sequence) and under a block-diagonal 4D mask (sdpa over all N² pairs).
Tokens/s counts real tokens (no padding); the loss of every mode is checked against the padded one's. Medians of
interleaved repeats; the ratio is to the default padded mode of the same run. `--hidden/--layers` trains a
bigger random Qwen2 (bench/trainer.py's).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import format_table, summarize, write_results

BASELINE = "padded 64"


def agentic_batch(n: int, vocab: int, seed: int = 0) -> list[dict]:
    """`n` sequences (`TrainSequence` fields): 75 % one short turn, 25 % a long trajectory (loss on its sampled
    turns only)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        trajectory = rng.random() >= 0.75
        if trajectory:
            length = min(2000, int(300 * rng.paretovariate(1.1)))
            prompt = rng.randint(20, 60)
        else:
            length = rng.randint(20, 120)
            prompt = length - rng.randint(1, 12)
        ids = [rng.randrange(vocab) for _ in range(length)]
        c = length - prompt
        turns = max(1, c // 40)  # alternating sampled (loss) and env (masked) spans
        mask = [1 if (i * turns // max(c, 1)) % 2 == 0 else 0 for i in range(c)]
        mask[0] = 1
        out.append(
            {
                "prompt_ids": ids[:prompt],
                "completion_ids": ids[prompt:],
                "behav_logprobs": [-4.0 + rng.random() for _ in range(c)],
                "advantage": rng.choice([-1.0, 0.5, 1.0]),
                "loss_mask": mask if trajectory else None,
            }
        )
    return out


def modes(max_tokens: int, small: int) -> dict[str, tuple[dict, str | None]]:
    """Each mode's trainer config and attention override: padded at the default and a small micro-batch size,
    packed with the attention packing picks (`rollart_varlen_sdpa` on CPUs) and under a 4D mask (sdpa)."""
    packing = {"packing": {"max_tokens": max_tokens}}
    return {
        BASELINE: ({"micro_batch_size": 64}, None),
        f"padded {small}": ({"micro_batch_size": small}, None),
        f"packed {max_tokens}": (packing, None),
        f"packed {max_tokens}, 4D mask": (packing, "sdpa"),
    }


def measure(
    model_dir: Path, seqs: list[dict], trainer: dict, device: str = "cpu", attention: str | None = None
) -> dict:
    """One repeat of a mode: the wall of the trainer's forward+backward over the batch (client.trainer_probe)."""
    from rollart.client.trainer_probe import forward_backward

    return forward_backward(model_dir, seqs, trainer, device, attention)


def main(argv: list[str]) -> int:
    from bench.trainer import build_model

    p = argparse.ArgumentParser(prog="python -m bench trainer_packing", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="24 sequences, 1 repeat")
    p.add_argument("--sequences", type=int, help="sequences in the batch (default 96; --quick 24)")
    p.add_argument("--repeats", type=int, help="repeats of every mode, interleaved (default 3; --quick 1)")
    p.add_argument("--max-tokens", type=int, default=2048, help="packing.max_tokens of the packed mode")
    p.add_argument("--small", type=int, default=8, help="micro_batch_size of the second padded mode")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    p.add_argument("--hidden", type=int, help="a bigger Qwen2 of this hidden size (heads of 64)")
    p.add_argument("--layers", type=int, help="layers of the bigger model")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    n = args.sequences or (24 if args.quick else 96)
    repeats = args.repeats or (1 if args.quick else 3)
    chosen = modes(args.max_tokens, args.small)
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-packing-"))
    runs: dict[str, list[dict]] = {m: [] for m in chosen}
    try:
        model_dir = build_model(home, args.hidden, args.layers)
        from transformers import AutoConfig

        seqs = agentic_batch(n, AutoConfig.from_pretrained(model_dir).vocab_size - 8)
        lengths = sorted(len(s["prompt_ids"]) + len(s["completion_ids"]) for s in seqs)
        print(f"{n} sequences, {sum(lengths)} tokens, median {lengths[n // 2]}, longest {lengths[-1]}", flush=True)
        for rep in range(repeats):
            for name, (trainer, attention) in chosen.items():
                row = measure(model_dir, seqs, trainer, attention=attention)
                runs[name].append(row)
                print(f"repeat {rep + 1}/{repeats} {name}: {row['wall_s']:.2f} s, {row['tokens_per_s']:.0f} tok/s")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    rows = summarize(runs, BASELINE)
    base_loss = rows[0]["loss"]
    for r in rows:
        r["loss_gap"] = abs(r["loss"] - base_loss)
    print(
        format_table(
            rows,
            [
                ("name", "mode", ""),
                ("tokens_per_s", "tokens/s", ".0f"),
                ("speedup_vs_baseline", f"vs {BASELINE}", ".2f"),
                ("wall_s", "fwd+bwd s", ".2f"),
                ("loss_gap", "|loss - padded|", ".1e"),
                ("attention", "attention", ""),
            ],
        )
    )
    bigger = args.hidden is not None or args.layers is not None
    name = f"trainer_packing-h{args.hidden or 'tiny'}-l{args.layers or 'tiny'}" if bigger else "trainer_packing"
    out = write_results(
        name,
        rows,
        sequences=n,
        tokens=sum(lengths),
        longest=lengths[-1],
        threads=args.threads,
        model_hidden=args.hidden,
        model_layers=args.layers,
        time=time.time(),
        baseline=BASELINE,
        median_length=statistics.median(lengths),
    )
    print(f"\nwritten {out}")
    return 0
