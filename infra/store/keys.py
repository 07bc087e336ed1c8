"""Store keys: slash-separated words, and how any text becomes one such word.

Apart from `store` so that workflow code (through `contracts`) can build keys without importing the
store's implementations, which reach Mooncake and torch.
"""

from __future__ import annotations

import re

__all__ = ["check_key", "key_word"]

_KEY = re.compile(r"^[A-Za-z0-9_.=@-]+(/[A-Za-z0-9_.=@-]+)*$")


def key_word(text: str) -> str:
    """Any text (a workflow id, a job id) made safe as one word of a store key."""
    return re.sub(r"[^A-Za-z0-9_.=@-]", "_", text) or "_"


def check_key(key: str) -> str:
    """`key` if it is slash-separated words of [A-Za-z0-9_.=@-]; ValueError otherwise."""
    if not _KEY.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}: use slash-separated words of [A-Za-z0-9_.=@-]")
    return key
