"""`rollart sft-data`: synthetic transcripts of an env's episodes done right, for `rollart sft`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollart.cli.errors import UserError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `sft-data` and its flags."""
    s = sub.add_parser(
        "sft-data",
        help="write synthetic chat transcripts (JSONL) of an env's episodes done right, for `rollart sft`",
        description="Write N transcripts of solved episodes, one JSON object a line, as `rollart sft --data` reads "
        "them. tool_calls: the user's question, an assistant message calling calc with the expression, the tool's "
        "answer, the final reply with the number; tools: [calc]. Problems are drawn from seeds 1,000,000,000 + "
        "SEED x 1,000,003 + i, apart from the seeds RL training (small) and `rollart eval` (2,000,000,000 on) "
        "draw; the same flags write the same file.",
    )
    s.add_argument("generator", choices=["tool_calls"], help="which env's episodes")
    s.add_argument("-n", "--num", type=int, default=2000, help="transcripts to write (default 2000)")
    s.add_argument("--out", type=Path, required=True, help="the JSONL file to write (replaced if it exists)")
    s.add_argument("--seed", type=int, default=0, help="which problems, 0..998 (default 0)")
    s.add_argument("--digits", type=int, default=2, help="digits per operand, as the env's env_args (default 2)")
    s.add_argument("--num-terms", type=int, default=2, help="operands per expression (default 2)")
    s.add_argument("--operators", default="+", help='a non-empty subset of "+-*" (default "+")')
    s.add_argument("--system", help="a system message to open each transcript with (as the env's env_args)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the file; say how many and where."""
    from rollart.client.sft import write_synthetic

    if args.num < 1:
        raise UserError(f"-n must be at least 1, got {args.num}")
    if not 0 <= args.seed <= 998:  # so a million transcripts stay below `rollart eval`'s seeds
        raise UserError(f"--seed must be in 0..998, got {args.seed}")
    env_args = {"digits": args.digits, "num_terms": args.num_terms, "operators": args.operators, "system": args.system}
    try:
        n = write_synthetic(args.generator, args.num, args.seed, args.out, env_args)
    except ValueError as e:
        raise UserError(str(e)) from e
    print(f"wrote {n} {args.generator} transcripts to {args.out} (seed {args.seed})")
    return 0
