"""What the Temporal UI shows of a rollout workflow: a one-line summary from its start, its outcome at its end.

- Start: whoever starts a trajectory, group or lockstep batch (the training workflow, `rollart rollout`)
  gives it a `static_summary` — `frozenlake · seed 17 · group g000012 member 3 · policy v5` — which the
  UI's workflow list and page show. It is user metadata: no command, nothing to replay.
- End: the workflow upserts its outcome as search attributes (`RollartStatus`, `RollartReward`,
  `RollartSuccess`, `RollartTurns`, `RollartVersions`, `RollartFailure`: infra/temporal/search_attributes.py), so
  the list can show and filter them, and sets its current details, a small markdown summary on its page
  (each member's row for a group or batch). One workflow holds one value per attribute: a group or batch
  shows its mean reward, whether any member succeeded, its longest episode and its policy version range;
  its successes k/n and each member are in the details.

The upsert is a command: it happens only in a workflow started with rollart's search attributes
(`RollartJobId` or `RollartTask`): the starter registered them on the namespace, or the server would fail
the workflow task.
The current details are kept by the worker and read by a query: no command either.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate

from rollart.contracts.rollouts import BatchRolloutInput, GroupRolloutInput, TrajectoryInput, TrajectoryResult
from rollart.infra.temporal import search_attributes as sa

__all__ = [
    "Outcome",
    "batch_summary",
    "details",
    "group_summary",
    "one_line",
    "show_outcome",
    "trajectory_summary",
]

SUMMARY_MAX_BYTES = 200
"""Temporal's advice for a static summary: one line, at most 200 bytes."""
DETAILS_MAX_ROWS = 32
"""Members listed in a group's or batch's details; the rest are counted."""
_REASON_MAX = 120
_ERROR_MAX = 400


def one_line(*parts: str | None) -> str:
    """The non-empty parts joined by ` · ` on one line, cut to SUMMARY_MAX_BYTES (UTF-8) with `…`."""
    text = " ".join(" · ".join(p for p in parts if p).split())
    raw = text.encode()
    if len(raw) <= SUMMARY_MAX_BYTES:
        return text
    return raw[: SUMMARY_MAX_BYTES - len("…".encode())].decode(errors="ignore") + "…"


def _short(group_id: str, job_id: str) -> str:
    """A group id without its job's prefix (`<job id>-g000012` → `g000012`): the job is in every workflow id."""
    return group_id.removeprefix(f"{job_id}-") if job_id else group_id


def _version(version: int | None) -> str | None:
    return f"policy v{version}" if version is not None else None


def trajectory_summary(inp: TrajectoryInput, member: int | None = None, version: int | None = None) -> str:
    """`frozenlake · seed 17 · group g000012 member 3 · policy v5` (the parts known)."""
    group = None
    if inp.group_id:
        group = f"group {_short(inp.group_id, inp.job_id)}" + (f" member {member}" if member is not None else "")
    return one_line(inp.task.name, f"seed {inp.seed}", group, _version(version))


def group_summary(inp: GroupRolloutInput, version: int | None = None) -> str:
    """`frozenlake · seed 17 · group g000012 × 4 · policy v5`, or for a wave `math · 3 groups × 4 · seeds 5…7`."""
    size, groups = inp.task.group_size, inp.groups
    mode = "lockstep" if inp.lockstep else None
    if len(groups) == 1:
        g = groups[0]
        return one_line(
            inp.task.name, f"seed {g.seed}", f"group {_short(g.group_id, inp.job_id)} × {size}", mode, _version(version)
        )
    seeds = f"seeds {groups[0].seed}…{groups[-1].seed}"
    return one_line(inp.task.name, f"{len(groups)} groups × {size}", seeds, mode, _version(version))


def batch_summary(inp: BatchRolloutInput, version: int | None = None) -> str:
    """`lockstep batch · 16 episodes · frozenlake ×8, math ×8 · policy v5`."""
    tasks = Counter(t.task.name for t in inp.trajectories)
    return one_line(
        "lockstep batch",
        f"{len(inp.trajectories)} episodes",
        ", ".join(f"{name} ×{k}" for name, k in tasks.items()),
        _version(version),
    )


def _reason(error: str | None) -> str:
    """The short why of a failure: `step failed: EnvBroken` out of `step failed: EnvBroken: the env raised ...`."""
    lines = (error or "").strip().splitlines()
    first = lines[0] if lines else "unknown"
    return ": ".join(first.split(": ")[:2])[:_REASON_MAX]


def _versions(results: Sequence[TrajectoryResult]) -> str | None:
    lows = [r.policy_version_min for r in results if r.policy_version_min is not None]
    highs = [r.policy_version_max for r in results if r.policy_version_max is not None]
    return f"v{min(lows)}..v{max(highs)}" if lows and highs else None


