"""`rollart store gc`: remove the stored claims (Temporal external-storage payloads) no history can refer to any more.

A claim is kept under its owner, the training job (or the workflow) it was stored for, with the owner's id beside it
(infra/temporal/payload_storage.py). Temporal deletes a closed workflow's history once the namespace's retention
has passed; once no workflow of an owner is left (`WorkflowId = '<owner>' OR WorkflowId STARTS_WITH '<owner>-'`),
nothing can read its claims again, and they go, from every tier of the store (Mooncake too). Owners are listed from
the store's directory (`store.path`: the store itself, or Mooncake's `fallback: local` copy). Claims stored before
they had owners (`payloads/<hash>`), and those stored with no workflow to name, are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from rollart.infra.store.payload import Store
from rollart.infra.temporal.payload_storage import OWNER_FILE, PAYLOAD_PREFIX, UNOWNED

__all__ = ["ClaimsSweep", "owners", "sweep"]


@dataclass
class ClaimsSweep:
    """What a sweep found: owners kept (some workflow of theirs remains) and removed, and the claims removed."""

    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    claims: int = 0
    bytes: int = 0


def owners(root: Path) -> dict[str, Path]:
    """Each owner's id → the directory of its claims, under the store directory `root`."""
    found = {}
    for marker in sorted((Path(root) / PAYLOAD_PREFIX).glob(f"*/{OWNER_FILE}")):
        found[marker.read_text()] = marker.parent
    return found


def _query(owner: str) -> str | None:
    """The visibility query for an owner's workflows; None for an id a query cannot quote (kept, to be safe)."""
    if "'" in owner or "\\" in owner or owner == UNOWNED:
        return None
    return f"WorkflowId = '{owner}' OR WorkflowId STARTS_WITH '{owner}-'"


async def sweep(client: Client, store: Store, root: Path, *, dry_run: bool = False) -> ClaimsSweep:
    """Remove (or with `dry_run` only count) the claims of every owner no workflow of which Temporal still holds."""
    out = ClaimsSweep()
    for owner, folder in owners(root).items():
        query = _query(owner)
        if query is None or (await client.count_workflows(query)).count > 0:
            out.kept.append(owner)
            continue
        out.removed.append(owner)
        for path in sorted(folder.iterdir(), key=lambda p: p.name == OWNER_FILE):  # its id goes last
            if path.name.startswith(".tmp-"):  # a write that never finished
                path.unlink(missing_ok=True)
                continue
            out.claims += path.name != OWNER_FILE
            out.bytes += path.stat().st_size
            if not dry_run:
                store.delete(f"{PAYLOAD_PREFIX}/{folder.name}/{path.name}", force=True)
        if not dry_run:
            folder.rmdir()
    return out
