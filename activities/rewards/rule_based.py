"""Rule-based rewards: cheap, stateless checks over a transcript."""

from __future__ import annotations

from rollart.activities.types import RewardResult, Transcript
from rollart.infra.registry import reward

__all__ = ["VALID_ACTION_BONUS", "exact_match", "success"]

VALID_ACTION_BONUS = 0.1
"""Shaping for `success`: a random policy almost never reaches a goal, so a small reward for
well-formed actions gives GRPO groups a non-zero spread to learn from (see LEARNING-NOTES)."""


@reward("success")
def success(transcript: Transcript) -> RewardResult:
    """1 when the env reported success, plus 0.1 × the fraction of valid actions; success reported apart."""
    reached = any(t.info.get("success", False) for t in transcript.turns)
    valid = [bool(t.info.get("valid", True)) for t in transcript.turns]
    bonus = VALID_ACTION_BONUS * (sum(valid) / len(valid)) if valid else 0.0
    return RewardResult(value=float(reached) + bonus, success=reached)


@reward("exact_match")
def exact_match(transcript: Transcript) -> RewardResult:
    """1 when the last action, stripped, equals the env's expected answer (`info["answer"]` of the last turn)."""
    if not transcript.turns:
        return RewardResult(value=0.0, success=False)
    last = transcript.turns[-1]
    if "answer" not in last.info:
        raise ValueError(f"task {transcript.task!r}: exact_match needs the env to report info['answer']")
    hit = last.action.strip() == str(last.info["answer"]).strip()
    return RewardResult(value=float(hit), success=hit)
