"""`rollart sft`: a warm start before RL — the job's model fine-tuned on chat transcripts, written as a model dir."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollart.cli.errors import UserError
from rollart.cli.model import ensure_model
from rollart.cli.spec import load_spec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `sft` and its flags."""
    s = sub.add_parser(
        "sft",
        help="supervised fine-tuning on chat transcripts (JSONL): a warm start an RL job then trains from",
        description="Fine-tune the job's model_dir on chat transcripts with its trainer section (backend: torch, or "
        "megatron on one rank; lr, betas, grad_clip, lr_schedule, micro_batch_size, dtype, device, lora), loss = "
        "mean NLL of the assistant replies' tokens (their end-of-turn token included; system, user, tool and "
        "template tokens masked). Each "
        "conversation is one token sequence built as generation builds it, so SFT trains the layout RL samples. "
        "Writes a model dir (weights, config, tokenizer with its chat template, generation config) that an RL job "
        "names as its model_dir. Transcripts: one JSON object a line, {'messages': [OpenAI chat messages, with "
        "assistant tool_calls and tool messages], 'tools': [JSON schemas]} (`rollart sft-data` writes some).",
    )
    s.add_argument("job", type=Path, help="job spec (YAML or JSON): its model_dir and trainer section")
    s.add_argument("--data", type=Path, required=True, help="transcripts, JSONL (one conversation a line)")
    s.add_argument(
        "--model-dir",
        type=Path,
        help="the model to fine-tune (default: the job's model_dir); an RL job whose model_dir is this SFT's --out "
        "names its base here, e.g. .rollart/models/tiny-chat (built on first use)",
    )
    s.add_argument("--out", type=Path, help="model dir to write; must not exist or be empty (default RUN_DIR/model)")
    s.add_argument("--run-dir", type=Path, help="where checkpoints go (default runs/JOB_NAME-sft)")
    s.add_argument("--steps", dest="sft_steps", metavar="N", type=int, help="optimizer steps (default: one epoch)")
    s.add_argument("--epochs", type=float, help="passes over the transcripts instead of --steps (default 1)")
    s.add_argument("--batch-size", type=int, default=32, help="transcripts per optimizer step (default 32)")
    s.add_argument("--lr", type=float, help="learning rate (default: the job's trainer.lr)")
    s.add_argument("--seed", type=int, default=0, help="the transcripts' shuffle (default 0)")
    s.add_argument("--log-every", type=int, default=10, help="a log line every N steps (default 10; 0: none)")
    s.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="checkpoint model and optimizer every N steps into RUN_DIR/checkpoints, and resume from the newest "
        "one there (default 0: no checkpoints, only the final model)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Tokenize, train with a progress bar and a log line every --log-every steps, write the model, say how RL uses
    it."""
    from rollart.activities.training.sft import SftProgress
    from rollart.cli.progress import progress_bar
    from rollart.client.sft import plan_sft, run_sft

    job = load_spec(args.job, args)
    if args.model_dir is not None:
        job = job.model_copy(update={"model_dir": args.model_dir})
    for flag, value in (("--log-every", args.log_every), ("--checkpoint-every", args.checkpoint_every)):
        if value < 0:
            raise UserError(f"{flag} must be 0 or more, got {value}")
    ensure_model(job, str(args.job))
    run_dir = args.run_dir or Path("runs") / f"{job.name}-sft"
    out = args.out or run_dir / "model"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory; choose another --out or remove it")
    try:
        plan = plan_sft(
            job,
            args.data,
            steps=args.sft_steps,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            checkpoint_every=args.checkpoint_every,
        )
    except ValueError as e:
        raise UserError(str(e)) from e
    o, cfg = plan.options, plan.trainer
    epochs = o.steps * o.batch_size / len(plan.sequences)
    print(
        f"sft {job.model_dir}: {len(plan.sequences)} transcripts, {plan.tokens} tokens ({plan.trained_tokens} in "
        f"replies, trained on); {o.steps} steps of {o.batch_size} ({epochs:.2f} epochs), lr {cfg.lr:g}, "
        f"betas {tuple(cfg.betas)}, grad_clip {cfg.grad_clip:g}, backend {cfg.backend}{', lora' if cfg.lora else ''}"
    )
    with progress_bar() as bar:
        task = bar.add_task("steps", total=o.steps, stats="")

        def step_done(p: SftProgress) -> None:
            rate = f"{p.tokens_per_s:,.0f} tokens/s"
            bar.update(task, completed=p.step + 1, stats=f"loss {p.loss:.4f}  {rate}")
            if args.log_every and ((p.step + 1) % args.log_every == 0 or p.step + 1 == p.steps):
                line = f"step {p.step + 1}/{p.steps}: loss {p.loss:.4f}, grad norm {p.grad_norm:.3f}, {rate}"
                bar.console.print(line)

        try:
            done = run_sft(job, plan, out, run_dir, on_step=step_done)
        except ValueError as e:
            raise UserError(str(e)) from e
    r = done.result
    if r.resumed_at:
        print(f"resumed from the checkpoint of step {r.resumed_at - 1} in {run_dir / 'checkpoints'}")
    if r.steps_run:
        rate = r.tokens / max(r.wall_s, 1e-9)
        print(
            f"trained {r.steps_run} steps in {_duration(r.wall_s)} ({rate:,.0f} tokens/s): "
            f"loss {r.first_loss:.4f} -> {r.last_loss:.4f}"
        )
    print(f"wrote the SFT model to {done.out}")
    print("RL starts from it: in the job spec, set (a relative path is read from where rollart runs)")
    print(f"  model_dir: {done.out}")
    print(f"and measure it first with: rollart eval {args.job} --model-dir {done.out} --temperature 1")
    return 0


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
