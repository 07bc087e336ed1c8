"""Trainer backends: step time and weight-publish time of torch vs megatron (T=1, T=2, D=2) on the same batches.

Each mode runs the `train_step` activity as the trainer worker does (megatron through the worker's
rank group: real rank processes on gloo here, NCCL on GPUs) for N steps of a FrozenLake-shaped
batch — 8 groups x 8 trajectories x 4 turns = 256 sequences of ~20 tokens, one sampled token each,
behaviour log-probs from the model itself — on the tiny model (or `--hidden/--layers` for a bigger
Qwen2 built locally). Per step: the activity's wall time, the step's own time (`train_s`: loss,
backward, optimizer, publish) and the publish alone (`publish_s`: the weights gathered from the ranks,
converted to one HF safetensors blob and written to the store). The first step is left
out of the medians (it starts the ranks and loads the model); it is reported as `first_step_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import RESULTS, format_table, plot_modes, write_results

MODES = {
    "torch": {},
    "megatron T=1": {"backend": "megatron"},
    "megatron T=2": {"backend": "megatron", "parallel": {"tensor": 2}},
    "megatron D=2": {"backend": "megatron", "parallel": {"data": 2}},
}
BASELINE = "torch"


def build_model(home: Path, hidden: int | None, layers: int | None) -> Path:
    """The tiny model, or a bigger random Qwen2 of the same family and tokenizer."""
    from rollart.infra.tiny_model import ensure_tiny_model

    tiny = ensure_tiny_model(RESULTS.parent.parent / ".rollart" / "models" / "tiny")
    if hidden is None and layers is None:
        return tiny
    import json

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = home / "model"
    cfg = json.loads((tiny / "config.json").read_text())
    hidden = hidden or cfg["hidden_size"]
    cfg.update(
        hidden_size=hidden,
        num_hidden_layers=layers or cfg["num_hidden_layers"],
        intermediate_size=4 * hidden,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(
        Qwen2Config(
            **{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "layer_types")}
        )
    ).save_pretrained(out)
    for f in tiny.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return out


def frozenlake_batch(store, model_dir: Path, seed: int = 0, groups: int = 8, members: int = 8) -> list:
    """SampleRefs of `groups` x `members` four-turn trajectories whose turn records hold one token sampled from the
    model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollart.contracts.activities import SampleRef, turn_key
    from rollart.contracts.store import StoredCompletion, StoredTurn

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    grid = ["SFFF", "FHFH", "FFFH", "HFFG"]
    samples = []
    for g in range(groups):
        for m in range(members):
            keys, agent = [], rng.randrange(16)
            for turn in range(4):
                rows = [
                    "".join("A" if r * 4 + c == agent else ch for c, ch in enumerate(row)) for r, row in enumerate(grid)
                ]
                ids = tok("\n".join(rows) + "\nmove:", add_special_tokens=False)["input_ids"]
                with torch.no_grad():
                    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
                t = int(torch.multinomial(logp.exp(), 1, generator=gen))
                key = turn_key("bench", f"g{g}-{m}", turn)
                sampled = StoredCompletion(token_ids=[t], logprobs=[float(logp[t])], finish_reason="length")
                store.put(key, StoredTurn(prompt_ids=ids, completions=[sampled]).to_bytes())
                keys.append(key)
                agent = rng.randrange(16)
            reward = float(rng.random() < 0.3)
            samples.append(
                SampleRef(
                    trajectory_id=f"g{g}-{m}",
                    task="frozenlake",
                    group_id=f"g{g}",
                    reward=reward,
                    success=reward > 0,
                    turn_keys=keys,
                    policy_version_min=0,
                    policy_version_max=0,
                )
            )
    return samples


