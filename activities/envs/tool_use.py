"""Tool use as a multi-turn env: integer arithmetic the model may work out with sandboxed tool calls.

Each episode is one problem drawn from the seed, e.g. ``4821*37+905``, with the answer computed
here (Python precedence, exact integers). Each turn the model's raw text is read for its *first*
tag among:

- ``<calc>EXPR</calc>``: a calculator: numbers, ``+ - * / // % **`` and parentheses only;
- ``<python>CODE</python>``: a Python script (stdlib only); what it prints is the output;
- ``<answer>N</answer>``: the final answer, which ends the episode.

A closing tag may be missing (the rest of the text is then the content), so a task may stop
sampling at ``</calc>`` etc. A tool call runs in `sandbox` (a child process with wall-time, CPU,
memory and output limits and no network; ``python`` calls under bubblewrap unless the task opts in to
``sandbox: unsafe_process``); the episode goes on with reward 0, whatever the call
did: a call that hangs or allocates too much comes back as an error line such as
``error: timed out after 2 s``. The answer is correct when, without spaces, commas and
underscores, it is the expected integer: ``info["success"]``, ``info["answer"]`` (expected,
on every turn). Text with none of the tags, or calling a tool that is not enabled, is an
invalid action: ``info["valid"] = False`` and an observation restating the format; with
``invalid_action="end"`` the episode ends there (a no-op by default). The task's ``max_turns``
bounds the episode.

Observation (the whole next prompt, see `ToolUse.render`): the question line, then the tool
calls so far, each followed by its output, oldest dropped first (``...``) so that the whole
stays within ``max_observation_chars`` — ASCII only, so a byte-level tokenizer never needs more
tokens than characters::

    Compute 4821*37. Tools: <calc>2*3</calc> <python>print(2*3)</python>. Reply <answer>6</answer>.
    <calc>4821*37</calc>
    178377

Every step's info carries ``tool`` ("calc", "python" or None) and, for a tool call, the
sandbox's ``reason`` ("ok", "timeout", "cpu_limit", "memory_limit", "output_limit", "error"),
``wall_s``, ``exit_code``, ``isolation`` ("bwrap", "netns" or "sockets_disabled") and ``truncated``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Final

from rollart.activities.envs.sandbox import (
    SandboxLimits,
    SandboxResult,
    isolation_for,
    run_calc,
    run_python,
    sandbox_mode,
)
from rollart.spec.env import Env, StepOutcome
from rollart.spec.registry import env

__all__ = ["TOOLS", "ToolCall", "ToolUse", "make_problem", "parse_action"]

TOOLS: Final = ("calc", "python")
_TAG: Final = re.compile(r"<(calc|python|answer)>(.*?)(?:</\1>|\Z)", re.DOTALL)
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_OPERATORS: Final = "+-*"
_MAX_DIGITS: Final = 9
_MAX_TERMS: Final = 6
_MAX_CALL_CHARS: Final = 120  # a tool call as echoed back in later observations
_INVALID_RULES: Final = ("noop", "end")
_EXAMPLES: Final = {"calc": "<calc>2*3</calc>", "python": "<python>print(2*3)</python>"}


@dataclass(frozen=True)
class ToolCall:
    """The first tag in an action: `kind` is "calc", "python" or "answer"; `content` is stripped."""

    kind: str
    content: str


def parse_action(text: str) -> ToolCall | None:
    """The first ``<calc>``, ``<python>`` or ``<answer>`` tag in `text` (closing tag optional), else None."""
    match = _TAG.search(text)
    return ToolCall(match.group(1), match.group(2).strip()) if match else None


def make_problem(seed: int, digits: int, num_terms: int, operators: str) -> tuple[str, int]:
    """The expression (no spaces) and its exact value for `seed`: `num_terms` operands of `digits` digits."""
    rng = random.Random(seed)
    terms = [rng.randint(10 ** (digits - 1), 10**digits - 1) for _ in range(num_terms)]
    ops = [rng.choice(operators) for _ in range(num_terms - 1)]
    total, sign, product = 0, 1, terms[0]
    for op, term in zip(ops, terms[1:], strict=True):  # usual precedence: * binds tighter than + and -
        if op == "*":
            product *= term
        else:
            total, sign, product = total + sign * product, (1 if op == "+" else -1), term
    expression = str(terms[0]) + "".join(op + str(term) for op, term in zip(ops, terms[1:], strict=True))
    return expression, total + sign * product


@env("tool_use")
class ToolUse(Env):
    """Integer arithmetic with sandboxed ``<calc>``/``<python>`` tools; reward 1.0 for the right ``<answer>``.

    env_args: ``digits`` (digits per operand, 1..9, default 3), ``num_terms`` (2..6, default 2),
    ``operators`` (a non-empty subset of "+-*", default "*"), ``tools`` (a non-empty list of
    "calc" / "python", default both), ``time_limit_s`` (wall seconds per call, 0.1..20, default
    2), ``cpu_limit_s`` (1..20, default 2, rounded up to whole seconds), ``memory_mb`` (64..65536,
    default 256), ``max_output_chars`` (stdout kept per call, 16..1000000, default 200),
    ``max_observation_chars`` (the longest observation, default 512; must fit the question plus
    one call), ``invalid_action`` ("noop" | "end", default "noop"), ``sandbox`` (where ``python`` calls run:
    "auto" | "bubblewrap" | "unsafe_process", default "auto": bubblewrap, and the env refuses to be built where
    it cannot run; "unsafe_process" is an opt-in to a child process that is not a security boundary).
    """

    def __init__(
        self,
        *,
        digits: int = 3,
        num_terms: int = 2,
        operators: str = "*",
        tools: list[str] | tuple[str, ...] = TOOLS,
        time_limit_s: float = 2.0,
        cpu_limit_s: float = 2.0,
        memory_mb: int = 256,
        max_output_chars: int = 200,
        max_observation_chars: int = 512,
        invalid_action: str = "noop",
        sandbox: str = "auto",
        **unknown: Any,
    ) -> None:
        super().__init__(**unknown)
        _validate_problem_args(digits, num_terms, operators)
        if (
            isinstance(tools, str)
            or not isinstance(tools, (list, tuple))
            or not tools
            or any(t not in TOOLS for t in tools)
        ):
            raise ValueError(
                f"tool_use: tools must be a non-empty list of {', '.join(map(repr, TOOLS))}, got {tools!r}"
            )
        if invalid_action not in _INVALID_RULES:
            raise ValueError(
                f"tool_use: invalid_action must be one of {', '.join(map(repr, _INVALID_RULES))}, "
                f"got {invalid_action!r}"
            )
        try:
            self.limits = SandboxLimits(
                time_limit_s=time_limit_s,
                cpu_limit_s=cpu_limit_s,
                memory_mb=memory_mb,
                max_output_chars=max_output_chars,
            )
        except ValueError as e:
            raise ValueError(f"tool_use: {e}") from None
        self.tools = tuple(t for t in TOOLS if t in tools)
        try:
            self.sandbox = sandbox_mode(sandbox)
            if "python" in self.tools:  # refused here, at load and on the worker, never at the first call
                isolation_for(self.sandbox)
        except ValueError as e:
            raise type(e)(f"tool_use: {e}") from None
        self.digits, self.num_terms, self.operators = digits, num_terms, operators
        self.invalid_action = invalid_action
        longest = self._header("9" * (digits * num_terms + num_terms - 1))
        least = len(longest) + 64
        if (
            isinstance(max_observation_chars, bool)
            or not isinstance(max_observation_chars, int)
            or max_observation_chars < least
        ):
            raise ValueError(
                f"tool_use: max_observation_chars must be an int >= {least} (the question plus room for "
                f"one call), got {max_observation_chars!r}"
            )
        self.max_observation_chars = max_observation_chars
        self._question: str | None = None
        self._expected = 0
        self._history: list[str] = []
        self._calls = 0
        self._done = False

    def reset(self, seed: int) -> str:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"ToolUse.reset: seed must be an int, got {seed!r}")
        expression, self._expected = make_problem(seed, self.digits, self.num_terms, self.operators)
        self._question = self._header(expression)
        self._history = []
        self._calls = 0
        self._done = False
        return self.render()

    @property
    def answer(self) -> str:
        """The expected answer to the current problem; reset first."""
        if self._question is None:
            raise RuntimeError("ToolUse has no problem yet: call reset(seed) before using it")
        return str(self._expected)

    def render(self) -> str:
        """The observation: the question, then as many of the latest calls and outputs as fit."""
        if self._question is None:
            raise RuntimeError("ToolUse has no problem yet: call reset(seed) before using it")
        budget = self.max_observation_chars - len(self._question)
        kept: list[str] = []
        for entry in reversed(self._history):
            if len(entry) > budget:
                if not kept:  # the newest entry alone is too long: keep its end, where the error line is
                    kept.append("..." + entry[len(entry) - budget + 3 :])
                elif budget >= 4:
                    kept.append("...\n")
                break
            kept.append(entry)
            budget -= len(entry)
        return self._question + "".join(reversed(kept))

    def step(self, action: str) -> StepOutcome:
        expected = self.answer
        if self._done:
            raise RuntimeError("ToolUse.step called after the episode ended; call reset(seed) to start a new one")
        call = parse_action(action)
        info: dict[str, Any] = {
            "valid": True,
            "success": False,
            "answer": expected,
            "tool": None,
            "tool_calls": self._calls,
        }
        if call is not None and call.kind == "answer":
            given = re.sub(r"[\s,_]", "", call.content)
            info["valid"] = _INTEGER.fullmatch(given) is not None
            info["success"] = info["valid"] and int(given) == self._expected
            self._history.append(f"<answer>{_ascii(call.content)[:_MAX_CALL_CHARS]}</answer>\n")
            self._done = True
        elif call is not None and call.kind in self.tools:
            result = (
                run_calc(call.content, self.limits)
                if call.kind == "calc"
                else run_python(call.content, self.limits, self.sandbox)
            )
            self._calls += 1
            info.update(tool=call.kind, tool_calls=self._calls, **result.info())
            self._history.append(self._entry(call, result))
        else:
            info["valid"] = False
            shown = f"<{call.kind}>{call.content}</{call.kind}>" if call is not None else action.strip()
            tags = ", ".join(f"<{t}>" for t in (*self.tools, "answer"))
            hint = (
                f"error: tool {call.kind} is not enabled; use {tags}" if call is not None else f"error: no {tags} tag"
            )
            self._history.append(f"{_clip(shown)}\n{hint}\n")
            self._done = self.invalid_action == "end"
        return StepOutcome(
            observation=self.render(), reward=1.0 if info["success"] else 0.0, done=self._done, info=info
        )

    def _header(self, expression: str) -> str:
        tools = " ".join(_EXAMPLES[t] for t in self.tools)
        return f"Compute {expression}. Tools: {tools}. Reply <answer>6</answer>.\n"

    def _entry(self, call: ToolCall, result: SandboxResult) -> str:
        output = _ascii(result.stdout).rstrip("\n")
        error = result.error_line(self.limits)
        lines = [f"<{call.kind}>{_clip(call.content)}</{call.kind}>"]
        if output or error is None:
            lines.append(output or "(no output)")
        if error is not None:
            lines.append(_ascii(error)[: self.limits.max_output_chars])
        return "\n".join(lines) + "\n"


def _clip(text: str) -> str:
    """A call as echoed in later observations: ASCII, at most `_MAX_CALL_CHARS`."""
    text = _ascii(text)
    return text if len(text) <= _MAX_CALL_CHARS else text[: _MAX_CALL_CHARS - 3] + "..."


def _ascii(text: str) -> str:
    """Printable ASCII plus newlines and tabs; anything else becomes ``?`` (one token per char at most)."""
    return "".join(c if c in "\n\t" or " " <= c <= "~" else "?" for c in text)


def _validate_problem_args(digits: Any, num_terms: Any, operators: Any) -> None:
    """Reject bad problem env_args when the session is built, naming the argument and what it accepts."""
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= _MAX_DIGITS:
        raise ValueError(f"tool_use: digits must be an int in 1..{_MAX_DIGITS}, got {digits!r}")
    if isinstance(num_terms, bool) or not isinstance(num_terms, int) or not 2 <= num_terms <= _MAX_TERMS:
        raise ValueError(f"tool_use: num_terms must be an int in 2..{_MAX_TERMS}, got {num_terms!r}")
    if not isinstance(operators, str) or not operators or any(op not in _OPERATORS for op in operators):
        raise ValueError(
            f"tool_use: operators must be a non-empty string of {_OPERATORS!r} characters, got {operators!r}"
        )
