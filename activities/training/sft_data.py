"""SFT transcripts: the JSONL lines `rollart sft` reads, checked one by one, and each conversation as one token
sequence with its loss mask.

A line is `{"messages": [...], "tools": [...]}` in OpenAI's chat shape (assistant `tool_calls` with JSON-text
arguments, `tool` messages). A conversation is tokenized the way generation builds it, never by rendering the
whole history at once: `ChatTokens.opening` for the messages before the first assistant reply, `ChatTokens.reply`
for each reply (what the model samples, up to and including its end-of-turn token), and
`ChatTokens.continuation(..., after_end_of_turn=True)` for the messages after it. So SFT trains on exactly the
token layout RL later samples and trains on; only the replies' tokens carry loss.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from rollart.activities.engines.conversation import ChatTokens
from rollart.spec.chat import ChatMessage

__all__ = ["SftSequence", "Transcript", "TranscriptError", "read_transcripts", "tokenize_transcript"]


class TranscriptError(ValueError):
    """A transcript file or line that cannot be trained on; the message names the file, line and problem."""


class Transcript(BaseModel):
    """One conversation to imitate: its messages and the tools its system prompt offers (JSON schemas)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _trainable(self) -> Transcript:
        roles = [m.role for m in self.messages]
        if "assistant" not in roles:
            raise ValueError("has no assistant message, so nothing to train on")
        if roles[0] == "assistant":
            raise ValueError("starts with an assistant message: a reply needs a prompt (system/user) before it")
        for i, m in enumerate(self.messages):
            for call in m.tool_calls:
                if m.role != "assistant":
                    raise ValueError(f"messages[{i}] is a {m.role} message with tool_calls (only assistants call)")
                try:
                    args = json.loads(call.function.arguments)
                except ValueError as e:
                    raise ValueError(
                        f"messages[{i}]: tool call {call.function.name!r} has arguments that are not JSON text ({e})"
                    ) from None
                if not isinstance(args, dict):
                    raise ValueError(
                        f"messages[{i}]: tool call {call.function.name!r} arguments must be a JSON object, got {args!r}"
                    )
        return self


@dataclass(frozen=True)
class SftSequence:
    """One conversation's token ids and, aligned with them, 1 where a reply's token is trained on and 0 elsewhere."""

    ids: list[int]
    mask: list[int]

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def read_transcripts(path: Path) -> Iterator[Transcript]:
    """The transcripts of a JSONL file, one per non-blank line; TranscriptError naming the line otherwise."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TranscriptError(f"cannot read transcripts from {path}: {e.strerror or e}") from e
    found = 0
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise TranscriptError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(value, dict):
            raise TranscriptError(f"{path}:{n}: expected an object with 'messages', got {type(value).__name__}")
        try:
            found += 1
            yield Transcript.model_validate(value)
        except ValidationError as e:
            raise TranscriptError(f"{path}:{n}: {_describe(e)}") from None
    if not found:
        raise TranscriptError(f"{path} holds no transcripts (every line is blank)")


def _describe(err: ValidationError) -> str:
    """Pydantic's errors as one line: where in the line (messages.2.role) and what is wrong."""
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def tokenize_transcript(chat: ChatTokens, transcript: Transcript) -> SftSequence:
    """The conversation as one token sequence, built as generation builds it, with loss on the replies only.

    Messages after the last assistant message are left out: they carry no loss and the model never answers them.
    """
    messages = transcript.messages
    first = next(i for i, m in enumerate(messages) if m.role == "assistant")
    last = max(i for i, m in enumerate(messages) if m.role == "assistant")
    ids = chat.opening(messages[:first], transcript.tools)
    mask = [0] * len(ids)
    pending: list[ChatMessage] = []
    for i, m in enumerate(messages[first : last + 1]):
        if m.role != "assistant":
            pending.append(m)
            continue
        if i > 0:  # after a reply: the messages since (maybe none), then the next reply's generation prompt
            more = chat.continuation(pending, after_end_of_turn=True)
            ids += more
            mask += [0] * len(more)
            pending = []
        reply = chat.reply(m)
        ids += reply
        mask += [1] * len(reply)
    return SftSequence(ids=ids, mask=mask)
