"""Trainer memory for log-probs: peak memory and time of the LM head + log-probs + entropy, forward and backward,
at a 150k vocabulary, today's full-vocabulary fp32 path against the chunked ones (`rl.chunked_logprobs`).

Modes, each from the same last hidden states `[1, T, H]` and head `[V, H]` (Qwen2/Qwen3's vocabulary, 151,936):
- `today`: logits = head(hidden), then `losses.token_logprobs_and_entropy` (log-softmax over the whole fp32 block);
- `chunked`: the same logits, then the log-softmax `--chunk-tokens` tokens at a time (`logits_logprobs_and_entropy`);
- `fused`: the head applied chunk by chunk too, so the `[T, V]` logits never exist (`head_logprobs_and_entropy`).
The loss is Σ a·logp + Σ b·entropy (both with gradient); the backward reaches the hidden states and the head.

Each mode runs in a fresh process. Peak: on CUDA `torch.cuda.max_memory_allocated` minus what was allocated
once the inputs were; on the CPU the growth of the peak resident set (`getrusage` ru_maxrss) over the resident set
after the inputs were allocated and touched (`/proc/self/statm`): blocks this large are mmap'ed and unmapped
when freed, so the resident set follows the live tensors. Both include the gradients of hidden states and head.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench.report import format_table, summarize, write_results

MODES = ("today", "chunked", "fused")  # rollart.client.logprob_probe.MODES, without importing torch here
BASELINE = "today"
VOCAB = 151_936  # Qwen2 / Qwen3


def in_fresh_process(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """`head_logprobs_peak(mode)` in a new interpreter, so that no earlier mode's peak or cached memory counts."""
    cmd = [sys.executable, "-m", "bench", "trainer_memory", "--child", mode, *_shape_flags(args)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"mode {mode} failed (rc {out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _shape_flags(args: argparse.Namespace) -> list[str]:
    return [
        f"--tokens={args.tokens}",
        f"--hidden={args.hidden}",
        f"--vocab={args.vocab}",
        f"--dtype={args.dtype}",
        f"--chunk-tokens={args.chunk_tokens}",
        f"--device={args.device}",
    ]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench trainer_memory", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="512 tokens (the shape's vocabulary and hidden size kept)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens of the micro-batch (default 2048)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--chunk-tokens", type=int, default=256, help="the chunked modes' tokens per chunk")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--modes", help=f"comma-separated subset of: {', '.join(MODES)}")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per mode (default 1)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.tokens = 512
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.child:
        from rollart.client.logprob_probe import head_logprobs_peak

        print(
            json.dumps(
                head_logprobs_peak(
                    args.child, args.tokens, args.hidden, args.vocab, args.dtype, args.chunk_tokens, args.device
                )
            )
        )
        return 0
    modes = args.modes.split(",") if args.modes else list(MODES)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.repeats):
        for mode in modes:
            row = in_fresh_process(mode, args)
            print(
                f"repeat {rep + 1}/{args.repeats} {mode}: peak {row['peak_mb']:.0f} MiB, {row['wall_s']:.2f} s",
                flush=True,
            )
            runs[mode].append(row)
    rows = summarize(runs, BASELINE if BASELINE in modes else modes[0])
    base_peak = rows[0]["peak_mb"]
    for r in rows:
        r["peak_vs_baseline"] = r["peak_mb"] / base_peak
    block_mb = args.tokens * args.vocab * 4 / 2**20
    how = "torch.cuda.max_memory_allocated" if args.device == "cuda" else "ru_maxrss growth over the RSS after inputs"
    print(
        f"\nhead + log-probs + entropy, forward and backward: {args.tokens} tokens, hidden {args.hidden}, vocabulary "
        f"{args.vocab}, {args.dtype}, chunks of {args.chunk_tokens} tokens, {args.device} (one fp32 [tokens, "
        f"vocabulary] block: {block_mb:.0f} MiB; peak: {how}):"
    )
    print(
        format_table(
            rows,
            [
                ("name", "mode", ""),
                ("peak_mb", "peak MiB", ".0f"),
                ("peak_vs_baseline", "peak vs today", ".2f"),
                ("wall_s", "fwd+bwd s", ".2f"),
                ("speedup_vs_baseline", "speed vs today", ".2f"),
                ("logp_mean", "mean logp", ".6f"),
                ("entropy_mean", "mean entropy", ".6f"),
            ],
        )
    )
    out = write_results(
        "trainer_memory",
        rows,
        time=time.time(),
        baseline=BASELINE,
        shape={"tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab, "dtype": args.dtype},
        chunk_tokens=args.chunk_tokens,
        device=args.device,
        peak_measured_by=how,
        fp32_block_mb=block_mb,
    )
    print(f"\nwritten {out}")
    return 0
