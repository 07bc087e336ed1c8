"""`python -m bench turns`: time per turn of a growing chat conversation, token-in/token-out against re-rendering.

A multi-turn chat trajectory on one running vLLM engine (the tiny-chat model, a calc tool in the prompt): each
turn the model replies (up to `max_tokens` tokens) and a tool message answers it. Two ways to build each turn's
prompt, alternating in one run:

- `tito` (what rollart does): the previous prompt's ids + the sampled ids + the tool message's tokens, rendered
  incrementally (`ChatTokens.continuation`); the engine is given ids.
- `rerender` (the text contract, and most agent loops): the whole message list rendered again by the chat
  template and sent as text, which the engine tokenizes again.

Per conversation length (8, 32, 128 turns) it reports the mean seconds per turn, the part spent building the
prompt on this side, and how many turns' re-tokenized history differed from the ids that were sampled (the
trainer would then train on ids the policy never produced).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from bench.report import RESULTS, format_table, write_results

LENGTHS = (8, 32, 128)


async def _run(lengths: list[int], repeats: int, home: Path) -> list[dict]:
    from rollart.client.chat_turns import ChatTokens, play_conversation
    from rollart.client.in_process import started_engine
    from rollart.infra.tiny_model import ensure_tiny_model
    from rollart.spec.config import EngineConfig

    model_dir = ensure_tiny_model(home / "tiny-chat", chat=True)
    chat = ChatTokens(model_dir)
    config = EngineConfig(kind="vllm", max_model_len=8192, kv_cache_gib=1)
    runs: dict[tuple[int, str], list[dict]] = {}
    async with started_engine(model_dir, config) as engine:
        await play_conversation(engine, chat, 4, "tito", "warmup")
        for r in range(repeats):
            for n in lengths:
                for mode in ("tito", "rerender") if r % 2 == 0 else ("rerender", "tito"):  # alternate the order
                    got = await play_conversation(engine, chat, n, mode, f"{mode}-{n}-{r}")
                    runs.setdefault((n, mode), []).append(got)
                    print(f"  {n:>4} turns {mode:<8} repeat {r}: {got['turn_s'] * 1e3:.1f} ms/turn", flush=True)
    rows = []
    for (n, mode), rs in sorted(runs.items()):
        rows.append(
            {
                "turns": n,
                "mode": mode,
                "turn_ms": 1e3 * statistics.median(x["turn_s"] for x in rs),
                "build_ms": 1e3 * statistics.median(x["build_s"] for x in rs),
                "tokens": int(statistics.median(x["tokens"] for x in rs)),
                "mismatched_turns": sum(x["mismatches"] for x in rs),
                "turns_checked": sum(max(n - 1, 0) for _ in rs) if mode == "rerender" else 0,
                "repeats": len(rs),
            }
        )
    for row in rows:
        if row["mode"] == "rerender":
            tito = next(x for x in rows if x["turns"] == row["turns"] and x["mode"] == "tito")
            row["vs_tito"] = row["turn_ms"] / tito["turn_ms"]
            tito["vs_tito"] = 1.0
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench turns", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="8 and 32 turns, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--home", type=Path, default=RESULTS / ".turns", help="where the tiny-chat model is built")
    args = parser.parse_args(argv)
    lengths = [8, 32] if args.quick else list(LENGTHS)
    repeats = 1 if args.quick else args.repeats
    t0 = time.monotonic()
    rows = asyncio.run(_run(lengths, repeats, args.home))
    columns = [
        ("turns", "turns", "d"),
        ("mode", "mode", ""),
        ("turn_ms", "ms/turn", ".1f"),
        ("build_ms", "prompt ms/turn", ".2f"),
        ("vs_tito", "x tito", ".2f"),
        ("tokens", "final tokens", "d"),
        ("mismatched_turns", "history changed", "d"),
        ("turns_checked", "of turns", "d"),
    ]
    print(format_table(rows, columns))
    write_results("turns", rows, repeats=repeats, wall_s=time.monotonic() - t0)
    return 0
