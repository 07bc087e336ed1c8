"""Chat messages → token ids, incrementally: a multi-turn trajectory is one growing token sequence.

Turn k+1's prompt is turn k's prompt, plus the ids the engine sampled, plus the tokens of the env's new
messages. Re-rendering the whole history each turn would re-tokenize text the model produced, and the ids
the trainer sees for earlier turns would no longer be those that were sampled (and re-tokenizing costs time
that grows with the conversation). So only the new messages are rendered, through the model's own chat
template: `continuation` renders them after a fixed stand-in conversation and keeps what the template adds
after it. If the sampled ids did not end with the end-of-turn token (the reply was cut at `max_tokens`),
the template's end of the assistant turn is added first, so the conversation stays well-formed.

`render_all` is the other way (the whole history rendered and tokenized again), for comparison
(`bench turns`) and for agent programs that rewrite their history.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rollart.spec.chat import ChatMessage

__all__ = ["ChatTokens", "ConversationError"]

_MARK = "\u2063rollart\u2063"
"""A stand-in assistant reply that no template writes itself, to find where a reply's text goes."""

_STAND_IN = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": _MARK},
]


class ConversationError(ValueError):
    """The model cannot render chat messages (no chat template), or its template is not incremental."""


class ChatTokens:
    """Renders chat messages to token ids with one model directory's tokenizer and chat template (loaded once)."""

    def __init__(self, model_dir: Path, tokenizer: Any = None) -> None:
        self.model_dir = Path(model_dir)
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._close: tuple[str, str] | None = None  # (end of an assistant turn, the eos token's text)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (loaded on first use; a blocking read of the model directory)."""
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer  # the generation worker's import, not every importer's

                self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            return self._tokenizer

    def _template(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation: bool) -> str:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ConversationError(
                f"the model in {self.model_dir} has no chat template, so it cannot be sent chat messages; build one "
                "with a template (`rollart init-model --chat`, the tiny-chat model) or use a text env"
            )
        return tok.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=generation)

    def ids(self, text: str) -> list[int]:
        """Token ids of `text` with no special tokens added (the template writes its own)."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def opening(self, messages: list[ChatMessage], tools: list[dict] | None = None) -> list[int]:
        """The first prompt of a conversation: `messages` (and `tools`) rendered, ending where the reply starts."""
        text = self._template([m.template_dict() for m in messages], tools, True)
        return self.ids(self._without_bos(text))

    def render_all(self, messages: list[ChatMessage], tools: list[dict] | None = None) -> str:
        """The whole conversation rendered again as text (what re-rendering each turn tokenizes)."""
        return self._without_bos(self._template([m.template_dict() for m in messages], tools, True))

    def continuation(self, messages: list[ChatMessage], after_end_of_turn: bool) -> list[int]:
        """Tokens that follow an assistant reply: the new `messages`, then the next reply's start.

        `after_end_of_turn`: the sampled ids ended with the end-of-turn (eos) token, so the template's own end
        of the assistant turn is already there (less that token).
        """
        close, eos = self._assistant_close()
        head = self._template(_STAND_IN, None, False)
        full = self._template(_STAND_IN + [m.template_dict() for m in messages], None, True)
        if not full.startswith(head):
            raise ConversationError(
                f"the chat template of {self.model_dir} renders earlier messages differently once more follow, so a "
                "conversation cannot grow token by token"
            )
        text = full[len(head) :]
        if after_end_of_turn:
            text = close[len(eos) :] + text if eos and close.startswith(eos) else text
        else:
            text = close + text
        return self.ids(text)

    def reply(self, message: ChatMessage) -> list[int]:
        """The ids a model samples for the assistant `message`: what the template renders for it after the
        generation prompt, up to and including the end-of-turn (eos) token — the tokens SFT trains on.

        Rendered after the stand-in conversation, as `continuation` is, so the ids line up with `opening` /
        `continuation` (which supply the generation prompt before and the rest of the turn's end after).
        """
        if message.role != "assistant":
            raise ConversationError(f"only an assistant message is a reply, got a {message.role} message")
        close, eos = self._assistant_close()
        if not eos or not close.startswith(eos):
            raise ConversationError(
                f"the chat template of {self.model_dir} does not end an assistant turn with the eos token "
                f"({eos!r}), so a reply's end cannot be told from the template's"
            )
        head = self._template(_STAND_IN[:-1], None, True)
        full = self._template([*_STAND_IN[:-1], message.template_dict()], None, False)
        if not full.startswith(head) or not full.endswith(close):
            raise ConversationError(
                f"the chat template of {self.model_dir} renders an assistant message other than after its generation "
                "prompt, so its tokens are not those a model samples"
            )
        return self.ids(full[len(head) : len(full) - len(close)] + eos)

    def _assistant_close(self) -> tuple[str, str]:
        """What the template writes after an assistant reply's text (`<|im_end|>\\n` in ChatML), and the eos text."""
        if self._close is None:
            head = self._template(_STAND_IN, None, False)
            at = head.rfind(_MARK)
            if at < 0:
                raise ConversationError(f"the chat template of {self.model_dir} drops an assistant reply's text")
            self._close = (head[at + len(_MARK) :], self.tokenizer.eos_token or "")
        return self._close

    def _without_bos(self, text: str) -> str:
        """A template that writes BOS itself would get a second one from the tokenizer: leave it out then."""
        tok = self.tokenizer
        bos = tok.bos_token
        if bos and text.startswith(bos):
            ids = tok("x").input_ids
            if ids and ids[0] == tok.bos_token_id:
                return text[len(bos) :]
        return text
