"""A chat conversation driven on an engine in this process, the way the generation worker builds its prompts.

For benchmarks and checks (`python -m bench turns`): how long a turn takes when each prompt grows token by token
(what rollart does) against rendering the whole history again as text (what a text contract does), on the same
engine, and whether re-tokenizing the history gives back the ids that were sampled.
"""

from __future__ import annotations

import time

from rollart.activities.engines.base import Engine
from rollart.activities.engines.conversation import ChatTokens
from rollart.activities.envs.tool_calls import CALC_TOOL, question
from rollart.spec.chat import ChatMessage
from rollart.spec.config import SamplingParams

__all__ = ["TOOL_OUTPUT", "ChatTokens", "play_conversation"]

TOOL_OUTPUT = "result: 4821 (exit 0, 0.01 s)"
"""What the stand-in tool answers every turn."""


async def play_conversation(engine: Engine, chat: ChatTokens, turns: int, mode: str, tag: str) -> dict[str, float]:
    """One conversation of `turns` turns on `engine`, each prompt built per `mode` (`tito`: ids grown token by
    token; `rerender`: the whole message list rendered as text again): mean seconds per turn, the part spent
    building prompts here, how many turns' re-tokenized history differed from the sampled ids, final tokens."""
    sampling = SamplingParams(temperature=1.0, top_k=0, max_tokens=12)
    tools = [CALC_TOOL]
    messages = [ChatMessage(role="user", content=question("47+85"))]
    ids = chat.opening(messages, tools)
    eos = chat.tokenizer.eos_token_id
    build_s, turn_s, mismatches, sampled_so_far = 0.0, 0.0, 0, None
    for k in range(turns):
        t0 = time.perf_counter()
        prompt = ids if mode == "tito" else chat.render_all(messages, tools)
        t1 = time.perf_counter()
        out = await engine.generate(prompt, sampling, f"{tag}-{k}")
        t2 = time.perf_counter()
        c = out.completions[0]
        if mode == "rerender" and sampled_so_far is not None:  # untimed: did re-tokenizing change the history?
            mismatches += out.prompt_ids[: len(sampled_so_far)] != sampled_so_far
        sampled_so_far = list(out.prompt_ids) + list(c.token_ids)
        tool = ChatMessage(role="tool", content=TOOL_OUTPUT)
        messages += [ChatMessage(role="assistant", content=c.text), tool]
        t3 = time.perf_counter()
        if mode == "tito":
            ended = bool(c.token_ids) and c.token_ids[-1] == eos
            ids = list(out.prompt_ids) + list(c.token_ids) + chat.continuation([tool], ended)
        t4 = time.perf_counter()
        build_s += (t1 - t0) + (t4 - t3)
        turn_s += (t2 - t0) + (t4 - t3)
    return {
        "turn_s": turn_s / turns,
        "build_s": build_s / turns,
        "mismatches": mismatches,
        "tokens": len(sampled_so_far or []),
    }
