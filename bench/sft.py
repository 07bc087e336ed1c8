"""`python -m bench sft`: the SFT warm start measured on the `tool_calls` task (examples/tool_calls.yaml, tiny-chat).

The recipe `docs/training.md` describes: `rollart sft-data tool_calls` transcripts, `rollart sft` on them with
the job's trainer section, then the task played at temperature 1 on held-out seeds (`client.chat_probe`, as the
generation worker builds and parses a conversation) before and after: success rate, the share of replies with a
parsed tool call, and the share of episodes whose first reply calls the tool. Writes bench/results/sft.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.report import RESULTS, format_table, write_results

EXAMPLE = RESULTS.parent.parent / "examples" / "tool_calls.yaml"

COLUMNS = [
    ("name", "model", ""),
    ("episodes", "episodes", "d"),
    ("success_rate", "success", ".3f"),
    ("first_reply_call_share", "1st reply calls", ".3f"),
    ("tool_call_share", "replies w/ call", ".3f"),
    ("unparsed_calls", "unparsed", "d"),
    ("mean_turns", "turns", ".2f"),
    ("sft_min", "SFT min", ".1f"),
]


def example_job() -> Any:
    """examples/tool_calls.yaml as a JobSpec, less any trainer key this branch's spec does not know yet."""
    import yaml

    from rollart.spec.config import JobSpec, TrainerConfig

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["trainer"] = {k: v for k, v in raw.get("trainer", {}).items() if k in TrainerConfig.model_fields}
    return JobSpec.model_validate(raw)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench sft", description=__doc__.splitlines()[0])
    p.add_argument("--transcripts", type=int, default=2000, help="synthetic transcripts (default 2000)")
    p.add_argument("--steps", type=int, default=600, help="SFT optimizer steps (default 600)")
    p.add_argument("--batch-size", type=int, default=16, help="transcripts per step (default 16)")
    p.add_argument("--lr", type=float, default=3e-3, help="SFT learning rate (default 3e-3)")
    p.add_argument("--episodes", type=int, default=64, help="held-out episodes per model (default 64)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1, the task's)")
    p.add_argument("--out", type=Path, help="keep the SFT model here (default: a temp dir, removed)")
    p.add_argument("--quick", action="store_true", help="64 transcripts, 4 steps, 4 episodes: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.transcripts, args.steps, args.episodes = 64, 4, 4
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from rollart.client.chat_probe import probe_chat_task
    from rollart.client.sft import plan_sft, run_sft, write_synthetic
    from rollart.infra.tiny_model import ensure_tiny_model, first_use_options

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    job = example_job()
    job = job.model_copy(update={"trainer": job.trainer.model_copy(update={"device": "cpu"})})
    model_dir = ensure_tiny_model(job.model_dir, **(first_use_options(job.model_dir) or {}))
    task = job.tasks[0]
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-sft-"))
    try:
        t0 = time.monotonic()
        before = probe_chat_task(model_dir, task, args.episodes, args.temperature)
        print(f"before SFT: {before} ({time.monotonic() - t0:.0f} s)", flush=True)
        data = home / "tool_calls.jsonl"
        write_synthetic("tool_calls", args.transcripts, 0, data, _problem_args(task.env_args))
        plan = plan_sft(job, data, steps=args.steps, batch_size=args.batch_size, lr=args.lr)

        def say(s: Any) -> None:
            if (s.step + 1) % 10 == 0 or s.step + 1 == s.steps:
                print(f"  step {s.step + 1}/{s.steps}: loss {s.loss:.4f}, {s.tokens_per_s:,.0f} tokens/s", flush=True)

        out = args.out or home / "model"
        done = run_sft(job, plan, out, home / "run", on_step=say)
        after = probe_chat_task(done.out, task, args.episodes, args.temperature)
        print(f"after SFT: {after}", flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    r = done.result
    rows = [
        {"name": "tiny-chat (random init)", **asdict(before), "sft_min": None},
        {"name": f"after SFT ({args.steps} steps)", **asdict(after), "sft_min": r.wall_s / 60},
    ]
    print(f"\ntool_calls at temperature {args.temperature:g}, {args.episodes} held-out episodes")
    print(format_table(rows, COLUMNS))
    print(f"SFT: loss {r.first_loss:.3f} -> {r.last_loss:.3f}, {r.tokens / max(r.wall_s, 1e-9):,.0f} tokens/s")
    written = write_results(
        "sft",
        [{**row, "wall_s": row["sft_min"] * 60 if row["sft_min"] else None} for row in rows],
        time=time.time(),
        cpus=os.cpu_count(),
        transcripts=args.transcripts,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        first_loss=r.first_loss,
        last_loss=r.last_loss,
        tokens_per_s=r.tokens / max(r.wall_s, 1e-9),
        quick=args.quick,
    )
    print(f"\n  written: {written}")
    return 0


def _problem_args(env_args: dict[str, Any]) -> dict[str, Any]:
    """The env_args the generator takes (the problem's shape and the system message)."""
    return {k: v for k, v in env_args.items() if k in ("digits", "num_terms", "operators", "system")}
