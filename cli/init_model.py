"""`rollart init-model`: build the tiny random-init Qwen2 model and its tokenizer, offline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `init-model` and its flags."""
    s = sub.add_parser("init-model", help="build the tiny random-init Qwen2 model and tokenizer (offline)")
    s.add_argument("--out", type=Path, required=True, help="directory to write the model to")
    s.add_argument("--seed", type=int, default=0, help="init seed (same seed, same weights)")
    s.add_argument("--force", action="store_true", help="rebuild even if DIR already holds a model")
    s.add_argument(
        "--output-scale",
        type=float,
        default=1.0,
        help="the final norm's weight (default 1): how far apart logits can be; 4 lets LoRA, which leaves the "
        "norm and output head alone, learn a confident policy (the tiny-lora model)",
    )
    s.add_argument(
        "--chat",
        action="store_true",
        help="with a ChatML chat template in Qwen's tool-call format (<tool_call>, <tool_response>), its markers "
        "as tokens, and <|im_end|> ending a turn: for chat envs, native tool calls and `rollart sft` (the "
        "tiny-chat model)",
    )
    s.add_argument(
        "--moe",
        action="store_true",
        help="a Qwen3-MoE of the same size: each MLP a router over 4 experts, top 2 (the tiny-moe model)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the model unless --out already holds one (then say so and leave it)."""
    from rollart.infra.tiny_model import build_tiny_model

    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.out} already holds a model (use --force to rebuild)")
        return 0
    t0 = time.monotonic()
    if args.output_scale <= 0:
        from rollart.cli.errors import UserError

        raise UserError(f"--output-scale must be positive, got {args.output_scale}")
    path = build_tiny_model(args.out, seed=args.seed, output_scale=args.output_scale, chat=args.chat, moe=args.moe)
    kind = "".join(f"{k} " for k, on in (("chat", args.chat), ("MoE", args.moe)) if on)
    print(f"built tiny {kind}model in {path} ({time.monotonic() - t0:.1f}s)")
    return 0
