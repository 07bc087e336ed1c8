"""The autoscaler's decision, as a pure function of what it has seen: backlog in, worker count out.

No I/O and no clock: `decide` takes the time as an argument, so sequences of backlogs can be
replayed in tests. Rules (`ElasticPoolConfig` holds the numbers):

- a backlog means every worker is full: add ceil(backlog / per_worker) workers;
- no backlog while work still arrives: keep the workers there are;
- an idle queue: go to min_workers;
- always within [min_workers, max_workers];
- scale up at most once per `scale_up_cooldown_s` (the backlog count lags ~5 s: scaling again
  before it refreshes would count the same backlog twice);
- scale down only to the highest target recommended during the last `scale_down_cooldown_s`,
  and not within that long of the last change: a dip in the backlog does not stop workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from rollart.spec.pools import ElasticPoolConfig

__all__ = ["IDLE_ADD_RATE", "ScaleDecision", "ScaleState", "decide", "recommend"]

IDLE_ADD_RATE = 0.05
"""Tasks added per second below which a queue without backlog counts as idle."""


@dataclass(frozen=True)
class ScaleState:
    """What the scaler remembers between polls: its target and when it last changed, and recent recommendations."""

    target: int
    changed_at: float
    last_up_at: float = -math.inf
    recent: tuple[tuple[float, int], ...] = field(default=())

    @classmethod
    def initial(cls, cfg: ElasticPoolConfig, now: float) -> ScaleState:
        """Start at min_workers."""
        return cls(target=cfg.min_workers, changed_at=now)


@dataclass(frozen=True)
class ScaleDecision:
    """One poll's outcome, as the log line shows it."""

    at: float
    backlog: int
    add_rate: float
    before: int
    recommended: int
    target: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.target != self.before

    def describe(self) -> str:
        arrow = f"{self.before} -> {self.target}" if self.changed else f"{self.target}"
        return (
            f"backlog {self.backlog}, adding {self.add_rate:.1f}/s: workers {arrow} "
            f"(recommended {self.recommended}; {self.reason})"
        )


def recommend(cfg: ElasticPoolConfig, current: int, backlog: int, add_rate: float) -> int:
    """The worker count this one observation asks for, within the bounds."""
    if backlog > 0:
        want = current + math.ceil(backlog / cfg.per_worker)
    elif add_rate > IDLE_ADD_RATE:
        want = current
    else:
        want = cfg.min_workers
    return max(cfg.min_workers, min(cfg.max_workers, want))


def decide(
    cfg: ElasticPoolConfig, state: ScaleState, backlog: int, add_rate: float, now: float
) -> tuple[ScaleState, ScaleDecision]:
    """The next state and the decision, given the backlog and add rate observed at `now`."""
    rec = recommend(cfg, state.target, backlog, add_rate)
    recent = (*tuple((t, r) for t, r in state.recent if now - t < cfg.scale_down_cooldown_s), (now, rec))
    state = replace(state, recent=recent)
    target, reason = state.target, "steady"
    if rec > state.target:
        if now - state.last_up_at >= cfg.scale_up_cooldown_s:
            target, reason = rec, "scale up"
        else:
            reason = f"scale-up cooldown ({cfg.scale_up_cooldown_s - (now - state.last_up_at):.0f}s left)"
    elif rec < state.target:
        stable = max(r for _, r in recent)
        since = now - state.changed_at
        if since < cfg.scale_down_cooldown_s:
            reason = f"scale-down cooldown ({cfg.scale_down_cooldown_s - since:.0f}s left)"
        elif stable < state.target:
            target, reason = stable, f"lower for {cfg.scale_down_cooldown_s:g}s: scale down"
        else:
            reason = "recently needed more: holding"
    elif state.target == cfg.max_workers and backlog > 0:
        reason = "at max_workers"
    decision = ScaleDecision(
        at=now, backlog=backlog, add_rate=add_rate, before=state.target, recommended=rec, target=target, reason=reason
    )
    if target != state.target:
        state = replace(
            state, target=target, changed_at=now, last_up_at=now if target > state.target else state.last_up_at
        )
    return state, decision
