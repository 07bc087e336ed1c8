"""An env session on one worker, and how a call to it survives that worker's death (sticky-session failover)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel

from rollart.contracts.activities import (
    ActivityName,
    CloseInput,
    EnvHandle,
    EnvOptions,
    GroupHandle,
    RestoreInput,
    TurnRecord,
)
from rollart.contracts.rollouts import TrajectoryInput
from rollart.spec.chat import ChatMessage
from rollart.spec.pools import queue_name
from rollart.workflows.driver.calls import CallFailed, Calls
from rollart.workflows.policies import MAX_RESTORES

__all__ = ["Player", "call_sticky", "close_session", "restore"]


class Player(Protocol):
    """What a restore needs of each member of a session: the actions it played and the observation it last saw."""

    turns: list[TurnRecord]
    observation: str
    restores: int


async def call_sticky(
    calls: Calls,
    owner: Any,
    activity: ActivityName,
    make_arg: Callable[[Any], BaseModel],
    *,
    result_type: Any,
    timeout_s: float,
) -> Any:
    """Call `activity` on the worker holding `owner.handle`'s session; if that worker is gone, restore every member
    of the session on another worker (same seed, recorded actions replayed, last observation checked) and call
    it there. `owner` is an Episode or a GroupEpisode: it has `handle`, `members`, `inp` and `owner_id`."""
    while True:
        try:
            return await calls.call(
                activity,
                make_arg(owner.handle),
                queue=owner.handle.queue,
                result_type=result_type,
                timeout_s=timeout_s,
                start_wait_s=owner.handle.sticky_start_s,
            )
        except CallFailed as err:
            if not err.session_lost or owner.members[0].restores >= MAX_RESTORES:
                raise
            calls.logger.warning("%s: %s; restoring its env elsewhere", owner.owner_id, err.message)
            for member in owner.members:
                member.restores += 1
            owner.rehome(await restore(calls, owner.inp, owner.owner_id, owner.members))


async def restore(calls: Calls, inp: TrajectoryInput, owner_id: str, members: list[Player]) -> GroupHandle:
    """Rebuild the session of `members` (one trajectory, or a lockstep group) on a live env worker."""
    task = inp.task
    return await calls.call(
        ActivityName.RESTORE,
        RestoreInput(
            env=task.env,
            env_args=task.env_args,
            seed=inp.seed,
            owner_id=owner_id,
            actions=[[t.action for t in m.turns] for m in members],
            observations=[m.observation for m in members],
            options=EnvOptions.of(task),
            messages=_messages(members),
        ),
        queue=queue_name(task.env_queue, inp.queue_prefix),
        result_type=GroupHandle,
    )


def _messages(members: list[Player]) -> list[list[ChatMessage]] | None:
    """A chat env's actions as the messages it was given, to replay them (None: a text env's, replayed as text)."""
    if not any(t.message is not None for m in members for t in m.turns):
        return None
    return [[t.message or ChatMessage(role="assistant", content=t.action) for t in m.turns] for m in members]


async def close_session(calls: Calls, handle: EnvHandle | GroupHandle) -> None:
    """Release a session; failure here only logs (the session dies with its worker anyway)."""
    session_id = handle.session_id
    try:
        await calls.call(
            ActivityName.CLOSE,
            CloseInput(session_id=session_id),
            queue=handle.queue,
            start_wait_s=handle.sticky_start_s,
        )
    except CallFailed as err:
        calls.logger.warning("closing session %s failed: %s", session_id, err.message)
