"""Connecting to Temporal: one data converter (pydantic + external storage) for clients and workers alike, over
TLS and with an API key when the job says so (infra/temporal/tls.py)."""

from __future__ import annotations

import dataclasses
import functools
import re
from datetime import timedelta

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode

from rollart.infra.store.payload import open_store
from rollart.infra.temporal.payload_storage import ClaimingPayloadConverter, external_storage
from rollart.infra.temporal.tls import (
    TemporalSecurityError,
    certificate_verdict,
    client_credentials,
    closed_connection_hint,
    security_problem,
)
from rollart.infra.waiting import Backoff, wait_for
from rollart.spec.config import StoreConfig, TemporalConfig

__all__ = [
    "DEFAULT_ADDRESS",
    "NamespaceNotFound",
    "TemporalAddressError",
    "TemporalSecurityError",
    "api_key_from_file",
    "connect",
    "data_converter",
    "runtime",
    "ui_url",
]

DEFAULT_ADDRESS = "127.0.0.1:7233"


def data_converter(store: StoreConfig) -> DataConverter:
    """Pydantic JSON payloads; those over the store's threshold go to the store by reference."""
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=ClaimingPayloadConverter,
        external_storage=external_storage(open_store(store), store.payload_threshold_bytes),
    )


@functools.cache
def runtime(heartbeat_s: float) -> Runtime:
    """The SDK runtime of this process's clients: the default, but with worker heartbeats every `heartbeat_s`.

    The heartbeats are what the stall checks read (infra/temporal/liveness.py): a worker whose slots are all busy
    does not poll, but it still heartbeats, and a killed one stops at once. One runtime per interval.
    """
    return Runtime(telemetry=TelemetryConfig(), worker_heartbeat_interval=timedelta(seconds=heartbeat_s))


_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})$")


class TemporalAddressError(ConnectionError):
    """The address cannot name a server (malformed, or a host that does not resolve): waiting will not help."""


class NamespaceNotFound(ConnectionError):
    """The server answers but has no such namespace: waiting will not help."""


async def connect(temporal: TemporalConfig, store: StoreConfig, wait: Backoff | None = None) -> Client:
    """A client for the job's server (the local default when no address is set), over TLS and with an API key
    when the settings say so (`temporal.tls`, `temporal.api_key_env`).

    Without `wait` (clients) an unreachable server fails at once. With it (workers) a server that is
    down or still starting is waited for, with `wait`'s backoff and limit, while a malformed or
    unresolvable address (`TemporalAddressError`), a namespace the server lacks (`NamespaceNotFound`), or
    TLS and credentials that stand in the way (`TemporalSecurityError`: a certificate refused, a file that
    cannot be read, an API key not set or not accepted) fail at once.
    """
    address = temporal.address or DEFAULT_ADDRESS
    _check_address(address)
    if wait is None:
        try:
            return await _client(address, temporal, data_converter(store))
        except RuntimeError as e:
            raise ConnectionError(
                f"cannot reach the Temporal server at {address} (namespace {temporal.namespace!r}): {e}"
                f"{closed_connection_hint(str(e), temporal)}. Start one with `rollart up`, or pass "
                "--temporal-address HOST:PORT."
            ) from e
    converter = data_converter(store)

    async def attempt() -> Client:
        client = await _client(address, temporal, converter)
        await _check_namespace(client, address, temporal)
        return client

    return await wait_for(f"Temporal at {address}", attempt, lambda e: _transient(e, address, temporal), wait)


def api_key_from_file(temporal: TemporalConfig) -> str | None:
    """The API key in `temporal.api_key_file` (a mounted Secret on Kubernetes), read at each connect: a rotated
    Secret is picked up by the next connection. None without the setting."""
    path = temporal.api_key_file
    if path is None:
        return None
    try:
        key = path.expanduser().read_text().strip()
    except OSError as e:
        raise TemporalSecurityError(f"temporal.api_key_file: cannot read {path}: {e.strerror or e}") from e
    if not key:
        raise TemporalSecurityError(f"temporal.api_key_file: {path} is empty; write the API key in it")
    return key


