"""The worker's own secrets, kept out of what it records: an env's observations (what model-written code printed),
an agent program's error output, and whatever else goes into a workflow's history, a run report or a log.

A worker knows its secrets: the values of its environment variables whose names say they are one (`*_KEY`,
`*_TOKEN`, `*_SECRET`, `*PASSWORD*`, ...), the lines of its TLS private key, and what rollart itself handed out or
read for a program (`remember`). `scrub` replaces each with `[redacted]`. It is a last line, not the boundary: the
sandbox and the agent command's allowlisted environment keep a secret from reaching the code at all
(docs/security.md).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

__all__ = ["REDACTED", "known_secrets", "remember", "remember_file", "scrub"]

REDACTED = "[redacted]"

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|PRIVATE", re.IGNORECASE)
"""Environment variable names whose values are secrets (`TEMPORAL_API_KEY`, `HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`)."""

NOT_SECRET_NAME = re.compile(r"_(PATH|FILE|DIR|ENV|URL|HOST|PORT|NAME)$", re.IGNORECASE)
"""...unless the name says it holds where a secret is, not the secret (`TEMPORAL_TLS_KEY_PATH`, `API_KEY_ENV`)."""

MIN_CHARS = 8
"""Shorter values are not scrubbed: they would redact common words, and are not secrets worth the name."""

_remembered: set[str] = set()
_lock = threading.Lock()


def remember(*values: str) -> None:
    """Add secrets this worker handed out or read for a program (an endpoint's key, a variable passed by name)."""
    with _lock:
        _remembered.update(v for v in values if len(v) >= MIN_CHARS)


def remember_file(path: str | Path) -> None:
    """Add a secret file's contents (a TLS private key): its whole text and each of its lines, so that a key
    printed whole, in part or re-wrapped is caught line by line. A file that cannot be read adds nothing."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return
    lines = [line.strip() for line in text.splitlines() if not line.startswith("-----")]
    remember(text.strip(), *lines)


def known_secrets() -> list[str]:
    """Every secret `scrub` removes, longest first (so a secret that contains another is removed whole)."""
    from_env = {
        v
        for k, v in os.environ.items()
        if SECRET_NAME.search(k) and not NOT_SECRET_NAME.search(k) and len(v) >= MIN_CHARS
    }
    with _lock:
        return sorted(from_env | _remembered, key=len, reverse=True)


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with each known secret (and each of `extra`) replaced by `[redacted]`."""
    if not text:
        return text
    for secret in [*(s for s in extra if len(s) >= MIN_CHARS), *known_secrets()]:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
