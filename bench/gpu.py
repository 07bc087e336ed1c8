"""GPU check: the CUDA builds doing rollart's work on this machine's GPUs, or one line saying there is no GPU.

With a GPU (`python -m bench gpu`), six checks on the tiny model, each printing what it measured:

1. **vLLM on CUDA** serves a batch of requests and swaps in new weights without restarting: after the
   swap every completion is stamped with the new version and its log-probs equal the trainer's
   (float32 engine vs the torch trainer on the same GPU, within 1e-3: TF32 and kernels differ).
2. **The megatron trainer** at T=1, and at T=2 when there are two GPUs: train steps through the
   trainer worker's rank group (NCCL) publish what the torch backend publishes (within 1e-4), with
   step and publish times.
3. **Packed micro-batches** (`trainer.packing`, torch backend): the same loss as padded ones in float32, and
   tokens/s of both in bf16 on a mixed-length batch (flash-attention's varlen kernel when it is installed).
4. **FSDP2 on the torch backend** (`trainer.fsdp`): train steps through the trainer worker's rank group publish
   what the one-process torch backend publishes (within 1e-4), on 2 ranks where there are two GPUs (NCCL
   gives each rank its own), else on 1 rank (the same sharded code path, saying why).
5. **Log-probs without the whole fp32 vocabulary** (`bench trainer_memory` at 8k tokens, hidden 4096, a 152k
   vocabulary): peak memory of today's path, chunked and fused with the LM head; fused at most 1/4 of today's.
6. **3 training steps through the stack**: a local Temporal dev server and a worker per pool, vLLM
   and the megatron trainer on the GPU(s), FrozenLake as groups, bound 0.

Without a GPU it says so in one line and exits 0 (`--device cpu` runs the same checks on the CPU, to
check the script itself, vLLM check included, on the CPU build). Exit code 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.report import RESULTS


def _line(name: str, ok: bool, detail: str) -> bool:
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    return ok


async def check_vllm_swap(model_dir: Path, home: Path, device: str) -> bool:
    """Serve 32 requests, swap in weights one torch step away, serve again: versions and log-probs follow."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollart.client.in_process import started_engine
    from rollart.client.local import publish_model, trainer_logprobs
    from rollart.infra.store.payload import LocalStore
    from rollart.spec.config import EngineConfig, SamplingParams

    sampling = SamplingParams(temperature=1.0, max_tokens=8, n=4)
    prompt = "SFFF\nFHAH\nFFFH\nHFFG\nmove:"
    t0 = time.perf_counter()
    async with started_engine(
        model_dir, EngineConfig(max_model_len=256, gpu_memory_utilization=0.25, dtype="float32")
    ) as engine:
        started = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(prompt, sampling, f"gpu-{i}") for i in range(32)))
        serve_s = time.perf_counter() - t0
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():  # new weights: nudge every tensor, as a train step would
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        source = publish_model(LocalStore(home / "swap-store"), "gpu-swap", 1, model)
        t0 = time.perf_counter()
        await engine.load_weights(source, 1)
        swap_s = time.perf_counter() - t0
        after = await engine.generate(prompt, sampling, "gpu-after")
        trainer = trainer_logprobs(
            model_dir, model.state_dict(), [(after.prompt_ids, c.token_ids) for c in after.completions], device
        )
        diff = max(
            float((torch.tensor(t) - torch.tensor(c.logprobs)).abs().max()) for t, c in zip(trainer, after.completions)
        )
    tokens = sum(len(c.token_ids) for o in outs for c in o.completions)
    ok = after.policy_version == after.policy_version_end == 1 and diff < 1e-3
    return _line(
        f"vLLM ({device}) serves and swaps weights",
        ok,
        f"start {started:.1f} s, 32 requests x n=4 in {serve_s:.2f} s ({tokens / serve_s:.0f} tok/s), swap "
        f"{swap_s:.3f} s, after the swap version {after.policy_version}, |logprob - trainer| max {diff:.1e}",
    )


