"""Synthetic SFT transcripts: episodes of an env played right, as `rollart sft` reads them (one JSON object a line).

`tool_calls`: the user's question, an assistant message that calls `calc` with the expression (no text, one tool
call), the tool's answer, and the final reply with the number — the format a random model never finds by itself.
Each transcript's problem comes from the env's own `make_problem` with a seed from `SFT_SEED_BASE` on, away from
the seeds RL training and `rollart eval` draw, so the same seed gives the same file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from rollart.activities.envs.tool_calls import CALC_TOOL, question
from rollart.activities.envs.tool_use import _validate_problem_args, make_problem
from rollart.contracts.ids import SFT_SEED_BASE, derive_seed

__all__ = ["GENERATORS", "tool_calls_transcripts", "transcript_seed"]


def transcript_seed(seed: int, i: int) -> int:
    """The env seed of transcript `i` of a file generated with `seed`."""
    return SFT_SEED_BASE + derive_seed(seed, i)


def tool_calls_transcripts(
    n: int,
    seed: int = 0,
    *,
    digits: int = 2,
    num_terms: int = 2,
    operators: str = "+",
    system: str | None = None,
) -> Iterator[dict[str, Any]]:
    """`n` solved `tool_calls` episodes (the env's `env_args`: digits, num_terms, operators, system)."""
    _validate_problem_args(digits, num_terms, operators)
    for i in range(n):
        expression, value = make_problem(transcript_seed(seed, i), digits, num_terms, operators)
        call_id = f"call-{i}"
        opening = [{"role": "system", "content": system}] if system else []
        messages = [
            *opening,
            {"role": "user", "content": question(expression)},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "calc", "arguments": json.dumps({"expression": expression})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": str(value)},
            {"role": "assistant", "content": str(value)},
        ]
        yield {"messages": messages, "tools": [CALC_TOOL]}


GENERATORS: dict[str, Callable[..., Iterator[dict[str, Any]]]] = {"tool_calls": tool_calls_transcripts}
"""Generators by the env they imitate: `rollart sft-data NAME`."""
