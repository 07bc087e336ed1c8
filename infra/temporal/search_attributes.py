"""Custom search attributes on every rollart workflow: filter runs by job, task, policy version, step, and outcome.

Used in the Temporal UI and `temporal workflow list --query 'RollartJobId="..."'`. A rollout workflow
(trajectory, group, lockstep batch) adds its outcome when it ends: `RollartStatus`, `RollartReward`,
`RollartSuccess`, `RollartTurns`, `RollartVersions`, `RollartFailure` (workflows/ui_summary.py).
The local dev server registers them at start; `ensure_registered` adds them to any other server (a
cluster or Temporal Cloud namespace needs them once; `rollart train`, `rollart rollout` and every
control worker check). A namespace on SQL visibility (the dev server's SQLite too) holds at most 3
custom attributes of each of Int, Double and Bool and 10 Keyword: rollart takes every Int slot.
"""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "FAILURE",
    "JOB_ID",
    "POLICY_VERSION",
    "REWARD",
    "STATUS",
    "STEP",
    "SUCCESS",
    "TASK",
    "TURNS",
    "VERSIONS",
    "dev_server_flags",
    "ensure_registered",
    "try_register",
]

log = logging.getLogger(__name__)

JOB_ID = SearchAttributeKey.for_keyword("RollartJobId")
TASK = SearchAttributeKey.for_keyword("RollartTask")
POLICY_VERSION = SearchAttributeKey.for_int("RollartPolicyVersion")
STEP = SearchAttributeKey.for_int("RollartStep")
# a rollout workflow's outcome, set when it ends
STATUS = SearchAttributeKey.for_keyword("RollartStatus")
"""completed | failed (masked out of training, never scored); a group or batch: partial when only some failed."""
REWARD = SearchAttributeKey.for_float("RollartReward")
"""The reward; a group or batch: the mean over its completed members. Unset when nothing completed."""
SUCCESS = SearchAttributeKey.for_bool("RollartSuccess")
"""Whether the episode succeeded; a group or batch: whether any member did. Unset when nothing completed."""
TURNS = SearchAttributeKey.for_int("RollartTurns")
"""Turns played; a group or batch: its longest member's."""
VERSIONS = SearchAttributeKey.for_keyword("RollartVersions")
"""The policy versions that generated it, `v<min>..v<max>` (as `rollart show` prints them)."""
FAILURE = SearchAttributeKey.for_keyword("RollartFailure")
"""Why it failed, short (`step failed: EnvBroken`); a group or batch: its first failed member's reason."""

_ALL = {
    key.name: kind
    for key, kind in [
        (JOB_ID, "Keyword"),
        (TASK, "Keyword"),
        (POLICY_VERSION, "Int"),
        (STEP, "Int"),
        (STATUS, "Keyword"),
        (REWARD, "Double"),
        (SUCCESS, "Bool"),
        (TURNS, "Int"),
        (VERSIONS, "Keyword"),
        (FAILURE, "Keyword"),
    ]
}
_INDEXED = {
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    "Double": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE,
    "Bool": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
}

_NO_ANSWER = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)


def dev_server_flags() -> dict[str, str]:
    """name → type, for `temporal server start-dev --search-attribute name=type` (a new database only: the dev
    server adds none to one it already has, so `ensure_registered` still runs)."""
    return dict(_ALL)


async def ensure_registered(client: Client) -> list[str]:
    """Register any missing rollart search attribute on the client's namespace; returns the ones added.

    Another process registering them at the same moment (two control workers starting) is no error."""
    missing = await _missing(client)
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
        except RPCError:
            if await _missing(client):
                raise
    return sorted(missing)


async def _missing(client: Client) -> dict[str, IndexedValueType.ValueType]:
    have = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=client.namespace))
    return {k: _INDEXED[v] for k, v in _ALL.items() if k not in have.custom_attributes}


async def try_register(client: Client) -> bool:
    """`ensure_registered`, for callers that can do without the attributes: False (and a warning) if the server
    refused (no permission, or the namespace's visibility has no room for another attribute of a type). A server
    that did not answer is not a refusal: that error is raised, for the caller to wait it out."""
    try:
        await ensure_registered(client)
    except RPCError as e:
        if e.status in _NO_ANSWER:
            raise
        log.warning(
            "cannot register rollart's search attributes on namespace %r (%s): without them the Temporal UI "
            "cannot list rollouts by job, task or outcome; register them once with `temporal operator "
            "search-attribute create --name NAME --type TYPE` for each of %s",
            client.namespace,
            e,
            ", ".join(f"{k} ({v})" for k, v in _ALL.items()),
        )
        return False
    return True