async def check_megatron(model_dir: Path, home: Path, device: str) -> bool:
    """Megatron T=1 (and T=2 with two GPUs) against the torch backend, through the trainer worker's rank group."""
    import torch

    from bench.trainer import MODES, frozenlake_batch, run_mode
    from rollart.infra.store.payload import LocalStore

    samples = frozenlake_batch(LocalStore(home / "store"), model_dir)
    modes = ["torch", "megatron T=1"]
    if device == "cpu" or torch.cuda.device_count() >= 2:
        modes.append("megatron T=2")
    rows = {}
    for mode in modes:
        trainer = {**MODES[mode], "device": device, "eps": 1e-6}
        rows[mode] = await run_mode(mode, trainer, model_dir, samples, 3, home / "store", home / "runs")
    from rollart.client.local import published_tensors
    from rollart.infra.store.weights import latest_weights

    store = LocalStore(home / "store")

    def weights(mode: str) -> dict:
        return published_tensors(store, latest_weights(store, mode.replace(" ", "-").replace("=", "")).key)

    ref = weights("torch")
    ok = True
    for mode in modes[1:]:
        got = weights(mode)
        diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)
        r = rows[mode]
        ok &= _line(
            f"megatron {mode.split()[-1]} on {device} (rank group)",
            diff < 1e-4,
            f"3 steps, weights vs torch max |diff| {diff:.1e}; step {r['wall_s']:.3f} s (torch "
            f"{rows['torch']['wall_s']:.3f}), publish {r['publish_s']:.4f} s, ranks up in {r['first_step_s']:.1f} s",
        )
    return ok


async def check_packing(model_dir: Path, home: Path, device: str) -> bool:
    """Packed vs padded micro-batches (`trainer.packing`) of the torch backend on an agentic batch: the same loss
    in float32 (sdpa, block mask), and tokens/s of both in bf16 (flash-attention's varlen kernel when installed)."""
    from bench.trainer import build_model
    from bench.trainer_packing import agentic_batch, measure

    bigger = build_model(home / "packing", 512, 8) if device == "cuda" else model_dir
    seqs = agentic_batch(96 if device == "cuda" else 16, 380)
    padded, packed = {"micro_batch_size": 8}, {"packing": {"max_tokens": 4096}}
    exact = [measure(bigger, seqs, {**m, "dtype": "float32"}, device) for m in (padded, packed)]
    gap = abs(exact[0]["loss"] - exact[1]["loss"])
    fast = [measure(bigger, seqs, {**m, "dtype": "bfloat16"}, device) for m in (padded, packed)]
    return _line(
        f"packed micro-batches on {device} (torch backend, {fast[1]['attention']})",
        gap < 1e-5,
        f"float32 |loss padded - packed| {gap:.1e}; bf16 {fast[0]['tokens_per_s']:.0f} tok/s padded (8 sequences) vs "
        f"{fast[1]['tokens_per_s']:.0f} packed (4096 tokens): {fast[1]['tokens_per_s'] / fast[0]['tokens_per_s']:.2f}x",
    )


async def check_fsdp(model_dir: Path, home: Path, device: str) -> bool:
    """The torch backend with FSDP2 against the same backend in one process, through the trainer worker's ranks."""
    import torch

    from bench.trainer import frozenlake_batch, run_mode
    from rollart.client.local import published_tensors
    from rollart.infra.store.payload import LocalStore
    from rollart.infra.store.weights import latest_weights

    ranks = 2 if device == "cpu" or torch.cuda.device_count() >= 2 else 1
    why = "" if ranks == 2 else " (1 GPU: 2 NCCL ranks need 2 GPUs)"
    store = LocalStore(home / "fsdp-store")
    samples = frozenlake_batch(store, model_dir)
    rows = {}
    for mode, extra in (("torch", {}), (f"fsdp {ranks}", {"fsdp": {"ranks": ranks}})):
        trainer = {**extra, "device": device, "eps": 1e-6}
        rows[mode] = await run_mode(mode, trainer, model_dir, samples, 3, home / "fsdp-store", home / "fsdp-runs")
    ref, got = (published_tensors(store, latest_weights(store, m.replace(" ", "-")).key) for m in rows)
    diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    r = rows[f"fsdp {ranks}"]
    return _line(
        f"FSDP2 torch backend, {ranks} rank(s) on {device}{why}",
        diff < 1e-4,
        f"3 steps, weights vs one process max |diff| {diff:.1e}; step {r['wall_s']:.3f} s (one process "
        f"{rows['torch']['wall_s']:.3f}), publish {r['publish_s']:.4f} s, ranks up in {r['first_step_s']:.1f} s",
    )


