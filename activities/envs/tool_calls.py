"""Tool use with native tool calls: integer arithmetic the model works out by calling a `calc` function tool.

`tool_use`'s task as a chat env (spec/env.py `ChatEnv`): the episode opens with a user
message ("Compute 47+85. ..."), the tool's JSON schema goes to the model's chat template, and the
model calls the tool in its family's format (Qwen's: `<tool_call>{"name": "calc", "arguments":
{"expression": "47+85"}}</tool_call>`), which the generation worker parses with vLLM's tool parser
(the task's `tool_parser: hermes`). The env answers each call with a tool message holding the
sandbox's output. A reply with no tool call is the final answer: the last integer in it is compared
with the expected value, and the episode ends.

A reply whose tool call does not parse (the parser's `tool_error`), or that calls a tool the env does
not have, is an invalid action: a user message says what was wrong and how to call, `info["valid"]`
is False, and with `invalid_action="end"` the episode ends there. Each step's info carries
`success`, `answer` (the expected integer), `valid`, `tool` and `tool_calls` (calls so far).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Final

from rollart.activities.envs.sandbox import SandboxLimits, run_calc
from rollart.activities.envs.tool_use import _validate_problem_args, make_problem
from rollart.spec.chat import ChatMessage
from rollart.spec.env import ChatEnv, StepOutcome
from rollart.spec.registry import env

__all__ = ["CALC_TOOL", "ToolCalls", "question"]

CALC_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an integer arithmetic expression (+ - * and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
"""The one tool, in OpenAI's function-tool shape (what chat templates render)."""

_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_INVALID_RULES: Final = ("noop", "end")
_HOW_TO_CALL: Final = 'call calc as <tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'


def question(expression: str) -> str:
    """The user's opening message for `expression` (also what synthetic SFT transcripts open with)."""
    return f"Compute {expression}. Use the calc tool, then reply with the number."


@env("tool_calls")
class ToolCalls(ChatEnv):
    """Integer arithmetic with a native `calc` tool; success when the final reply's last integer is the answer.

    env_args: ``digits`` (digits per operand, 1..9, default 2), ``num_terms`` (2..6, default 2), ``operators``
    (a non-empty subset of "+-*", default "+"), ``system`` (an optional system message), ``time_limit_s`` (wall
    seconds per call, default 2), ``invalid_action`` ("noop" | "end", default "noop").
    """

    tools: ClassVar[list[dict[str, Any]]] = [CALC_TOOL]

    def __init__(
        self,
        *,
        digits: int = 2,
        num_terms: int = 2,
        operators: str = "+",
        system: str | None = None,
        time_limit_s: float = 2.0,
        invalid_action: str = "noop",
        **unknown: Any,
    ) -> None:
        super().__init__(**unknown)
        _validate_problem_args(digits, num_terms, operators)  # the same checks as tool_use's
        if invalid_action not in _INVALID_RULES:
            raise ValueError(f"tool_calls: invalid_action must be one of {_INVALID_RULES}, got {invalid_action!r}")
        if system is not None and (not isinstance(system, str) or not system):
            raise ValueError(f"tool_calls: system must be a non-empty string, got {system!r}")
        try:
            self.limits = SandboxLimits(time_limit_s=time_limit_s, cpu_limit_s=2, memory_mb=256, max_output_chars=64)
        except ValueError as e:
            raise ValueError(f"tool_calls: {e}") from None
        self.digits, self.num_terms, self.operators = digits, num_terms, operators
        self.system, self.invalid_action = system, invalid_action
        self._expected: int | None = None
        self._calls = 0
        self._done = False

    def reset(self, seed: int) -> list[ChatMessage]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"ToolCalls.reset: seed must be an int, got {seed!r}")
        expression, self._expected = make_problem(seed, self.digits, self.num_terms, self.operators)
        self._calls, self._done = 0, False
        opening = [ChatMessage(role="system", content=self.system)] if self.system else []
        return [*opening, ChatMessage(role="user", content=question(expression))]

    def step(self, action: ChatMessage) -> StepOutcome:
        if self._expected is None:
            raise RuntimeError("ToolCalls has no problem yet: call reset(seed) before step")
        if self._done:
            raise RuntimeError("ToolCalls.step called after the episode ended; call reset(seed) to start a new one")
        info: dict[str, Any] = {
            "valid": True,
            "success": False,
            "answer": str(self._expected),
            "tool": None,
            "tool_calls": self._calls,
        }
        if action.tool_error is not None or any(c.function.name != "calc" for c in action.tool_calls):
            info["valid"] = False
            why = action.tool_error or f"no tool named {action.tool_calls[0].function.name!r}"
            self._done = self.invalid_action == "end"
            reply = ChatMessage(role="user", content=f"error: {why}; {_HOW_TO_CALL}, or reply with the number.")
            return StepOutcome(observation=[reply], reward=0.0, done=self._done, info=info)
        if action.tool_calls:
            replies = [self._call(c.id, c.function.parsed_arguments()) for c in action.tool_calls]
            info.update(tool="calc", tool_calls=self._calls)
            return StepOutcome(observation=replies, reward=0.0, done=False, info=info)
        numbers = _INTEGER.findall((action.content or "").replace(",", ""))
        info["success"] = bool(numbers) and int(numbers[-1]) == self._expected
        self._done = True
        return StepOutcome(observation=[], reward=1.0 if info["success"] else 0.0, done=True, info=info)

    def _call(self, call_id: str, arguments: dict[str, Any]) -> ChatMessage:
        """One calc call's tool message: the sandbox's output, or its error line."""
        self._calls += 1
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ChatMessage(role="tool", tool_call_id=call_id, content="error: calc needs a string 'expression'")
        result = run_calc(expression, self.limits)
        error = result.error_line(self.limits)
        output = result.stdout.strip() if error is None else error
        return ChatMessage(role="tool", tool_call_id=call_id, content=output[:64] or "(no output)")