async def run_mode(
    name: str,
    trainer: dict,
    model_dir: Path,
    samples: list,
    steps: int,
    store_dir: Path,
    run_root: Path,
    weights: dict | None = None,
) -> dict:
    """`steps` train steps of one mode through the trainer worker's code; medians after the first step."""
    from rollart.client.local import LocalTrainer
    from rollart.contracts.activities import TrainStepInput
    from rollart.infra.store.payload import LocalStore
    from rollart.spec.config import StoreConfig, TrainerConfig, WeightsConfig
    from rollart.workers.trainer_ranks import RankGroup

    job = name.replace(" ", "-").replace("=", "")
    on_ranks = trainer.get("backend") == "megatron" or trainer.get("fsdp") is not None
    group = RankGroup(store=StoreConfig(path=store_dir)) if on_ranks else None
    local = LocalTrainer(LocalStore(store_dir), ranks=group)
    walls, train, publish, peak = [], [], [], []
    try:
        for n in range(steps):
            inp = TrainStepInput(
                job_id=job,
                step=n,
                samples=samples,
                model_dir=str(model_dir),
                run_dir=str(run_root / job),
                trainer=TrainerConfig(**trainer, checkpoint_every=10_000),
                weights=WeightsConfig(**(weights or {})),
            )
            t0 = time.perf_counter()
            r = await local.step(inp)
            walls.append(time.perf_counter() - t0)
            train.append(r.metrics["train_s"])
            publish.append(r.metrics["publish_s"])
            peak.append(r.metrics.get("publish_peak_mb", 0.0))
            print(f"  {name} step {n}: {walls[-1]:.2f} s", flush=True)
    finally:
        if group is not None:
            group.close()
    return {
        "wall_s": statistics.median(walls[1:]),
        "train_s": statistics.median(train[1:]),
        "publish_s": statistics.median(publish[1:]),
        "publish_peak_mb": max(peak[1:]),
        "first_step_s": walls[0],
        "sequences": float(r.metrics["sequences"]),
        "tokens": r.metrics["tokens"],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench trainer", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 steps per mode, 1 repeat")
    p.add_argument("--steps", type=int, help="steps per mode and repeat (default 8; --quick 4)")
    p.add_argument("--repeats", type=int, help="repeats of every mode, interleaved (default 3; --quick 1)")
    p.add_argument("--modes", help=f"comma-separated subset of: {', '.join(MODES)}")
    p.add_argument(
        "--hidden", type=int, help="a bigger Qwen2 of this hidden size (heads of 64) instead of the tiny model"
    )
    p.add_argument("--layers", type=int, help="layers of the bigger model")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    steps = args.steps or (4 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 3)
    modes = args.modes.split(",") if args.modes else list(MODES)
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-trainer-"))
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        from rollart.infra.store.payload import LocalStore

        model_dir = build_model(home, args.hidden, args.layers)
        samples = frozenlake_batch(LocalStore(home / "store"), model_dir)
        for rep in range(repeats):
            for mode in modes:
                row = asyncio.run(
                    run_mode(mode, MODES[mode], model_dir, samples, steps, home / "store", home / f"r{rep}")
                )
                print(
                    f"repeat {rep + 1}/{repeats} {mode}: step {row['wall_s']:.3f} s (train {row['train_s']:.3f}, "
                    f"publish {row['publish_s']:.3f}), first step {row['first_step_s']:.1f} s",
                    flush=True,
                )
                runs[mode].append(row)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    from bench.report import summarize

    rows = summarize(runs, BASELINE if BASELINE in modes else modes[0])
    for r in rows:
        r["publish_vs_baseline"] = rows[0]["publish_s"] / r["publish_s"] if r["publish_s"] else float("nan")
    print(
        f"\ntrain_step on {rows[0]['sequences']:.0f} sequences / {rows[0]['tokens']:.0f} loss tokens, "
        f"{steps} steps x {repeats} repeats (medians; the first step of each run left out):"
    )
    print(
        format_table(
            rows,
            [
                ("name", "mode", ""),
                ("wall_s", "step s", ".3f"),
                ("speedup_vs_baseline", "vs torch", ".2f"),
                ("train_s", "train s", ".3f"),
                ("publish_s", "publish s", ".4f"),
                ("publish_vs_baseline", "publish vs torch", ".2f"),
                ("first_step_s", "first step s", ".1f"),
            ],
        )
    )
    # the tiny model's file, or one per bigger model, so that each docs table (python -m bench tables) has its own
    bigger = args.hidden is not None or args.layers is not None
    name = f"trainer-h{args.hidden or 'tiny'}-l{args.layers or 'tiny'}" if bigger else "trainer"
    out = write_results(name, rows, steps=steps, model_hidden=args.hidden, time=time.time(), baseline=BASELINE)
    png = plot_modes(
        name,
        rows,
        "train_step: torch vs megatron (median step wall)",
        extra_key="publish_s",
        extra_label="publish s (median)",
    )
    print(f"\nwritten {out}, {png}")
    return 0