async def check_logprob_memory(home: Path, device: str) -> bool:
    """Log-probs and entropy at a 152k vocabulary (`bench trainer_memory`): peak memory of the LM head + log-probs,
    forward and backward, today's full fp32 path against the chunked and the fused-with-head ones, each in a fresh
    process; the fused peak at most 1/4 of today's and the same values."""
    from types import SimpleNamespace

    from bench.trainer_memory import VOCAB, in_fresh_process

    big = device == "cuda"
    shape = SimpleNamespace(
        tokens=8192 if big else 1024,
        hidden=4096 if big else 256,
        vocab=VOCAB,
        dtype="bfloat16",
        device=device,
        chunk_tokens=1024 if big else 128,
    )
    rows = {mode: in_fresh_process(mode, shape) for mode in ("today", "chunked", "fused")}
    today = rows["today"]
    same = all(abs(r["logp_mean"] - today["logp_mean"]) < 1e-3 for r in rows.values())
    ok = same and rows["fused"]["peak_mb"] <= today["peak_mb"] / 4
    return _line(
        f"log-probs at a {VOCAB}-token vocabulary on {device} ({shape.tokens} tokens, hidden {shape.hidden}, bf16, "
        f"chunks of {shape.chunk_tokens})",
        ok,
        "; ".join(f"{m} peak {r['peak_mb']:.0f} MiB in {r['wall_s']:.3f} s" for m, r in rows.items())
        + f"; fused/today {rows['fused']['peak_mb'] / today['peak_mb']:.2f}, values {'agree' if same else 'DIFFER'}",
    )


async def check_stack(model_dir: Path, home: Path, device: str) -> bool:
    """3 training steps through Temporal, the pools' workers, vLLM and the megatron trainer."""
    import torch

    from bench.training_run import stack_for
    from rollart.client.train import start_training
    from rollart.contracts.training import TrainingStatus
    from rollart.infra.temporal.connection import connect
    from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TaskSpec, TrainerConfig, TrainingConfig
    from rollart.spec.pools import Pool

    tensor = 2 if device == "cuda" and torch.cuda.device_count() >= 2 else 1
    task = TaskSpec(
        name="frozenlake",
        env="frozenlake",
        reward="success",
        env_args={"maps": "standard"},
        max_turns=4,
        group_size=4,
        rollout_unit="group",
        sampling={"max_tokens": 1},
    )
    job = JobSpec(
        name="gpu",
        model_dir=model_dir,
        tasks=[task],
        engine=EngineConfig(max_model_len=256, gpu_memory_utilization=0.25),
        trainer=TrainerConfig(backend="megatron", parallel={"tensor": tensor}, device=device),
        training=TrainingConfig(steps=3, batch_size=16, async_bound=0),
        store=StoreConfig(path=home / "stack-store"),
    )
    stack = stack_for(job, home / "stack", [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS, Pool.TRAINER])
    t0 = time.perf_counter()
    with stack:
        up_s = time.perf_counter() - t0
        client = await connect(stack.temporal, stack.store)
        handle = await start_training(client, job, f"gpu-{int(time.time())}", home / "runs" / "stack")
        result = await asyncio.wait_for(handle.result(), 900)
        status = await handle.query("status", result_type=TrainingStatus)
    wall = time.perf_counter() - t0 - up_s
    on_policy = [r.train["logprob_diff_behav"] for r in status.history]
    ok = result.version == 3 and status.ledger_balanced and max(on_policy) < 1e-3
    return _line(
        f"3 steps through the stack (megatron T={tensor}, vLLM, {device})",
        ok,
        f"stack up in {up_s:.0f} s, 3 steps in {wall:.1f} s, version {result.version}, ledger "
        f"{'balanced' if status.ledger_balanced else 'UNBALANCED'}, vLLM vs trainer |logprob diff| "
        f"per step {', '.join(f'{d:.1e}' for d in on_policy)}",
    )


async def run(device: str) -> bool:
    import torch

    from rollart.infra.tiny_model import ensure_tiny_model

    model_dir = ensure_tiny_model(RESULTS.parent.parent / ".rollart" / "models" / "tiny")
    if device == "cuda":
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        print(f"GPUs: {names}; torch {torch.__version__} (CUDA {torch.version.cuda})", flush=True)
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-gpu-"))
    try:
        results = []
        results.append(await check_vllm_swap(model_dir, home, device))
        results.append(await check_megatron(model_dir, home, device))
        results.append(await check_packing(model_dir, home, device))
        results.append(await check_fsdp(model_dir, home, device))
        results.append(await check_logprob_memory(home, device))
        results.append(await check_stack(model_dir, home, device))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return all(results)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.splitlines()[0])
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: run the trainer and stack checks on the CPU (checks this script where there is no GPU)",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"bench gpu: no GPU visible to torch {torch.__version__} "
            f"({'CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'}); nothing to check here"
        )
        return 0
    ok = asyncio.run(run(args.device))
    print("bench gpu: all checks passed" if ok else "bench gpu: FAILED")
    return 0 if ok else 1
