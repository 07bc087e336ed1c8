"""A reward model: a learned scorer mixed with a rule-based reward, loaded once per worker and reused.

`reward: reward_model` in a task, with `reward_args` to size it (`hidden`, `layers`, `max_len`,
`passes`: the compute a call costs) or to load trained weights (`checkpoint`). Declared
`serverless=True`: it runs on the elastic pool by default, or colocated with generation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollart.contracts.activities import RewardResult, Transcript
from rollart.spec.registry import lookup_reward, reward

__all__ = ["RewardModel", "RewardModelArgs"]


class RewardModelArgs(BaseModel):
    """The reward model's `reward_args`. value = base reward's value + weight × score; success from the base."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: str = Field("success", description="the rule-based reward that decides success")
    weight: float = Field(0.1, ge=0.0, description="how much the learned score adds to the base value")
    hidden: int = Field(128, ge=8, le=4096)
    layers: int = Field(2, ge=1, le=48)
    heads: int = Field(4, ge=1)
    max_len: int = Field(512, ge=8, le=8192, description="the last max_len bytes of the transcript are scored")
    passes: int = Field(1, ge=1, le=1000, description="forward passes per call: the compute knob for benchmarks")
    seed: int = 0
    checkpoint: Path | None = Field(None, description="a torch state dict of a trained scorer (default: random init)")


@reward("reward_model", serverless=True)
class RewardModel:
    """A `TranscriptScorer` plus a rule-based base reward; `from_args` builds the model (seconds, once)."""

    def __init__(self, args: RewardModelArgs, scorer: Any, base: Any) -> None:
        self.args = args
        self.scorer = scorer
        self.base = base

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> RewardModelArgs:
        """Validate reward_args without loading anything (the job check calls this)."""
        parsed = RewardModelArgs.model_validate(args)
        base = lookup_reward(parsed.base)
        if base.is_model:
            raise ValueError(f"base reward {parsed.base!r} must be a rule-based function, not a model")
        if parsed.hidden % parsed.heads:
            raise ValueError(f"hidden ({parsed.hidden}) must be a multiple of heads ({parsed.heads})")
        return parsed

    @classmethod
    def from_args(cls, **args: Any) -> RewardModel:
        parsed = cls.check_args(args)
        from rollart.activities.rewards.scorer import TranscriptScorer  # torch: only where a model is loaded

        scorer = TranscriptScorer.build(
            hidden=parsed.hidden,
            layers=parsed.layers,
            heads=parsed.heads,
            max_len=parsed.max_len,
            seed=parsed.seed,
            checkpoint=parsed.checkpoint,
        )
        return cls(parsed, scorer, lookup_reward(parsed.base).fn)

    def __call__(self, transcript: Transcript) -> RewardResult:
        base = self.base(transcript)
        base = base if isinstance(base, RewardResult) else RewardResult(value=float(base), success=float(base) >= 1.0)
        (score,) = self.scorer.score([render(transcript)], passes=self.args.passes)
        return RewardResult(value=base.value + self.args.weight * score, success=base.success)


def render(transcript: Transcript) -> str:
    """The text the scorer reads: each observation and the action taken, then the final observation."""
    parts = [f"{t.observation}\n> {t.action}\n" for t in transcript.turns]
    return "".join(parts) + transcript.final_observation
