"""An agent program written against the plain `openai` client, trained by rollart (examples/agent_program.yaml).

The task: a sum of two numbers, with a calculator tool. The agent asks the model; while the model calls the
tool it runs it and sends the result back (a model that answers without it is asked once to use it); its
reply without a tool call is its answer, rewarded 1.0 when its first number is the sum. rollart calls
`run(base_url, seed, api_key)` (`env_args.entry`), or runs this file as a command (`env_args.command`:
ROLLART_BASE_URL, ROLLART_SEED and ROLLART_API_KEY set, the reward printed last).
Nothing here knows about rollart beyond the base URL and its key (the episode's own, which opens its trajectory's
endpoint and no other): every request is a turn of the trajectory being trained.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import random
import re

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression such as 12+7.",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
        },
    }
]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calc(expr: str) -> str:
    """The tool: + - * of integers, or an error line the model reads (never an exception: the episode goes on)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only integers and + - *")

    try:
        return str(value(ast.parse(expr, mode="eval").body))
    except (SyntaxError, ValueError) as e:
        return f"error: {e}"


def problem(seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randint(1, 49), rng.randint(1, 49)


def run(base_url: str, seed: int, api_key: str, max_rounds: int = 3) -> float:
    """One episode: at most `max_rounds` chat requests (the task's max_turns bounds them too)."""
    client = OpenAI(base_url=base_url, api_key=api_key)
    a, b = problem(seed)
    messages: list[dict] = [
        {"role": "system", "content": "Use the calc tool, then answer with the number."},
        {"role": "user", "content": f"{a}+{b}=?"},
    ]
    used_tool = nudged = False
    for _ in range(max_rounds):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if reply.tool_calls:
            used_tool = True
            for call in reply.tool_calls:
                try:
                    expr = str(json.loads(call.function.arguments).get("expr", ""))
                except (ValueError, AttributeError):
                    expr = ""
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calc(expr)})
            continue
        if not used_tool and not nudged:  # an answer without the tool: asked once to use it
            messages.append({"role": "user", "content": "Use the calc tool first."})
            nudged = True
            continue
        numbers = re.findall(r"-?\d+", reply.content or "")
        return 1.0 if numbers and int(numbers[0]) == a + b else 0.0
    return 0.0  # no answer within max_rounds


if __name__ == "__main__":  # env_args.command: [python, examples/agent_program.py]
    print(
        json.dumps(run(os.environ["ROLLART_BASE_URL"], int(os.environ["ROLLART_SEED"]), os.environ["ROLLART_API_KEY"]))
    )
