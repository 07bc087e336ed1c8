"""`python -m bench size`: rollart at the largest models this machine holds, random-init Qwen3 built locally.

Four measurements, each printed as a table and written to bench/results/size.json:

1. **swap**: publish → first request on the new version, on a running vLLM engine, for the streamed path
   (buckets in the engine's dtype, streamed into the engine) against the limit of a plain memory copy of
   the same bytes, measured in the same run; at the smaller size also against the path main had before it
   (the whole model gathered as one float32 safetensors blob, put, pulled to a file, reloaded from it),
   which needs two float32 copies of the model in memory and so does not fit beside a 1.5B engine here.
   The publisher's peak memory above its own is reported for both.
2. **fixed**: the same on the tiny model, where the fixed cost of a swap is all there is: medians of many
   swaps, and a request without a swap for reference.
3. **train**: a train step of the ~0.5B model, torch against megatron T=2 (real rank processes on gloo),
   with its publish time and the leader rank's peak memory during the publish.
4. **lora**: (with `trainer.lora`) adapter publish + swap against the full weights' (see docs).

Models: Qwen3 (qk-norm, head dim 128, GQA 16/8), the tiny model's byte-level tokenizer (vocab 400), so
almost every parameter is in the decoder layers; built once into `.rollart/bench-models/`. bf16 where
the CPU has AVX512-BF16 (vLLM's CPU backend computes in it), float32 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import RESULTS, format_table, write_results

SIZES: dict[str, dict[str, int]] = {
    "40M": {"hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8},
    "0.5B": {"hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 3072, "num_attention_heads": 16},
    "1.5B": {"hidden_size": 2048, "num_hidden_layers": 28, "intermediate_size": 6144, "num_attention_heads": 16},
}
"""Qwen3-0.6B's and Qwen3-1.7B's shapes (their vocabulary aside), and a small one for --quick."""

MODELS = RESULTS.parent.parent / ".rollart" / "bench-models"


def cpu_dtype() -> str:
    """bf16 where the CPU computes in it natively (AVX512-BF16), else float32."""
    try:
        return "bfloat16" if "avx512_bf16" in Path("/proc/cpuinfo").read_text() else "float32"
    except OSError:
        return "float32"


def build_qwen3(size: str, dtype: str) -> Path:
    """A random-init Qwen3 of `size` in `dtype` with the tiny model's tokenizer, built once (atomically)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rollart.infra.tiny_model import ensure_tiny_model

    out = MODELS / f"qwen3-{size}-{dtype}"
    if (out / "config.json").is_file():
        return out
    tiny = ensure_tiny_model(RESULTS.parent.parent / ".rollart" / "models" / "tiny")
    tiny_cfg = json.loads((tiny / "config.json").read_text())
    shape = SIZES[size]
    cfg = Qwen3Config(
        vocab_size=tiny_cfg["vocab_size"],
        num_key_value_heads=shape["num_attention_heads"] // 2,
        head_dim=128,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=tiny_cfg.get("bos_token_id"),
        eos_token_id=tiny_cfg.get("eos_token_id"),
        pad_token_id=tiny_cfg.get("pad_token_id"),
        **shape,
    )
    torch.manual_seed(0)
    print(f"building a random-init Qwen3 {size} in {dtype} into {out} ...", flush=True)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    MODELS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=MODELS))
    model.save_pretrained(tmp)
    for f in tiny.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "vocab.json", "merges.txt"):
            shutil.copy(f, tmp / f.name)
    os.replace(tmp, out)
    return out


def _params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _tensors(model: Any) -> dict[str, Any]:
    """Each tensor once (a tied head left out), as the trainer publishes them."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out[name] = t
    return out


def memcpy_s(model: Any, repeats: int = 3) -> tuple[float, int]:
    """The limit: copying the model's bytes once into a buffer of their size (median of `repeats`)."""
    import torch

    tensors = list(_tensors(model).values())
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        at = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            dst[at : at + n].copy_(t.reshape(-1).view(torch.uint8))
            at += n
        times.append(time.perf_counter() - t0)
    return statistics.median(times), nbytes


