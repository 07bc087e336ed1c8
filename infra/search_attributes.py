"""Custom search attributes on every rollart workflow: filter runs by job, task, policy version, step.

Used in the Temporal UI and `temporal workflow list --query 'RollartJobId="..."'`.
The local dev server registers them at start; `ensure_registered` adds them to
any other server (a cluster or Temporal Cloud namespace needs them once).
"""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

__all__ = ["JOB_ID", "POLICY_VERSION", "STEP", "TASK", "dev_server_flags", "ensure_registered"]

JOB_ID = SearchAttributeKey.for_keyword("RollartJobId")
TASK = SearchAttributeKey.for_keyword("RollartTask")
POLICY_VERSION = SearchAttributeKey.for_int("RollartPolicyVersion")
STEP = SearchAttributeKey.for_int("RollartStep")

_ALL = {JOB_ID.name: "Keyword", TASK.name: "Keyword", POLICY_VERSION.name: "Int", STEP.name: "Int"}
_INDEXED = {"Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT}


def dev_server_flags() -> dict[str, str]:
    """name → type, for `temporal server start-dev --search-attribute name=type`."""
    return dict(_ALL)


async def ensure_registered(client: Client) -> list[str]:
    """Register any missing rollart search attribute on the client's namespace; returns the ones added."""
    ns = client.namespace
    have = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=ns))
    missing = {k: _INDEXED[v] for k, v in _ALL.items() if k not in have.custom_attributes}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=ns, search_attributes=missing)
        )
    return sorted(missing)
