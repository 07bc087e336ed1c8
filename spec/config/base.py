"""What every section of the job spec shares: strict models, and where the local stack keeps its things."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = ["DEFAULT_HOME", "Section"]

DEFAULT_HOME = Path(".rollart")
"""Where the local stack keeps generated things (model, Temporal database, store), relative to the cwd."""


class Section(BaseModel):
    """Base for spec sections: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
