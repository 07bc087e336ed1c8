"""The workflow patch ids in the code: each one a change to a released workflow's command sequence.

A workflow whose commands change (an added, removed or reordered activity, child, timer or upsert) would
fail to replay the runs started on the code before it. Between released versions such a change goes behind
`workflow.patched(id)`, and the id goes through three releases (Temporal's samples-python `patching/`):

1. `workflow.patched(id)`, the old branch and the new: runs started before it replay the old one.
2. Once no run started before the patch is open: `workflow.deprecate_patch(id)`, only the new branch.
3. Once no run started before the deprecation is open: no call at all.

Before a release nothing is patched: the fixtures are re-recorded from today's code instead
(`python -m tests.support.record_histories`; docs/development.md, "Versioning workflows").
tests/test_replay.py compares the calls in the code with `RELEASED_PATCHES`, so that adding, deprecating
or removing a patch is an edit here too.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["RELEASED_PATCHES", "PatchState"]

PatchState = Literal["patched", "deprecated"]
"""Where an id is in its lifecycle: `workflow.patched(id)` (both branches) or `workflow.deprecate_patch(id)`."""

RELEASED_PATCHES: dict[str, PatchState] = {}
"""Patch id → its state, for every `patched` / `deprecate_patch` call in the workflows (none at 0.1.0)."""
