"""How a model plays a chat task, measured in one process: success, and how often its replies call a tool.

`rollart eval` gives the success rate; a warm start is judged first by its format — do the replies hold a tool
call that the task's vLLM tool parser reads? This plays the task's env with a transformers model exactly as the
generation worker builds a conversation (`ChatTokens.opening`, the sampled ids, `ChatTokens.continuation`) and
reads each reply with the task's parser (`ToolParsing`), counting what it finds. No Temporal, store or engine.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart.contracts.ids import EVAL_SEED_BASE
from rollart.spec.chat import ChatMessage
from rollart.spec.config import TaskSpec

__all__ = ["ChatProbe", "probe_chat_task"]


@dataclass(frozen=True)
class ChatProbe:
    """A chat task played `episodes` times at `temperature`."""

    episodes: int
    temperature: float
    success_rate: float
    replies: int
    tool_call_share: float  # replies with a parsed tool call / replies
    first_reply_call_share: float  # episodes whose first reply is a parsed tool call
    unparsed_calls: int  # replies that tried a call that did not parse (tool_error)
    mean_turns: float


def probe_chat_task(
    model_dir: Path, task: TaskSpec, episodes: int, temperature: float = 1.0, *, seed_base: int = EVAL_SEED_BASE
) -> ChatProbe:
    """Play `episodes` of `task`'s chat env (seeds `seed_base` + i) with the model in `model_dir`, sampled at
    `temperature` (full vocabulary), up to `task.max_turns` replies of `task.sampling.max_tokens` tokens each."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollart.activities.engines.conversation import ChatTokens
    from rollart.activities.engines.tool_parsing import ToolParsing
    from rollart.spec.registry import lookup_env

    chat = ChatTokens(Path(model_dir))
    tok = chat.tokenizer
    parsing = ToolParsing(task.tool_parser, tok) if task.tool_parser else None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stop = [i for i in (tok.eos_token_id, tok.pad_token_id) if i is not None]
    wins, turns, replies, calls, first_calls, unparsed = 0, [], 0, 0, 0, 0
    generator = torch.Generator().manual_seed(0)
    for e in range(episodes):
        env = lookup_env(task.env).cls(**task.env_args)
        messages = env.reset(seed_base + e)
        ids = chat.opening(messages, getattr(env, "tools", None))
        success = False
        for turn in range(task.max_turns):
            sampled = _sample(model, ids, temperature, task.sampling.max_tokens, stop, generator)
            text = tok.decode(sampled, skip_special_tokens=True)
            message = parsing.message(text, f"call-{turn}") if parsing else ChatMessage(role="assistant", content=text)
            replies += 1
            calls += bool(message.tool_calls)
            first_calls += bool(turn == 0 and message.tool_calls)
            unparsed += message.tool_error is not None
            outcome = env.step(message)
            if outcome.done:
                success = bool(outcome.info.get("success"))
                break
            ended = bool(sampled) and sampled[-1] == tok.eos_token_id
            ids = ids + sampled + chat.continuation(outcome.observation, after_end_of_turn=ended)
        wins += success
        turns.append(turn + 1)
    return ChatProbe(
        episodes=episodes,
        temperature=temperature,
        success_rate=wins / episodes,
        replies=replies,
        tool_call_share=calls / replies if replies else 0.0,
        first_reply_call_share=first_calls / episodes,
        unparsed_calls=unparsed,
        mean_turns=statistics.fmean(turns),
    )


def _sample(
    model: Any, ids: list[int], temperature: float, max_tokens: int, stop: list[int], generator: Any
) -> list[int]:
    """One reply's ids: sampled token by token (greedy at temperature 0) until a stop id or `max_tokens`."""
    import torch

    out: list[int] = []
    past = None
    inputs = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(max_tokens):
            result = model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = result.past_key_values
            logits = result.logits[0, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            else:
                token = int(logits.argmax())
            out.append(token)
            if token in stop:
                break
            inputs = torch.tensor([[token]])
    return out