async def swap_rows(
    size: str, dtype: str, repeats: int, home: Path, with_blob: bool, store_dir: Path | None = None
) -> list[dict]:
    """The streamed path (and, if asked, main's earlier blob path) against a memory copy, on one running engine;
    the store in `store_dir` (default: under `home`, on disk)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollart.client.in_process import started_engine
    from rollart.client.local import publish_model
    from rollart.infra.memory import PeakRss
    from rollart.infra.store.payload import LocalStore
    from rollart.spec.config import EngineConfig, SamplingParams, WeightsConfig

    model_dir = build_qwen3(size, dtype)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    params = _params(trainer)
    copy_s, nbytes = memcpy_s(trainer)
    print(
        f"{size}: {params / 1e9:.2f}B parameters, {nbytes / 1e9:.2f} GB in {dtype}; memcpy {copy_s:.3f} s", flush=True
    )
    store = LocalStore(store_dir or home / "store")
    medium = _medium(store.root)
    sampling = SamplingParams(max_tokens=1)
    rows = [
        {
            "size": size,
            "path": "memcpy",
            "store": "",
            "dtype": dtype,
            "params": params,
            "bytes": nbytes,
            "total_s": copy_s,
        }
    ]
    engine_cfg = EngineConfig(dtype=dtype, max_model_len=256, max_num_seqs=8, kv_cache_gib=1)
    async with started_engine(model_dir, engine_cfg) as engine:
        version = 0
        paths = ["stream", "blob"] if with_blob else ["stream"]
        parts: dict[str, dict[str, list[float]]] = {p: {"publish": [], "load": [], "request": []} for p in paths}
        peaks: dict[str, list[float]] = {p: [] for p in paths}
        for r in range(repeats + 1):
            for path in paths:
                with torch.no_grad():
                    next(iter(_tensors(trainer).values())).add_(1e-3)  # a new version (the rest need not change)
                version += 1
                with PeakRss() as peak:
                    t0 = time.perf_counter()
                    if path == "stream":
                        source = publish_model(store, "size", version, trainer, WeightsConfig(dtype=dtype))
                    else:
                        blob_dir = _publish_blob(store, trainer, version, home)
                    t1 = time.perf_counter()
                if path == "stream":
                    await engine.load_weights(source, version)
                else:
                    await _reload_from_file(engine, blob_dir, version)
                t2 = time.perf_counter()
                out = await engine.generate("SFFF\nmove:", sampling, f"{path}-{version}")
                t3 = time.perf_counter()
                if out.policy_version != version:
                    raise RuntimeError(f"served v{out.policy_version}, expected v{version}")
                if r:  # the first round warms both paths up
                    for k, v in zip(("publish", "load", "request"), (t1 - t0, t2 - t1, t3 - t2)):
                        parts[path][k].append(v)
                    peaks[path].append(peak.extra_bytes / 1e6)
                print(
                    f"  {path} v{version}: publish {t1 - t0:.3f} load {t2 - t1:.3f} request {t3 - t2:.3f}", flush=True
                )
        for path in paths:
            med = {f"{k}_s": statistics.median(v) for k, v in parts[path].items()}
            total = med["publish_s"] + med["load_s"] + med["request_s"]
            rows.append(
                {
                    "size": size,
                    "path": path,
                    "store": medium,
                    "dtype": dtype if path == "stream" else "float32",
                    "params": params,
                    "bytes": nbytes if path == "stream" else params * 4,
                    **med,
                    "total_s": total,
                    "vs_memcpy": total / copy_s,
                    "publisher_peak_mb": statistics.median(peaks[path]),
                    "repeats": repeats,
                }
            )
    del trainer
    return rows


def _medium(path: Path) -> str:
    """`tmpfs` for a store in memory (/dev/shm), `disk` otherwise: the publish writes the store's files."""
    import psutil

    best = max(
        (p for p in psutil.disk_partitions(all=True) if str(path).startswith(p.mountpoint)),
        key=lambda p: len(p.mountpoint),
    )
    return "tmpfs" if best.fstype == "tmpfs" else "disk"


