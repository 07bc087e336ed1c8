"""A completion's text → an assistant message with native tool calls, by the model family's vLLM tool parser.

The parser is vLLM's own (`hermes` for Qwen, `llama3_json`, `mistral`, ...), as `vllm serve
--tool-call-parser` would use it, so a model's tool calls are read here exactly as its server would read
them. A completion that tries to call a tool but does not parse is not an error: it is an assistant message
with no tool calls and `tool_error` saying what went wrong, an invalid action for the env to judge.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from rollart.spec.chat import ChatMessage, ToolCall, ToolFunction

__all__ = ["ToolParsing", "UnknownToolParser"]


class UnknownToolParser(ValueError):
    """The task names a tool parser vLLM does not have."""


class ToolParsing:
    """One vLLM tool parser bound to a tokenizer; `message(text)` reads a completion."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        self.name = name
        self._tokenizer = tokenizer
        self._cls: Any = None
        self._lock = threading.Lock()

    def _parser(self) -> Any:
        with self._lock:
            if self._cls is None:
                from vllm.tool_parsers import ToolParserManager

                try:
                    self._cls = ToolParserManager.get_tool_parser(self.name)
                except KeyError as e:
                    known = ", ".join(sorted(ToolParserManager.list_registered()))
                    raise UnknownToolParser(f"no vLLM tool parser named {self.name!r}; vLLM has: {known}") from e
        return self._cls(self._tokenizer)  # parsers keep streaming state: a fresh one per completion

    def message(self, text: str, call_id_prefix: str = "call") -> ChatMessage:
        """The assistant message `text` says: its content and the tool calls it makes (if they parse)."""
        import logging

        parser = self._parser()
        vllm_log = logging.getLogger(type(parser).__module__)
        level = vllm_log.level
        vllm_log.setLevel(logging.CRITICAL)  # a call that does not parse is ordinary model output, not an error
        try:
            info = parser.extract_tool_calls(text, request=None)
        except Exception as e:  # a parser that raises on bad output: the same as one that gives up
            return ChatMessage(role="assistant", content=text, tool_error=f"{type(e).__name__}: {e}")
        finally:
            vllm_log.setLevel(level)
        calls = [
            ToolCall(
                id=f"{call_id_prefix}-{i}",
                function=ToolFunction(name=c.function.name, arguments=_json_text(c.function.arguments)),
            )
            for i, c in enumerate(info.tool_calls or [])
        ]
        error = None
        if not info.tools_called and _looks_like_a_call(parser, text):
            error = f"the tool call in this reply does not parse ({self.name} format)"
        content = info.content if info.tools_called else text
        return ChatMessage(role="assistant", content=content or "", tool_calls=calls, tool_error=error)


def _looks_like_a_call(parser: Any, text: str) -> bool:
    """Whether `text` holds the parser's tool-call marker (its start token), so a failed parse was an attempt."""
    start = getattr(parser, "tool_call_start_token", None) or getattr(parser, "bot_token", None)
    return bool(start) and start in text


def _json_text(arguments: Any) -> str:
    """Arguments as JSON text whatever form the parser gave them in."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