@dataclass(frozen=True)
class Outcome:
    """What a rollout workflow's list row shows: one value per attribute, over its members when it has several."""

    members: int
    completed: int
    successes: int
    reward: float | None  # the mean over completed members
    success: bool | None  # whether any completed member succeeded
    turns: int  # the longest member's
    versions: str | None
    failure: str | None  # the first failed member's reason

    @classmethod
    def of(cls, results: Sequence[TrajectoryResult]) -> Outcome:
        done = [r for r in results if r.status == "completed"]
        rewards = [r.reward for r in done if r.reward is not None]
        failed = next((r for r in results if r.status != "completed"), None)
        return cls(
            members=len(results),
            completed=len(done),
            successes=sum(bool(r.success) for r in done),
            reward=statistics.fmean(rewards) if rewards else None,
            success=any(bool(r.success) for r in done) if done else None,
            turns=max((r.turns for r in results), default=0),
            versions=_versions(results),
            failure=_reason(failed.error) if failed else None,
        )

    @property
    def status(self) -> str:
        """completed | failed | partial (some members failed)."""
        if self.completed == self.members:
            return "completed"
        return "failed" if self.completed == 0 else "partial"

    def attributes(self) -> list[SearchAttributeUpdate]:
        """The search attributes to upsert; one with no value (no reward of a failed trajectory) is left unset."""
        updates: list[SearchAttributeUpdate] = [sa.STATUS.value_set(self.status), sa.TURNS.value_set(self.turns)]
        if self.reward is not None:
            updates.append(sa.REWARD.value_set(self.reward))
        if self.success is not None:
            updates.append(sa.SUCCESS.value_set(self.success))
        if self.versions is not None:
            updates.append(sa.VERSIONS.value_set(self.versions))
        if self.failure is not None:
            updates.append(sa.FAILURE.value_set(self.failure))
        return updates


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _error(error: str | None) -> str:
    text = " ".join((error or "unknown").split())
    return text if len(text) <= _ERROR_MAX else text[: _ERROR_MAX - 1] + "…"


def details(results: Sequence[TrajectoryResult]) -> str:
    """The markdown of the workflow's page: one trajectory's outcome, or a group's (or batch's) with a row each."""
    if len(results) == 1:
        r = results[0]
        head = (
            f"**completed** · reward **{_reward(r.reward)}** · success: {_yes_no(r.success)}"
            if r.status == "completed"
            else f"**failed** (masked out of training, never scored): `{_cell(_error(r.error))}`"
        )
        facts = [
            f"{r.turns} turn(s)",
            f"policy {_versions([r]) or '-'}",
            f"task {r.task}",
            f"seed {r.seed}",
            f"tokens {r.prompt_tokens} prompt + {r.completion_tokens} completion",
            f"env worker `{r.env_worker}`" if r.env_worker else None,
            f"restores {r.restores}" if r.restores else None,
        ]
        return head + "\n\n" + " · ".join(f for f in facts if f)
    o = Outcome.of(results)
    head = [
        f"**{o.status}**",
        f"{o.successes}/{o.members} succeeded",
        f"mean reward {_reward(o.reward)}",
        f"longest {o.turns} turn(s)",
        f"policy {o.versions or '-'}",
    ]
    if o.completed < o.members:
        head.insert(2, f"{o.members - o.completed} failed (masked: `{_cell(o.failure)}`)")
    rows = ["| trajectory | status | reward | success | turns | versions |", "|---|---|---|---|---|---|"]
    rows += [
        f"| {_cell(r.trajectory_id)} | {r.status} | {_reward(r.reward)} | {_yes_no(r.success)} | {r.turns} | "
        f"{_versions([r]) or '-'} |"
        for r in results[:DETAILS_MAX_ROWS]
    ]
    more = len(results) - DETAILS_MAX_ROWS
    return " · ".join(head) + "\n\n" + "\n".join(rows) + (f"\n\n… and {more} more" if more > 0 else "")


def _started_with_rollart_attributes() -> bool:
    """The starter set rollart's search attributes, so it had them registered on the namespace."""
    attrs = workflow.info().typed_search_attributes
    return attrs.get(sa.JOB_ID) is not None or attrs.get(sa.TASK) is not None


def show_outcome(results: Sequence[TrajectoryResult]) -> None:
    """At a rollout workflow's end: its details for its page, and its outcome attributes (when it may upsert them)."""
    if not results:
        return
    workflow.set_current_details(details(results))
    if _started_with_rollart_attributes():
        workflow.upsert_search_attributes(Outcome.of(results).attributes())
