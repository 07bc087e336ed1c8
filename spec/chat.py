"""Chat messages and tool calls, as envs, the generation worker and agent programs exchange them.

The shapes are OpenAI's chat-completions ones (what agent programs and vLLM's tool parsers speak):
a tool call's `arguments` is JSON *text*. `template_dict` gives what HF chat templates take, where
Qwen's and most others' render `arguments` as an object.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatMessage", "ToolCall", "ToolFunction", "as_messages", "messages_text"]


class ToolFunction(BaseModel):
    """Which function a tool call calls, and its arguments as JSON text."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as an object ({} when they are not a JSON object)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class ToolCall(BaseModel):
    """One native tool call of an assistant message."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatMessage(BaseModel):
    """One message of a conversation: system, user, assistant (maybe with tool calls) or tool (a call's output).

    `tool_error` is rollart's own: on an assistant message, why its text looked like a tool call that did not
    parse (an invalid action for the env to judge, never an infra failure); None otherwise.
    """

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    tool_error: str | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as HF chat templates read it (tool-call arguments as objects)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.parsed_arguments()},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def as_messages(value: Any, where: str, allow_empty: bool = False) -> list[ChatMessage]:
    """`value` (a list of ChatMessage or OpenAI-shaped dicts) as messages; ValueError naming `where` otherwise."""
    if not isinstance(value, list) or not (value or allow_empty):
        raise ValueError(f"{where} must be a non-empty list of chat messages, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        try:
            out.append(item if isinstance(item, ChatMessage) else ChatMessage.model_validate(item))
        except ValueError as e:
            raise ValueError(f"{where}[{i}] is not a chat message: {e}") from e
    return out


def messages_text(messages: list[ChatMessage]) -> str:
    """A plain-text view of messages (transcripts, the UI, reward functions that read text)."""
    lines = []
    for m in messages:
        head = f"{m.role}" + (f" ({m.name})" if m.name else "")
        body = m.content or ""
        calls = " ".join(f"{c.function.name}({c.function.arguments})" for c in m.tool_calls)
        lines.append(f"{head}: {body}{(' ' + calls) if calls else ''}".rstrip())
    return "\n".join(lines)
