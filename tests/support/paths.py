"""Where the repository is, for tests that read its examples, Dockerfiles and Makefile."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO"]

REPO = Path(__file__).resolve().parents[2]
