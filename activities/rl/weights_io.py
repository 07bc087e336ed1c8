"""A torch model's weights by name, as a safetensors blob, and trainer checkpoints on disk.

Each tensor once, without the tied `lm_head.weight` (safetensors refuses tensors that share memory;
vLLM and transformers re-tie the head to the embeddings on load). A checkpoint holds the float32
weights as one safetensors file, the optimizer state and the step, written atomically (temp dir +
rename) so a crash never leaves a half checkpoint that resume would pick up.
A LoRA model's (`trainer.lora`) checkpoint holds its adapter in peft's layout instead of `model.safetensors`:
the base is the model dir's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rollart.activities.rl.adapter_io import adapter_files, is_lora, load_adapter_blob_into
from rollart.activities.rl.checkpoint_layout import assemble
from rollart.infra.store.adapters import ADAPTER_WEIGHTS

__all__ = [
    "CHECKPOINT_FILES",
    "hf_model_tensors",
    "latest_checkpoint",
    "load_blob_into",
    "load_checkpoint",
    "load_tensors_into",
    "prune_checkpoints",
    "replace_checkpoint",
    "save_checkpoint",
    "state_dict_blob",
    "unique_tensors",
]

log = logging.getLogger(__name__)

CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "meta.json")
"""What a checkpoint directory holds (a LoRA model's: `ADAPTER_FILES` in place of `model.safetensors`)."""

_CKPT_DIR = re.compile(r"^step-(\d{6,})$")


def unique_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with every tensor once: a name whose memory an earlier name already holds is dropped.

    For a tied model that drops `lm_head.weight` (it comes after `embed_tokens`).
    """
    seen: set[tuple[int, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset())
        if ident in seen:
            continue
        seen.add(ident)
        out[name] = t
    return out


def state_dict_blob(model: torch.nn.Module) -> bytes:
    """The model's weights as one float32 safetensors blob, tied duplicates left out."""
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in unique_tensors(model).items()}
    return st_save(tensors, metadata={"format": "pt"})


def load_blob_into(model: torch.nn.Module, blob: bytes) -> None:
    """Copy a `state_dict_blob` into `model` in place (parameter objects, ties and optimizer refs survive)."""
    load_tensors_into(model, st_load(blob))


def load_tensors_into(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy full tensors by checkpoint name (`checkpoint_layout`: the state dict's, but for fused experts) into
    `model` in place (parameter objects, ties and optimizer refs survive). Raises ValueError when they do not fit
    the model (unknown or missing tensors, other than tied duplicates, or a wrong shape).
    """
    expected = unique_tensors(model)
    tensors = assemble(model, {name: t.shape for name, t in expected.items()}, tensors)
    unexpected = sorted(set(tensors) - set(model.state_dict()))
    missing = sorted(set(expected) - set(tensors))
    if unexpected or missing:
        raise ValueError(
            f"weights do not fit {type(model).__name__}: unexpected {unexpected[:5]}, missing {missing[:5]}; "
            "was it published for another model?"
        )
    with torch.no_grad():
        for name, t in tensors.items():
            target = expected.get(name)
            if target is None:  # a tied duplicate the blob happens to carry
                continue
            if target.shape != t.shape:
                raise ValueError(
                    f"weights tensor {name!r} has shape {tuple(t.shape)}, the model's has {tuple(target.shape)}"
                )
            target.copy_(t.to(target.dtype))


@contextmanager
def hf_model_tensors(model_dir: str | Path) -> Iterator[Any]:
    """A lazy `name -> tensor` reader over an HF model dir's safetensors files (sharded or not)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    where = {name: h for h in handles for name in h.keys()}  # noqa: SIM118 - safe_open handles are not iterable

    def get(name: str) -> torch.Tensor:
        try:
            return where[name].get_tensor(name)
        except KeyError as e:
            raise KeyError(f"{model_dir} has no tensor {name!r}") from e

    yield get


def _checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _CKPT_DIR.match(p.name)
        if m and p.is_dir() and (p / "meta.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint directory under `root`, or None."""
    dirs = _checkpoint_dirs(Path(root))
    return dirs[-1][1] if dirs else None


def replace_checkpoint(tmp: Path, final: Path) -> None:
    """Make the checkpoint written at `tmp` the one at `final` by a rename (a reader sees the old or the new, never
    half of one); re-checkpointing the same step moves the old one aside first."""
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(tmp, final)


def prune_checkpoints(root: Path, keep: int) -> None:
    """Remove all but the newest `keep` complete checkpoints under `root`."""
    for _, old_dir in _checkpoint_dirs(Path(root))[:-keep] if keep > 0 else []:
        shutil.rmtree(old_dir, ignore_errors=True)


class _HasState(Protocol):
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> object: ...


def save_checkpoint(root: Path, model: torch.nn.Module, optimizer: _HasState, step: int, *, keep: int = 2) -> Path:
    """Checkpoint the state after train step `step` into `root/step-{step:06d}`; keep the newest `keep`.

    Written into a temp dir beside it and renamed into place, so a reader
    (resume) sees either the whole checkpoint or none.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        lora = is_lora(model)
        files = adapter_files(model) if lora else {"model.safetensors": state_dict_blob(model)}
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        meta = {"step": step, "version": step + 1, "backend": "torch", **({"lora": True} if lora else {})}
        (tmp / "meta.json").write_text(json.dumps(meta))
        replace_checkpoint(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(root, keep)
    log.info("checkpoint of step %d written to %s", step, final)
    return final


def load_checkpoint(root: Path, model: torch.nn.Module, optimizer: _HasState | None) -> int | None:
    """Load the newest checkpoint under `root` into `model` (and `optimizer`); return its step, or None if none."""
    path = latest_checkpoint(Path(root))
    if path is None:
        return None
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("backend", "torch") != "torch":
        how = "trainer.fsdp" if meta["backend"] == "torch-fsdp" else f"trainer.backend: {meta['backend']}"
        raise ValueError(
            f"checkpoint {path} was written by the {meta['backend']} backend; resume it with {how}, "
            "or start a new run dir"
        )
    lora = bool(meta.get("lora", False))
    if lora != is_lora(model):
        raise ValueError(
            f"checkpoint {path} was written {'with' if lora else 'without'} trainer.lora and this trainer is "
            f"{'not ' if lora else ''}a LoRA one; resume it with the trainer section it was written with, or start a "
            "new run dir"
        )
    if lora:
        load_adapter_blob_into(model, (path / ADAPTER_WEIGHTS).read_bytes())
    else:
        load_blob_into(model, (path / "model.safetensors").read_bytes())
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    log.info("resumed from checkpoint %s (step %d)", path, meta["step"])
    return int(meta["step"])
