"""Whether an agent program's chat request continues its conversation so far, compared canonically; pure.

Both sides of the agent endpoint use it: the trajectory workflow decides how a request is played, and the
endpoint sends a request that continues what the workflow already holds as only its new messages and the held
history's digest (`history_digest`), so that a long conversation is not written into the history once per turn.

An OpenAI-style agent sends the whole history with every request. rollart keeps each conversation as one growing
token sequence (activities/engines/conversation.py): a request that repeats the messages seen so far and the
replies returned, and adds some, continues it — only the new messages are rendered and appended to the tokens the
engine sampled. A request that rewrote history (a summarised context, an edited or dropped message, other tools)
starts a new segment: its messages are rendered from scratch, and its first record has no `prefix_key`.

Agents and their frameworks echo a reply back in their own shape: `content` None or "" when there are tool calls,
arguments re-serialised (`{"a": 1}` vs `{"a":1}`), ids of their own, whitespace trimmed. So messages are compared
by what the model saw and said: role, trimmed content, each tool call's name and arguments parsed as JSON, a tool
message's name; ids are left out (the templates do not render them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from rollart.spec.chat import ChatMessage

__all__ = ["TurnPlan", "canonical", "canonical_tools", "history_digest", "plan_turn"]


def _arguments(text: str) -> Any:
    """A tool call's arguments as parsed JSON (compared as values), or the text itself when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def canonical(message: ChatMessage) -> str:
    """The message as compared: role, trimmed content, tool calls (name, parsed arguments), a tool's name."""
    value = {
        "role": message.role,
        "content": (message.content or "").strip(),
        "tool_calls": [[c.function.name, _arguments(c.function.arguments)] for c in message.tool_calls],
        "name": message.name if message.role == "tool" else None,
    }
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def canonical_tools(tools: list[dict[str, Any]] | None) -> str:
    """The tools as compared: their JSON with sorted keys ("" for none)."""
    return json.dumps(tools, sort_keys=True, ensure_ascii=False) if tools else ""


def history_digest(history: list[ChatMessage], tools: list[dict[str, Any]] | None) -> str:
    """A digest of a conversation and its tools as compared (equal for histories `plan_turn` finds equal)."""
    h = hashlib.sha256(canonical_tools(tools).encode())
    for message in history:
        h.update(b"\x00" + canonical(message).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class TurnPlan:
    """How a request is played: continuing the segment with `messages` (its new ones), or a new segment of all."""

    continues: bool
    messages: list[ChatMessage]


def plan_turn(
    history: list[ChatMessage],
    history_tools: list[dict[str, Any]] | None,
    request: list[ChatMessage],
    request_tools: list[dict[str, Any]] | None,
) -> TurnPlan:
    """Continue when `request` starts with the whole `history` (canonically equal, same tools) and adds at least one
    message after the last reply; otherwise start a new segment with every message of the request.

    `history` is the segment so far: the messages of its requests and the replies returned (empty before the
    first turn). A request that only repeats the history adds nothing to answer, so it starts again too.
    """
    if (
        history
        and len(request) > len(history)
        and canonical_tools(history_tools) == canonical_tools(request_tools)
        and all(canonical(a) == canonical(b) for a, b in zip(history, request))
    ):
        return TurnPlan(continues=True, messages=list(request[len(history) :]))
    return TurnPlan(continues=False, messages=list(request))
