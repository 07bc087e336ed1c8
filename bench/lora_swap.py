"""LoRA swap: publish → pull → serve → first request on a new policy version, the adapter against the full weights.

For the tiny model, a ~40M random-init Qwen2 (weight_sync's) and `--models 0.5B` (bench size's Qwen3), each
version is published through the local store the way the trainer publishes it and taken up by a running vLLM engine
the way a generation worker does:

- full: the float32 weights in buckets and a manifest (the trainer's publish), the manifest read (`pull`), streamed
  into the plain engine in place (`swap`: pause, `reload_weights` from the store's buckets, prefix cache reset,
  resume);
- lora: the adapter alone in peft's layout (`publish_adapter`, rank `--rank` on every linear layer), pulled to a
  directory, served by an engine built with `max_lora_rank` through `add_lora` (no pause, no reload).

Each row is the median of `--repeats` versions after one warm-up version; `tok/s after` is a batch of 16 requests
(n=4, 32 tokens) on the last version, what the LoRA layers cost generation. Writes bench/results/lora_swap.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import RESULTS, format_table, write_results
from bench.size import build_qwen3
from bench.weight_sync import build_model

__all__ = ["main", "swap_rows"]

PARTS = ("publish", "pull", "swap", "first_request", "total")


async def _measure(kind: str, label: str, model_dir: Path, repeats: int, rank: int, home: Path) -> dict:
    """One (model, kind) row: the median time of each part over `repeats` new versions."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollart.client.in_process import started_engine
    from rollart.client.local import adapter_files, lora_model, publish_model
    from rollart.infra.store.adapters import fetch_adapter, publish_adapter
    from rollart.infra.store.payload import LocalStore
    from rollart.infra.store.weights import WeightsSource, latest_weights, read_manifest
    from rollart.spec.config import EngineConfig, LoraConfig, SamplingParams

    store, job = LocalStore(home / f"store-{label}-{kind}"), f"swap-{label}"
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = sum(p.numel() for p in trainer.parameters())
    lora = kind == "lora"
    if lora:
        trainer = lora_model(trainer, LoraConfig(rank=rank, alpha=2 * rank))
    trained = [p for p in trainer.parameters() if p.requires_grad]
    config = EngineConfig(kind="vllm", max_model_len=128, max_lora_rank=rank if lora else None)
    sampling = SamplingParams(max_tokens=2)
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    size = 0
    async with started_engine(model_dir, config) as engine:
        for version in range(1, repeats + 2):
            with torch.no_grad():
                for p in trained:
                    p.add_(1e-4)
            t0 = time.perf_counter()
            if lora:  # what the trainer's publish does: serialise, then put
                files = adapter_files(trainer)
                size = sum(len(b) for b in files.values())
                publish_adapter(store, job, version, files)
            else:
                size = publish_model(store, job, version, trainer).manifest.nbytes
            t1 = time.perf_counter()
            if lora:
                ref, path = fetch_adapter(store, job, home / "pulled")
            else:  # what a generation worker reads before it streams the buckets in
                ref = latest_weights(store, job)
                source = WeightsSource(store=store.config, manifest=read_manifest(store, ref.key))
            t2 = time.perf_counter()
            if lora:
                await engine.load_adapter(path, ref.version, owned=True)
            else:
                await engine.load_weights(source, ref.version)
            t3 = time.perf_counter()
            out = await engine.generate("move:", sampling, f"swap-{kind}-{version}")
            t4 = time.perf_counter()
            if out.policy_version != version:
                raise RuntimeError(f"served v{out.policy_version}, expected v{version}")
            if version > 1:  # the first version is the warm-up
                for k, v in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                    parts[k].append(v)
        # what serving with LoRA layers costs: a batch of requests on the last version
        batch = SamplingParams(temperature=1.0, top_k=0, max_tokens=32, n=4)
        before, t0 = engine.tokens_generated(), time.perf_counter()
        await asyncio.gather(*(engine.generate("move:", batch, f"tput-{kind}-{i}") for i in range(16)))
        tokens_per_s = (engine.tokens_generated() - before) / (time.perf_counter() - t0)
    row = {"model": label, "kind": kind, "params": params, "trained": sum(p.numel() for p in trained), "bytes": size}
    row.update({f"{k}_s": statistics.median(v) for k, v in parts.items()}, repeats=repeats)
    row["tokens_per_s"] = tokens_per_s
    print(f"  {label:>5} {kind:<5} {size / 1e6:8.2f} MB  total {row['total_s']:.3f} s", flush=True)
    return row


async def swap_rows(models: dict[str, Path], repeats: int, rank: int, home: Path) -> list[dict]:
    """Full and LoRA swaps for each model, one engine at a time."""
    return [
        await _measure(kind, label, model_dir, repeats, rank, home)
        for label, model_dir in models.items()
        for kind in ("full", "lora")
    ]


COLUMNS = [
    ("model", "model", ""),
    ("kind", "published", ""),
    ("trained", "trained params", ",.0f"),
    ("mb", "MB", ".2f"),
    ("publish_s", "publish s", ".4f"),
    ("pull_s", "pull s", ".4f"),
    ("swap_s", "swap s", ".4f"),
    ("first_request_s", "request s", ".4f"),
    ("total_s", "total s", ".4f"),
    ("tokens_per_s", "tok/s after", ".0f"),
]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench lora_swap", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="versions measured per row (default 5)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (default 16)")
    p.add_argument("--quick", action="store_true", help="the tiny model only, 3 repeats")
    p.add_argument("--models", default="tiny,40M", help="comma-separated: tiny, 40M, 0.5B (bench size's Qwen3)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rollart.infra.tiny_model import ensure_tiny_model

    tiny = ensure_tiny_model(RESULTS.parent.parent / ".rollart" / "models" / "tiny")
    wanted = ["tiny"] if args.quick else args.models.split(",")
    builders = {
        "tiny": lambda: tiny,
        "40M": lambda: build_model(RESULTS / "models" / "qwen2-40m", tiny, hidden=512, layers=12, inter=1792),
        "0.5B": lambda: build_qwen3("0.5B", "float32"),
    }
    models = {name: builders[name]() for name in wanted}
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-lora-"))
    try:
        rows = asyncio.run(swap_rows(models, 3 if args.quick else args.repeats, args.rank, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for r in rows:
        r["mb"] = r["bytes"] / 1e6
    print(f"\nnew policy version on vLLM, local store (median of {rows[0]['repeats']}), LoRA rank {args.rank}")
    print(format_table(rows, COLUMNS))
    modes = [{"name": f"{r['model']} {r['kind']}", "wall_s": r["total_s"], **r} for r in rows]
    for m in modes:
        full = next(f["total_s"] for f in modes if f["model"] == m["model"] and f["kind"] == "full")
        m["speedup_vs_baseline"] = full / m["total_s"] if m["total_s"] > 0 else None
    print(f"\n  written: {write_results('lora_swap', modes, rank=args.rank, time=time.time(), baseline='full')}")
    return 0
