"""Observation → prompt text: through the model's chat template, or raw.

An env's observation is the whole next prompt (spec/env.py), written for any model. An
instruct model was trained on conversations rendered by its own chat template, so it should see the
observation as the user's message of such a conversation; a base model, or the tiny model (no
template), sees the raw text. The rendering happens here, on the generation worker, once per request:
the text the engine tokenizes is what the trainer later trains on (the stored prompt ids), so training
sees exactly what generation saw.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rollart.spec.config import PromptFormat

__all__ = ["PromptFormatError", "PromptRenderer"]


class PromptFormatError(ValueError):
    """The task asks for a chat template the model does not have (`prompt.chat: always`)."""


class PromptRenderer:
    """Renders observations for one model directory; its tokenizer is loaded on first use, once.

    A template that writes the tokenizer's BOS token itself would get a second one when the engine
    tokenizes the text (it adds BOS for tokenizers that do): the rendered text leaves it out then.
    """

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the tokenizer is loaded (rendering is then quick enough for the event loop)."""
        return self._tokenizer is not None

    def load(self) -> None:
        """Load the tokenizer now (a blocking read of the model directory)."""
        self._loaded()

    @property
    def has_template(self) -> bool:
        """Whether the model ships a chat template."""
        return bool(getattr(self._loaded(), "chat_template", None))

    def render(self, observation: str, fmt: PromptFormat | None) -> str:
        """The prompt text for `observation` under `fmt` (None: raw, as before chat templates existed)."""
        if fmt is None or fmt.chat == "never":
            return observation
        if not self.has_template:
            if fmt.chat == "always":
                raise PromptFormatError(
                    f"the task's prompt.chat is 'always', but the model in {self.model_dir} has no chat template "
                    "(tokenizer_config.json has no chat_template): use chat: auto to send raw text to such models"
                )
            return observation
        messages = [{"role": "system", "content": fmt.system}] if fmt.system else []
        messages.append({"role": "user", "content": observation})
        tok = self._loaded()
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        bos = tok.bos_token
        if bos and text.startswith(bos) and _adds_bos(tok):
            text = text[len(bos) :]
        return text

    def _loaded(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer  # the generation worker's import, not every importer's

                self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            return self._tokenizer


def _adds_bos(tokenizer: Any) -> bool:
    """Whether tokenizing text puts the BOS token first by itself (as the engine's tokenization will)."""
    ids = tokenizer("x").input_ids
    return bool(ids) and ids[0] == tokenizer.bos_token_id