async def _client(address: str, temporal: TemporalConfig, converter: DataConverter) -> Client:
    """`Client.connect` with the settings' TLS and API key; what stands in their way is a TemporalSecurityError."""
    tls, api_key = client_credentials(temporal)
    api_key = api_key or api_key_from_file(temporal)
    try:
        return await Client.connect(
            address,
            namespace=temporal.namespace,
            data_converter=converter,
            tls=tls,
            api_key=api_key,
            runtime=runtime(temporal.worker_heartbeat_s),
            interceptors=_interceptors(temporal),
        )
    except RuntimeError as e:
        if "dns error" in str(e):
            raise TemporalAddressError(f"cannot resolve the host of the Temporal address {address!r}: {e}") from e
        problem = security_problem(e, address, temporal)
        if problem is None and temporal.secured and closed_connection_hint(str(e), temporal):
            problem = await certificate_verdict(address, temporal)  # closed at once: was it our certificate?
        if problem:
            raise TemporalSecurityError(problem) from e
        raise


def _interceptors(temporal: TemporalConfig) -> list:
    """OpenTelemetry tracing when the job asks for it (imported only then: infra/temporal/tracing.py)."""
    if temporal.tracing is None:
        return []
    from rollart.infra.temporal.tracing import tracing_interceptors

    return tracing_interceptors(temporal.tracing)


def _check_address(address: str) -> None:
    """HOST:PORT with a port in range; anything else is a configuration error, not a server that is down."""
    m = _HOST_PORT.match(address)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise TemporalAddressError(f"bad Temporal address {address!r}: expected HOST:PORT (e.g. 127.0.0.1:7233)")


async def _check_namespace(client: Client, address: str, temporal: TemporalConfig) -> None:
    """Fail at once, naming it, when the server has no such namespace or does not let this client in
    (Client.connect checks neither)."""
    namespace = temporal.namespace
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    except RPCError as e:
        if problem := security_problem(e, address, temporal):
            raise TemporalSecurityError(problem) from e
        if e.status is RPCStatusCode.NOT_FOUND:
            raise NamespaceNotFound(
                f"the Temporal server at {address} has no namespace {namespace!r}: create it "
                f"(`temporal operator namespace create --namespace {namespace}`) or pass --namespace"
            ) from e
        raise


def _transient(e: BaseException, address: str, temporal: TemporalConfig | None = None) -> str | None:
    """Why `e` is worth waiting out (the server is down, starting or restarting), or None to fail now.

    TLS and credential failures never get here as RuntimeErrors: `_client` raises them as TemporalSecurityError.
    """
    text = str(e)
    if isinstance(e, RPCError):
        return f"{e.status.name if e.status else 'error'}: {e.message}" if e.status in _TRANSIENT_RPC else None
    if not isinstance(e, RuntimeError):
        return None
    if "dns error" in text:
        raise TemporalAddressError(f"cannot resolve the host of the Temporal address {address!r}: {text}") from e
    temporal = temporal or TemporalConfig()
    for needle, why in (
        ("ConnectionRefused", "connection refused"),
        ("Connection refused", "connection refused"),
        ("ConnectionReset", "connection reset"),
        ("timed out", "timed out"),
        ("Unavailable", "unavailable"),
        ("tcp connect error", "cannot connect"),
        ("close_notify", "connection closed"),
        ("connection closed", "connection closed"),
        ("roken pipe", "connection closed"),
    ):
        if needle in text:
            return why + closed_connection_hint(text, temporal)
    return None


_TRANSIENT_RPC = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}


def ui_url(ui_base: str, namespace: str, workflow_id: str, run_id: str | None = None) -> str:
    """The Temporal UI page of one workflow run."""
    url = f"{ui_base.rstrip('/')}/namespaces/{namespace}/workflows/{workflow_id}"
    return f"{url}/{run_id}/history" if run_id else url
