"""Connecting to Temporal: one data converter (pydantic + external storage) for clients and workers alike."""

from __future__ import annotations

import dataclasses
import functools
import re
from datetime import timedelta

from rollart.infra.config import StoreConfig, TemporalConfig
from rollart.infra.payload_storage import external_storage
from rollart.infra.store import open_store
from rollart.infra.waiting import Backoff, wait_for
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode

__all__ = ["DEFAULT_ADDRESS", "NamespaceNotFound", "TemporalAddressError", "connect", "data_converter", "runtime",
           "ui_url"]  # fmt: skip

DEFAULT_ADDRESS = "127.0.0.1:7233"


def data_converter(store: StoreConfig) -> DataConverter:
    """Pydantic JSON payloads; those over the store's threshold go to the store by reference."""
    return dataclasses.replace(
        pydantic_data_converter,
        external_storage=external_storage(open_store(store), store.payload_threshold_bytes),
    )


@functools.cache
def runtime(heartbeat_s: float) -> Runtime:
    """The SDK runtime of this process's clients: the default, but with worker heartbeats every `heartbeat_s`.

    The heartbeats are what the stall checks read (infra/liveness.py): a worker whose slots are all busy
    does not poll, but it still heartbeats, and a killed one stops at once. One runtime per interval.
    """
    return Runtime(telemetry=TelemetryConfig(), worker_heartbeat_interval=timedelta(seconds=heartbeat_s))


_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})$")


class TemporalAddressError(ConnectionError):
    """The address cannot name a server (malformed, or a host that does not resolve): waiting will not help."""


class NamespaceNotFound(ConnectionError):
    """The server answers but has no such namespace: waiting will not help."""


async def connect(temporal: TemporalConfig, store: StoreConfig, wait: Backoff | None = None) -> Client:
    """A client for the job's server (the local default when no address is set).

    Without `wait` (clients) an unreachable server fails at once. With it (workers) a server that is
    down or still starting is waited for, with `wait`'s backoff and limit, while a malformed or
    unresolvable address (`TemporalAddressError`) or a namespace the server lacks (`NamespaceNotFound`)
    fails at once.
    """
    address = temporal.address or DEFAULT_ADDRESS
    _check_address(address)
    if wait is None:
        try:
            return await Client.connect(address, namespace=temporal.namespace, data_converter=data_converter(store),
                                        runtime=runtime(temporal.worker_heartbeat_s))  # fmt: skip
        except RuntimeError as e:
            if "dns error" in str(e):
                raise TemporalAddressError(f"cannot resolve the host of the Temporal address {address!r}: {e}") from e
            raise ConnectionError(
                f"cannot reach the Temporal server at {address} (namespace {temporal.namespace!r}): {e}. "
                "Start one with `rollart up`, or pass --temporal-address HOST:PORT."
            ) from e
    converter = data_converter(store)

    async def attempt() -> Client:
        client = await Client.connect(address, namespace=temporal.namespace, data_converter=converter,
                                      runtime=runtime(temporal.worker_heartbeat_s))  # fmt: skip
        await _check_namespace(client, address, temporal.namespace)
        return client

    return await wait_for(f"Temporal at {address}", attempt, lambda e: _transient(e, address), wait)


def _check_address(address: str) -> None:
    """HOST:PORT with a port in range; anything else is a configuration error, not a server that is down."""
    m = _HOST_PORT.match(address)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise TemporalAddressError(f"bad Temporal address {address!r}: expected HOST:PORT (e.g. 127.0.0.1:7233)")


async def _check_namespace(client: Client, address: str, namespace: str) -> None:
    """Fail at once, naming it, when the server has no such namespace (Client.connect does not check)."""
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    except RPCError as e:
        if e.status is RPCStatusCode.NOT_FOUND:
            raise NamespaceNotFound(
                f"the Temporal server at {address} has no namespace {namespace!r}: create it "
                f"(`temporal operator namespace create --namespace {namespace}`) or pass --namespace"
            ) from e
        raise


def _transient(e: BaseException, address: str) -> str | None:
    """Why `e` is worth waiting out (the server is down, starting or restarting), or None to fail now."""
    text = str(e)
    if isinstance(e, RPCError):
        return f"{e.status.name if e.status else 'error'}: {e.message}" if e.status in _TRANSIENT_RPC else None
    if not isinstance(e, RuntimeError):
        return None
    if "dns error" in text:
        raise TemporalAddressError(f"cannot resolve the host of the Temporal address {address!r}: {text}") from e
    for needle, why in (("ConnectionRefused", "connection refused"), ("Connection refused", "connection refused"),
                        ("ConnectionReset", "connection reset"), ("timed out", "timed out"),
                        ("Unavailable", "unavailable"), ("tcp connect error", "cannot connect")):  # fmt: skip
        if needle in text:
            return why
    return None


_TRANSIENT_RPC = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}


def ui_url(ui_base: str, namespace: str, workflow_id: str, run_id: str | None = None) -> str:
    """The Temporal UI page of one workflow run."""
    url = f"{ui_base.rstrip('/')}/namespaces/{namespace}/workflows/{workflow_id}"
    return f"{url}/{run_id}/history" if run_id else url
