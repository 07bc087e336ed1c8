"""A trained version of a job's policy, from a run dir's checkpoint or the store: loaded into an engine, or exported.

What `rollart eval` and `rollart export` share. A version is either full weights (HF tensors by name, the tied
head left out) or, for a `trainer.lora` job, a LoRA adapter in peft's layout. Export writes a plain
Hugging Face model dir that vLLM and transformers load: the model dir's config and tokenizer with the trained
weights, a LoRA adapter merged into the base (`merge`), or the adapter alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.activities.engines.base import Engine
from rollart.activities.rl.weights_io import latest_checkpoint
from rollart.infra.store.adapters import ADAPTER_FILES, PublishedAdapter, adapter_key, latest_adapter, read_adapter
from rollart.infra.store.payload import LocalStore, Store, StoreKeyError
from rollart.infra.store.weight_stream import read_all, write_all
from rollart.infra.store.weights import WeightsManifest, WeightsSource, latest_weights, manifest_key, read_manifest
from rollart.spec.config import WeightsConfig

if TYPE_CHECKING:
    import torch

__all__ = ["PolicySnapshot", "export", "from_checkpoint", "from_store", "load_into"]

_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class PolicySnapshot:
    """One trained version: `weights` (full HF tensors by name) or `adapter` (peft's files by name)."""

    version: int
    source: str
    weights: dict[str, torch.Tensor] | None = None
    adapter: dict[str, bytes] | None = None

    @property
    def is_adapter(self) -> bool:
        return self.adapter is not None


def from_checkpoint(path: Path, step: int | None = None) -> PolicySnapshot:
    """The checkpoint at `path`: a checkpoint dir, or a run dir (its newest checkpoint, or that of step `step`).

    ValueError, saying what there is, when there is none.
    """
    path = Path(path)
    if (path / "meta.json").is_file():
        ckpt = path
    elif step is not None:
        ckpt = path / "checkpoints" / f"step-{step:06d}"
        if not (ckpt / "meta.json").is_file():
            have = (
                sorted(p.name for p in (path / "checkpoints").glob("step-*")) if (path / "checkpoints").is_dir() else []
            )
            raise ValueError(f"{path} has no checkpoint of step {step}; it has: {', '.join(have) or 'none'}")
    else:
        found = latest_checkpoint(path / "checkpoints")
        if found is None:
            raise ValueError(
                f"{path} holds no checkpoint (no checkpoints/step-*/meta.json): a run writes one every "
                "trainer.checkpoint_every steps; evaluate its published versions with --job-id instead"
            )
        ckpt = found
    meta = json.loads((ckpt / "meta.json").read_text())
    if meta.get("backend", "torch") != "torch":
        raise ValueError(
            f"{ckpt} is a sharded checkpoint of the {meta['backend']} backend; use the job's published "
            "versions (--job-id), which are HF weights"
        )
    version = int(meta.get("version", int(meta["step"]) + 1))
    if meta.get("lora"):
        return PolicySnapshot(version, str(ckpt), adapter={n: (ckpt / n).read_bytes() for n in ADAPTER_FILES})
    from safetensors.torch import load_file

    return PolicySnapshot(version, str(ckpt), weights=load_file(str(ckpt / _WEIGHTS)))


def from_store(store: Store, job_id: str, version: int | None = None) -> PolicySnapshot | None:
    """The job's published version `version` (None: its newest); None for version 0 (the model dir's weights).

    ValueError when the job published nothing, or not that version (the store keeps the newest few).
    """
    adapter = latest_adapter(store, job_id)
    latest = adapter if adapter is not None else latest_weights(store, job_id)
    if latest is None:
        raise ValueError(f"job {job_id!r} has published no weights in {store!r}")
    version = latest.version if version is None else version
    if version == 0:
        return None
    try:
        if adapter is not None:
            ref = PublishedAdapter(version=version, key=adapter_key(job_id, version))
            return PolicySnapshot(version, ref.prefix, adapter=read_adapter(store, ref))
        key = manifest_key(job_id, version)
        return PolicySnapshot(version, key, weights=read_all(store, read_manifest(store, key)))
    except StoreKeyError as e:
        raise ValueError(
            f"job {job_id!r} has no published v{version} in {store!r} (its newest is v{latest.version}; the store "
            f"keeps only the last few): {e}"
        ) from e


def _write_adapter(snapshot: PolicySnapshot, into: Path) -> Path:
    """The snapshot's adapter as the directory an engine (or peft) loads."""
    into.mkdir(parents=True, exist_ok=True)
    for name, data in (snapshot.adapter or {}).items():
        (into / name).write_bytes(data)
    return into


async def load_into(engine: Engine, snapshot: PolicySnapshot) -> None:
    """Serve `snapshot` on `engine` (a started one holding the model dir's weights): an adapter as one, full weights
    published into a scratch store and streamed in, as a trainer's version is."""
    with tempfile.TemporaryDirectory(prefix="rollart-snapshot-") as tmp:
        if snapshot.is_adapter:
            await engine.load_adapter(_write_adapter(snapshot, Path(tmp) / "adapter"), snapshot.version)
            return
        store = LocalStore(Path(tmp) / "store")
        cfg = WeightsConfig(dtype="float32")
        buckets = write_all(store, "snapshot", snapshot.version, (snapshot.weights or {}).items(), cfg)
        manifest = WeightsManifest(
            job_id="snapshot", version=snapshot.version, dtype=cfg.dtype, buckets=buckets, publisher=snapshot.source
        )
        await engine.load_weights(WeightsSource(store=store.config, manifest=manifest), snapshot.version)


def export(model_dir: Path, snapshot: PolicySnapshot | None, out: Path, *, merge: bool = False) -> Path:
    """Write `snapshot` (None: the untrained model) as a model dir at `out`, which must not exist or be empty.

    Full weights: the model dir's config and tokenizer with them. An adapter with `merge`: merged into the base
    (a plain model, no peft needed to load it); without: the adapter alone, in peft's layout (load it on the
    model dir's model with peft, or serve it with vLLM's `--enable-lora`). Written beside `out` and renamed
    into place, so `out` is never half-written.
    """
    out = Path(out).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        if snapshot is not None and snapshot.is_adapter and not merge:
            _write_adapter(snapshot, tmp)
        elif snapshot is not None and snapshot.is_adapter:
            _merge_into(Path(model_dir), snapshot, tmp)
        else:
            _copy_model_files(Path(model_dir), tmp, weights=snapshot is None)
            if snapshot is not None:
                from safetensors.torch import save_file

                save_file(dict(snapshot.weights or {}), str(tmp / _WEIGHTS), metadata={"format": "pt"})
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _merge_into(model_dir: Path, snapshot: PolicySnapshot, out: Path) -> None:
    from rollart.activities.rl.adapter_io import merged_model

    with tempfile.TemporaryDirectory(prefix="rollart-adapter-") as tmp:
        model = merged_model(model_dir, _write_adapter(snapshot, Path(tmp) / "adapter"))
    model.save_pretrained(out, safe_serialization=True)
    _copy_model_files(model_dir, out, weights=False)


def _copy_model_files(model_dir: Path, out: Path, *, weights: bool) -> None:
    """The model dir's files (tokenizer, configs; its weights too when `weights`) that `out` lacks."""
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"no model at {model_dir} (config.json missing): export needs the job's base model")
    for f in model_dir.iterdir():
        if f.is_file() and not (out / f.name).exists() and (weights or not f.name.startswith("model")):
            shutil.copy2(f, out / f.name)
