"""What the payload store keeps under a turn's `data_key`: the bulk of one generation, typed.

`generate` writes a `StoredTurn` and the trainer reads it back (`activities/rl/batch.py`); the
workflows only carry the key. The bytes are the compact JSON object earlier versions wrote with
`Store.put_json` (same keys, same encoding), so records already in a store load unchanged. A change
that old readers could not read adds a `format` field (records without one are format 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart.contracts.generation import FinishReason

__all__ = ["StoredCompletion", "StoredTurn", "whole_prompt"]


class StoredCompletion(BaseModel):
    """One sampled completion: its tokens with the engine's (behaviour) logprob of each, and its text."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    text: str = ""
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason = "length"

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> StoredCompletion:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")
        return self


class StoredTurn(BaseModel):
    """One generation as the trainer needs it: the prompt's token ids, each completion, the policy versions used.

    `policy_version != policy_version_end` means the weights changed while it was generated.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    prompt: str = ""
    prompt_ids: list[int]
    policy_version: int = Field(0, ge=0)
    policy_version_end: int = Field(0, ge=0)
    completions: list[StoredCompletion]
    prefix_key: str | None = None
    """A chat turn after the first (format 2): the previous turn's record. The turn's whole prompt is that turn's
    whole prompt, then its first completion's ids, then `prompt_ids` (the new messages' tokens): each record
    holds only what its turn added, never a copy of the history."""
    format: int = Field(1, ge=1, le=2)

    @model_validator(mode="after")
    def _format_2_has_a_prefix(self) -> StoredTurn:
        if (self.format == 2) != (self.prefix_key is not None):
            raise ValueError("a format 2 record (and only one) names the turn before it (prefix_key)")
        return self

    def to_bytes(self) -> bytes:
        """The record as stored: compact JSON, byte for byte what `Store.put_json` wrote of the same dict (a format 1
        record leaves out the fields format 2 added, so earlier readers read it as before)."""
        data = self.model_dump(mode="json")
        if self.format == 1:
            del data["prefix_key"], data["format"]
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StoredTurn:
        """Read a stored record (any format-1 record, old ones included); pydantic's ValidationError if malformed."""
        return cls.model_validate_json(data)


def whole_prompt(read: Callable[[str], StoredTurn], record: StoredTurn, limit: int = 100_000) -> list[int]:
    """A turn's whole prompt ids: a format 1 record's own, or a format 2 record's prefix chain resolved.

    `read(key)` fetches a record (the store's, or a cache of it). The chain is walked back to its first turn,
    iteratively; a chain longer than `limit` turns, or one that loops, is a ValueError.
    """
    parts = [record.prompt_ids]
    seen: set[str] = set()
    while record.prefix_key is not None:
        key = record.prefix_key
        if key in seen or len(seen) >= limit:
            raise ValueError(f"turn record chain through {key!r} loops or is longer than {limit} turns")
        seen.add(key)
        record = read(key)
        if not record.completions:
            raise ValueError(f"turn record {key!r} is a prefix but has no completion to continue")
        parts.append(record.completions[0].token_ids)
        parts.append(record.prompt_ids)
    return [t for part in reversed(parts) for t in part]
