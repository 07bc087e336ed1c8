"""What the payload store keeps under a turn's `data_key`: the bulk of one generation, typed.

`generate` writes a `StoredTurn` and the trainer reads it back (`activities/rl/batch.py`); the
workflows only carry the key. The bytes are the compact JSON object earlier versions wrote with
`Store.put_json` (same keys, same encoding), so records already in a store load unchanged. A change
that old readers could not read adds a `format` field (records without one are format 1).
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart.contracts.activities import FinishReason

__all__ = ["StoredCompletion", "StoredTurn"]


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

    def to_bytes(self) -> bytes:
        """The record as stored: compact JSON, byte for byte what `Store.put_json` wrote of the same dict."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StoredTurn:
        """Read a stored record (any format-1 record, old ones included); pydantic's ValidationError if malformed."""
        return cls.model_validate_json(data)