def _publish_blob(store: Any, model: Any, version: int, home: Path) -> Path:
    """main's path before streaming: the state dict as one float32 safetensors blob, put, pulled into a file."""
    import torch
    from safetensors.torch import save

    blob = save({k: v.detach().to(torch.float32).contiguous() for k, v in _tensors(model).items()})
    key = f"blob/v{version:06d}.safetensors"
    store.put(key, blob, pinned=True)
    del blob
    out = home / f"blob-v{version}"
    out.mkdir()
    store.read_to_file(key, out / "model.safetensors")
    store.delete(key)
    return out


async def _reload_from_file(engine: Any, blob_dir: Path, version: int) -> None:
    """The engine side of main's earlier path: pause, reload from the file, reset the prefix cache, resume."""
    llm = engine._llm  # the benchmark reaches past the engine API to time the path that API no longer has
    await llm.pause_generation(mode="keep", clear_cache=False)
    await llm.collective_rpc("reload_weights", kwargs={"weights_path": str(blob_dir)})
    await llm.reset_prefix_cache(reset_running_requests=True)
    engine.policy_version = version
    await llm.resume_generation()
    shutil.rmtree(blob_dir, ignore_errors=True)


async def fixed_rows(repeats: int, home: Path) -> list[dict]:
    """The tiny model: publish → first request on the new version, and a request alone, medians of `repeats`."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollart.client.in_process import started_engine
    from rollart.client.local import publish_model
    from rollart.infra.store.payload import LocalStore
    from rollart.infra.tiny_model import ensure_tiny_model
    from rollart.spec.config import EngineConfig, SamplingParams

    model_dir = ensure_tiny_model(RESULTS.parent.parent / ".rollart" / "models" / "tiny")
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    store = LocalStore(home / "fixed-store")
    sampling = SamplingParams(max_tokens=1)
    parts: dict[str, list[float]] = {"publish": [], "load": [], "request": [], "total": [], "request_alone": []}
    async with started_engine(model_dir, EngineConfig(max_model_len=128)) as engine:
        for v in range(1, repeats + 3):
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(1e-4)
            t0 = time.perf_counter()
            source = publish_model(store, "fixed", v, trainer)
            t1 = time.perf_counter()
            await engine.load_weights(source, v)
            t2 = time.perf_counter()
            out = await engine.generate("SFFF\nmove:", sampling, f"fixed-{v}")
            t3 = time.perf_counter()
            await engine.generate("SFFF\nmove:", sampling, f"alone-{v}")
            t4 = time.perf_counter()
            if out.policy_version != v:
                raise RuntimeError(f"served v{out.policy_version}, expected v{v}")
            if v > 2:
                for k, x in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0, t4 - t3)):
                    parts[k].append(x)
    row = {"model": "tiny", "params": _params(trainer), **{f"{k}_s": statistics.median(v) for k, v in parts.items()}}
    row["repeats"] = repeats
    return [row]


async def train_rows(size: str, steps: int, home: Path, modes: list[str]) -> list[dict]:
    """A train step of the `size` model: torch against megatron T=2 on a small batch; publish time and memory."""
    from bench.trainer import MODES, frozenlake_batch, run_mode
    from rollart.infra.store.payload import LocalStore

    model_dir = build_qwen3(size, "float32")
    store_dir = home / "train-store"
    samples = frozenlake_batch(LocalStore(store_dir), model_dir, groups=2, members=4)
    rows = []
    for mode in modes:
        trainer = {**MODES[mode], "micro_batch_size": 8}
        row = await run_mode(mode, trainer, model_dir, samples, steps, store_dir, home, {"dtype": "bfloat16"})
        rows.append({"size": size, "mode": mode, "step_s": row["wall_s"], "steps": steps, **row})
    return rows


def _merged(results: dict[str, list[dict]], previous: Path) -> dict[str, list[dict]]:
    """This run's rows over the results file's: a part not run keeps its rows, a swap row replaces the one of the
    same size, path and store (so `--parts` and `--sizes` add to a full run instead of erasing it)."""
    if not previous.is_file():
        return results
    old = json.loads(previous.read_text())
    out = {}
    for part, rows in results.items():
        if part != "swap":
            out[part] = rows or old.get(part, [])
            continue
        key = lambda r: (r["size"], r["path"], r.get("store", "disk" if r["path"] != "memcpy" else ""))  # noqa: E731
        fresh = {key(r) for r in rows}
        out[part] = [r for r in old.get(part, []) if key(r) not in fresh] + rows
    return out


SWAP_COLUMNS = [
    ("size", "size", ""),
    ("path", "path", ""),
    ("store", "store", ""),
    ("dtype", "dtype", ""),
    ("gb", "GB", ".2f"),
    ("publish_s", "publish s", ".3f"),
    ("load_s", "load s", ".3f"),
    ("request_s", "request s", ".3f"),
    ("total_s", "total s", ".3f"),
    ("vs_memcpy", "x memcpy", ".2f"),
    ("publisher_peak_mb", "publisher peak MB", ".0f"),
]
FIXED_COLUMNS = [
    ("model", "model", ""),
    ("publish_s", "publish s", ".4f"),
    ("load_s", "load s", ".4f"),
    ("request_s", "first request s", ".4f"),
    ("total_s", "total s", ".4f"),
    ("request_alone_s", "request alone s", ".4f"),
]
TRAIN_COLUMNS = [
    ("size", "size", ""),
    ("mode", "mode", ""),
    ("step_s", "step s", ".2f"),
    ("train_s", "train s", ".2f"),
    ("publish_s", "publish s", ".2f"),
    ("publish_peak_mb", "publish peak MB (leader)", ".0f"),
    ("tokens", "tokens", ".0f"),
]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench size", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="40M and the tiny model only, 2 repeats (a few minutes)")
    p.add_argument("--parts", default="swap,fixed,train", help="comma-separated: swap, fixed, train")
    p.add_argument("--repeats", type=int, help="swaps per path (default 3; --quick 2)")
    p.add_argument("--sizes", help="swap sizes, comma-separated (default 0.5B,1.5B; --quick 40M)")
    p.add_argument("--store-dir", type=Path, help="where the swap's local store lives (e.g. /dev/shm/x: in memory)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parts = set(args.parts.split(","))
    repeats = args.repeats or (2 if args.quick else 3)
    dtype = cpu_dtype()
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-size-"))
    results: dict[str, list[dict]] = {"swap": [], "fixed": [], "train": []}
    try:
        if "swap" in parts:
            sizes = args.sizes.split(",") if args.sizes else (["40M"] if args.quick else ["0.5B", "1.5B"])
            for size in sizes:  # main's blob path needs two float32 copies: not beside a 1.5B engine here
                results["swap"] += asyncio.run(swap_rows(size, dtype, repeats, home, size != "1.5B", args.store_dir))
        if "fixed" in parts:
            results["fixed"] = asyncio.run(fixed_rows(10 if args.quick else 30, home))
        if "train" in parts:
            size = "40M" if args.quick else "0.5B"
            results["train"] = asyncio.run(train_rows(size, 2 if args.quick else 3, home, ["torch", "megatron T=2"]))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for r in results["swap"]:
        r["gb"] = r["bytes"] / 1e9
    if results["swap"]:
        print("\npublish → first request on the new version, on a running vLLM engine (medians):")
        print(format_table(results["swap"], SWAP_COLUMNS))
    if results["fixed"]:
        print("\nthe fixed cost of a swap, tiny model (medians):")
        print(format_table(results["fixed"], FIXED_COLUMNS))
    if results["train"]:
        print("\na train step, publish included (medians after the first step):")
        print(format_table(results["train"], TRAIN_COLUMNS))
    modes = [{"name": f"swap {r['size']} {r['path']}", "wall_s": r["total_s"]} for r in results["swap"]] + [
        {"name": f"train {r['size']} {r['mode']}", "wall_s": r["step_s"]} for r in results["train"]
    ]
    results = _merged(results, RESULTS / "size.json")
    modes = [
        {"name": f"swap {r['size']} {r['path']} {r.get('store', '')}".strip(), "wall_s": r["total_s"]}
        for r in results["swap"]
    ]
    modes += [{"name": f"train {r['size']} {r['mode']}", "wall_s": r["step_s"]} for r in results["train"]]
    out = write_results("size", modes, dtype=dtype, time=time.time(), quick=args.quick, **results)
    print(f"\nwrote {out}")
    return 0
