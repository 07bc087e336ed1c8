"""Connecting to Temporal: one data converter (pydantic + external storage) for clients and workers alike, over
TLS and with an API key when the job says so (infra/temporal/tls.py), under Temporal's own configuration.

Where to connect, in order (`with_environment`): rollart's flags, the job's `temporal` section, Temporal's own
variables (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS*`), the profile of its config
file (`TEMPORAL_CONFIG_FILE`, else `~/.config/temporalio/temporal.toml`; profile `TEMPORAL_PROFILE`, else
`default`), then rollart's default: no address anywhere starts the local dev server. Credentials follow their
address: the TLS and API key of Temporal's configuration are used only to reach the address it names, and a job
that sets `tls` or an API key uses only its own.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from datetime import timedelta
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from rollart.infra.store.payload import open_store
from rollart.infra.temporal.payload_storage import ClaimingPayloadConverter, external_storage
from rollart.infra.temporal.tls import (
    TemporalSecurityError,
    certificate_verdict,
    client_credentials,
    closed_connection_hint,
    handshake_problem,
    security_problem,
)
from rollart.infra.waiting import Backoff, wait_for
from rollart.spec.config import StoreConfig, TemporalConfig
from rollart.spec.config.temporal import TemporalTLS

__all__ = [
    "DEFAULT_ADDRESS",
    "NamespaceNotFound",
    "TemporalAddressError",
    "TemporalSecurityError",
    "connect",
    "data_converter",
    "runtime",
    "temporal_profile",
    "ui_url",
    "with_environment",
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


def temporal_profile() -> ClientConfigProfile:
    """Temporal's own client configuration of this process (`temporalio.envconfig`): the config file's profile with
    the `TEMPORAL_*` variables over it. A named file or profile that is not there is a TemporalAddressError."""
    named = os.environ.get("TEMPORAL_CONFIG_FILE")
    if named and not Path(named).expanduser().is_file():
        raise TemporalAddressError(f"TEMPORAL_CONFIG_FILE names {named}, which is not a file: fix or unset it")
    try:
        return ClientConfigProfile.load()
    except Exception as e:  # the SDK's ConfigError (a profile not found, a file that does not parse)
        raise TemporalAddressError(f"Temporal's configuration (TEMPORAL_CONFIG_FILE/TEMPORAL_PROFILE): {e}") from e


def with_environment(temporal: TemporalConfig, profile: ClientConfigProfile | None = None) -> TemporalConfig:
    """`temporal` completed from Temporal's own configuration (`temporal_profile`) where the job leaves it open.

    The address when the job names none (so `TEMPORAL_ADDRESS` means "not the local dev server"), the namespace
    when the job does not set it; and, when the address is the one Temporal's configuration names, its TLS files
    and `TEMPORAL_API_KEY` for whichever of the two the job does not set. Inline certificate data or a key written
    in the config file have no spec field: `_client` takes them from the profile itself (`_profile_credentials`).
    """
    profile = profile or temporal_profile()
    update: dict[str, object] = {}
    if "namespace" not in temporal.model_fields_set and profile.namespace:
        update["namespace"] = profile.namespace
    if temporal.address is None and profile.address:
        update["address"] = profile.address
    if profile.address and (temporal.address or profile.address) == profile.address:
        tls = profile.tls
        if temporal.tls is None and tls is not None and not tls.disabled and _all_paths(tls):
            update["tls"] = TemporalTLS(
                ca=tls.server_root_ca_cert,
                cert=tls.client_cert,
                key=tls.client_private_key,
                server_name=tls.server_name,
            )
        key = os.environ.get("TEMPORAL_API_KEY", "").strip()
        if not temporal.has_api_key and key and key == profile.api_key:
            update["api_key_env"] = "TEMPORAL_API_KEY"
    return temporal.model_copy(update=update) if update else temporal


def _all_paths(tls: ClientConfigTLS) -> bool:
    """Whether the profile names its certificates by file (which the spec's `tls` can hold), not inline."""
    sources = (tls.server_root_ca_cert, tls.client_cert, tls.client_private_key)
    return all(s is None or isinstance(s, Path) for s in sources)


def _profile_credentials(
    address: str, temporal: TemporalConfig, tls: TLSConfig | None, api_key: str | None
) -> tuple[TLSConfig | None, str | None]:
    """`tls` and `api_key` completed with what Temporal's configuration holds for `address` and the spec cannot
    (inline certificate data, an API key written in the config file), each only where the job sets none."""
    if (tls is not None or temporal.tls is not None) and (api_key is not None or temporal.has_api_key):
        return tls, api_key
    profile = temporal_profile()
    if profile.address != address:
        return tls, api_key
    if tls is None and temporal.tls is None and profile.tls is not None and not profile.tls.disabled:
        made = profile.tls.to_connect_tls_config()
        tls = made if isinstance(made, TLSConfig) else None
    if api_key is None and not temporal.has_api_key:
        api_key = profile.api_key
    return tls, api_key


async def connect(temporal: TemporalConfig, store: StoreConfig, wait: Backoff | None = None) -> Client:
    """A client for the job's server (the local default when no address is set), over TLS and with an API key
    when the settings say so (`temporal.tls`, `temporal.api_key_env`).

    Without `wait` (clients) an unreachable server fails at once. With it (workers) a server that is
    down or still starting is waited for, with `wait`'s backoff and limit, while a malformed or
    unresolvable address (`TemporalAddressError`), a namespace the server lacks (`NamespaceNotFound`), or
    TLS and credentials that stand in the way (`TemporalSecurityError`: a certificate refused, a file that
    cannot be read, an API key not set or not accepted) fail at once.
    """
    temporal = with_environment(temporal)
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


async def _client(address: str, temporal: TemporalConfig, converter: DataConverter) -> Client:
    """`Client.connect` with the settings' TLS and API key; what stands in their way is a TemporalSecurityError."""
    tls, api_key = client_credentials(temporal)
    tls, api_key = _profile_credentials(address, temporal, tls, api_key)
    if temporal.tls is not None and (problem := await handshake_problem(address, temporal)):
        raise TemporalSecurityError(problem)  # said from the handshake itself, before the SDK dials
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
