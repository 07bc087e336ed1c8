"""Rule-based rewards: cheap, stateless checks over a transcript."""

from __future__ import annotations

from rollart.contracts.activities import RewardResult, Transcript
from rollart.spec.registry import reward

__all__ = ["PROGRESS_WEIGHT", "VALID_ACTION_BONUS", "env_return", "exact_match", "progress", "success"]

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


PROGRESS_WEIGHT = 0.4
"""Shaping for `progress`: the share of the way to the goal covered, for envs that report distances."""


@reward("progress")
def progress(transcript: Transcript) -> RewardResult:
    """`success`'s reward plus 0.4 × the largest share of the distance to the goal covered on any turn.

    For envs that report `info["distance"]` (moves left, None in a hole) and `info["start_distance"]`,
    such as FrozenLake: a dense signal that tells "closer" from "nowhere" long before any episode succeeds.
    The farthest point reached counts, not the last: a hole ends the episode with the way it covered
    kept, so a move that explores past the ground already won never scores below standing still.
    Paying nothing after a hole made "two moves, then the wall" (0.23) a trap that some seeds never left
    (docs/learning.md, "Asynchrony that learns"). Reaching the goal is still worth 1 + bonus, more than any
    progress short of it.
    """
    base = success(transcript)
    if base.success or not transcript.turns:
        return base
    start = transcript.turns[-1].info.get("start_distance")
    left = [t.info["distance"] for t in transcript.turns if t.info.get("distance") is not None]
    covered = (start - min(left)) / start if start and left else 0.0
    return RewardResult(value=base.value + PROGRESS_WEIGHT * max(covered, 0.0), success=False)


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


@reward("env_return")
def env_return(transcript: Transcript) -> RewardResult:
    """The env's own return (the sum of its step rewards); success is the last turn's `info["success"]`.

    For envs whose step rewards are already the training signal, such as GEM's (`gem`): Sokoban's 1 on
    solving, -0.1 for an unparsable move, a share of boxes when the turns run out.
    """
    success = bool(transcript.turns) and bool(transcript.turns[-1].info.get("success", False))
    return RewardResult(value=transcript.env_return, success=success)
