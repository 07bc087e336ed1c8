"""`rollart export`: a trained version as a plain Hugging Face model dir (a LoRA adapter merged, or alone)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rollart.cli.errors import UserError
from rollart.cli.model import ensure_model
from rollart.cli.spec import load_spec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `export` and its flags."""
    s = sub.add_parser(
        "export",
        help="write a trained version as a Hugging Face model dir that vLLM and transformers load",
        description="Write a trained policy version as a model dir: the job's model dir (config, tokenizer) with the "
        "trained weights. A LoRA job's version is its adapter: --merge merges it into the base weights (a plain "
        "model); without --merge the adapter alone is written, in peft's layout (adapter_config.json, "
        "adapter_model.safetensors). The version comes from a checkpoint (--run-dir) or the store (--job-id).",
    )
    s.add_argument("job", type=Path, help="job spec (YAML or JSON): its model dir is the base, its store the versions")
    s.add_argument("--out", type=Path, required=True, help="directory to write (must not exist, or be empty)")
    s.add_argument("--run-dir", type=Path, help="a run dir (its newest checkpoint, or --step's) or a checkpoint dir")
    s.add_argument("--step", type=int, help="with --run-dir: the checkpoint of this train step")
    s.add_argument("--job-id", help="a training job whose published version to export (from the job's store)")
    s.add_argument("--version", type=int, help="with --job-id: the version (default: the newest)")
    s.add_argument("--merge", action="store_true", help="LoRA: merge the adapter into the base weights")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export one version; say what was written and how to load it."""
    from rollart.client.snapshots import export, from_checkpoint, from_store
    from rollart.infra.store.payload import open_store

    if (args.run_dir is None) == (args.job_id is None):
        raise UserError("give --run-dir (a checkpoint) or --job-id (a published version): one of them")
    if args.step is not None and args.run_dir is None:
        raise UserError("--step picks a checkpoint of --run-dir: give --run-dir too")
    if args.version is not None and args.job_id is None:
        raise UserError("--version picks a published version of --job-id: give --job-id too")
    job = load_spec(args.job, args)
    ensure_model(job, str(args.job))
    t0 = time.monotonic()
    try:
        if args.run_dir is not None:
            snapshot = from_checkpoint(args.run_dir, args.step)
        else:
            snapshot = from_store(open_store(job.store), args.job_id, args.version)
        out = export(job.model_dir, snapshot, args.out, merge=args.merge)
    except ValueError as e:
        raise UserError(str(e)) from e
    version = 0 if snapshot is None else snapshot.version
    what = "the untrained model"
    if snapshot is not None:
        kind = "LoRA adapter" if snapshot.is_adapter else "weights"
        what = f"v{version} ({kind} from {snapshot.source})"
    if snapshot is not None and snapshot.is_adapter and not args.merge:
        print(f"wrote {what} to {out} ({time.monotonic() - t0:.1f} s): the adapter alone, for the base {job.model_dir}")
        print("  load it with peft (PeftModel.from_pretrained(base, DIR)) or vLLM (enable_lora, LoRARequest); --merge")
        print("  writes a plain model instead")
    else:
        merged = ", adapter merged into the base" if snapshot is not None and snapshot.is_adapter else ""
        print(f"wrote {what} to {out} ({time.monotonic() - t0:.1f} s{merged}): a model dir for vLLM and transformers")
    return 0
