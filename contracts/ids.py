"""Ids and seeds of what a job plays, in one place: training, `rollart rollout`, `rollart eval` and the benches
derive the same values from the same numbers.

Every id is part of a workflow id, a store key or a search, and every seed decides an env's episode, so none
may change between versions: tests/test_ids.py pins them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

__all__ = [
    "EVAL_SEED_BASE",
    "SEED_STRIDE",
    "SFT_SEED_BASE",
    "TurnKeys",
    "batch_id",
    "batch_member_id",
    "derive_seed",
    "group_id",
    "member_id",
    "unit_id",
    "wave_id",
]

SEED_STRIDE = 1_000_003
"""A prime: seeds derived from two different base seeds stay apart for a million draws."""

EVAL_SEED_BASE = 2_000_000_000
"""`rollart eval`'s held-out seeds start here, far above any group seed training draws (`derive_seed`)."""

SFT_SEED_BASE = 1_000_000_000
"""Synthetic SFT transcripts (`rollart sft-data`) use seeds from here: above the group seeds of any job whose
`training.seed` is below ~1000 (`derive_seed`), below `EVAL_SEED_BASE`, so SFT neither trains on RL's episodes
nor on eval's."""


def derive_seed(seed: int, index: int) -> int:
    """The seed of draw `index` from base `seed`: group `index`'s env seed and task draw (training, `rollart
    rollout`, bench peer_trl), a data-parallel rank's shuffle, a fault model's stream per salt."""
    return seed * SEED_STRIDE + index


def group_id(job_id: str, g: int) -> str:
    """The id of a training job's `g`-th GRPO group."""
    return f"{job_id}-g{g:06d}"


def member_id(group: str, m: int) -> str:
    """Trajectory id of member `m` of a GRPO group (its own workflow's id when it plays as a trajectory)."""
    return f"{group}-{m}"


def batch_id(first_group: str) -> str:
    """The workflow id of a lockstep batch (BatchRolloutWorkflow), named after its first group."""
    return f"{first_group}-b"


def batch_member_id(batch: str, i: int) -> str:
    """Trajectory id of episode `i` of a lockstep batch."""
    return f"{batch}-{i:03d}"


def wave_id(first_group: str) -> str:
    """The workflow id of the groups of one task launched together (GroupRolloutWorkflow), after its first group."""
    return f"{first_group}-w"


def unit_id(job_id: str, task: str, first: int) -> str:
    """The workflow id of one unit of `rollart rollout` (or `rollart eval`): `first` is its first episode's index;
    a group unit's group is named after it too."""
    return f"{job_id}-{task}-{first:04d}"


def _compact_turn_keys(keys: list[str]) -> list[str] | dict[str, Any]:
    """Keys that run `<prefix>000`, `<prefix>001`, … (a trajectory's turns, `turn_key`) as that prefix and their
    count; any other list as it is."""
    if len(keys) > 1 and keys[0].endswith("000"):
        prefix = keys[0][:-3]
        if keys == [f"{prefix}{k:03d}" for k in range(len(keys))]:
            return {"prefix": prefix, "count": len(keys)}
    return keys


def _expand_turn_keys(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"prefix", "count"}:
        return [f"{value['prefix']}{k:03d}" for k in range(int(value["count"]))]
    return value


TurnKeys = Annotated[
    list[str],
    BeforeValidator(_expand_turn_keys),
    PlainSerializer(_compact_turn_keys, when_used="json"),
]
"""A trajectory's turn keys; in JSON (every payload a history holds), the usual run of one prefix is written as the
prefix and a count: an 8-turn trajectory's keys take ~70 bytes in each report and train step, not ~500."""
