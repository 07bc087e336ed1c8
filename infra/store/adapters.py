"""Published LoRA adapters in the store: a version per train step, a `latest` pointer, old versions dropped.

A job with `trainer.lora` publishes only its adapter, in peft's `save_pretrained` layout, one key per file
under the version's prefix: `adapters/<job>/v000003/adapter_config.json` and
`.../adapter_model.safetensors` (what vLLM's `LoRARequest` and peft's `PeftModel.from_pretrained` load; on a
local store the prefix *is* such a directory). The rest follows `weights.py`: files written pinned, then
`latest` moved to the version, then versions ≤ v − keep removed; a reader that finds its version removed
under it reads `latest` again. Full-weight versions stay apart (`weights/<job>/...`), so the step record's
`weights_key` says which kind a version is (`is_adapter_key`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from rollart.infra.store.keys import key_word
from rollart.infra.store.payload import Store, StoreError, StoreKeyError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_FILES",
    "ADAPTER_WEIGHTS",
    "PublishedAdapter",
    "adapter_key",
    "fetch_adapter",
    "is_adapter_key",
    "latest_adapter",
    "latest_adapter_key",
    "publish_adapter",
    "read_adapter",
]

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
"""peft's `save_pretrained` files: the config first (written and read before the weights)."""

_PREFIX = "adapters"
_SWEEP = 8


class PublishedAdapter(BaseModel):
    """What `latest` points at: the version and the key of its weights file (the step record's `weights_key`)."""

    version: int
    key: str

    @property
    def prefix(self) -> str:
        """The version's "directory": every file of it is `prefix/<file>`."""
        return self.key.rsplit("/", 1)[0]


def adapter_key(job_id: str, version: int, file: str = ADAPTER_WEIGHTS) -> str:
    """Key of one file of version `version`'s adapter."""
    return f"{_PREFIX}/{key_word(job_id)}/v{version:06d}/{file}"


def latest_adapter_key(job_id: str) -> str:
    """Key of the job's `latest` adapter pointer."""
    return f"{_PREFIX}/{key_word(job_id)}/latest"


def is_adapter_key(key: str) -> bool:
    """Whether a published version's key (a step record's `weights_key`) is an adapter's, not full weights."""
    return key.startswith(f"{_PREFIX}/")


def publish_adapter(
    store: Store, job_id: str, version: int, files: Mapping[str, bytes], keep: int = 2
) -> PublishedAdapter:
    """Write the adapter's files (pinned), then move `latest` to it, then drop versions ≤ `version − keep`.

    `files` are exactly `ADAPTER_FILES` (what peft's `save_pretrained` writes). Readers never see a pointer to a
    version whose files are not all there.
    """
    if set(files) != set(ADAPTER_FILES):
        raise ValueError(f"an adapter is the files {list(ADAPTER_FILES)}, got {sorted(files)}")
    for name in ADAPTER_FILES:
        store.put(adapter_key(job_id, version, name), files[name], pinned=True)
    ref = PublishedAdapter(version=version, key=adapter_key(job_id, version))
    store.put(latest_adapter_key(job_id), ref.model_dump_json().encode(), pinned=True)
    for old in range(version - keep, max(0, version - keep - _SWEEP), -1):
        for name in reversed(ADAPTER_FILES):  # the weights first: a reader checks for them
            try:
                store.delete(adapter_key(job_id, old, name))
            except StoreError as e:
                log.debug("adapter v%d of %s not removed yet: %s", old, job_id, e)
    return ref


def latest_adapter(store: Store, job_id: str) -> PublishedAdapter | None:
    """The job's newest published adapter, or None (it publishes full weights, or has not trained a step yet)."""
    try:
        return PublishedAdapter.model_validate_json(store.get(latest_adapter_key(job_id)))
    except StoreKeyError:
        return None


def read_adapter(store: Store, ref: PublishedAdapter) -> dict[str, bytes]:
    """The files of a published adapter (StoreKeyError when the version was removed)."""
    return {name: store.get(f"{ref.prefix}/{name}") for name in ADAPTER_FILES}


def fetch_adapter(store: Store, job_id: str, root: Path, attempts: int = 3) -> tuple[PublishedAdapter, Path] | None:
    """Write the job's newest adapter into a new directory under `root` (peft's layout); None when it has none.

    If the version `latest` named is removed before it is read (newer ones were published meanwhile), `latest`
    is read again. Each call makes a directory of its own (an engine may still read an earlier copy of the same
    version); it is the caller's to remove.
    """
    for attempt in range(attempts):
        ref = latest_adapter(store, job_id)
        if ref is None:
            return None
        Path(root).mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix=f"{key_word(job_id)}-v{ref.version:06d}-", dir=root))
        try:
            for name in ADAPTER_FILES:
                store.read_to_file(f"{ref.prefix}/{name}", out / name)
            return ref, out
        except StoreKeyError:
            shutil.rmtree(out, ignore_errors=True)
            if attempt == attempts - 1:
                raise
            log.info("adapter %s was replaced while being read; reading latest again", ref.key)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
    return None
