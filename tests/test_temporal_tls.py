"""Secured connections to Temporal: `temporal.tls` and `temporal.api_key_env`, from the spec and the flags to the
client, the workers and the CLI, against a dev server behind a TLS front that requires client certificates.

The dev server has no TLS of its own, so `TLSFront` (tests/support/tls.py) terminates mTLS in front of it and
relays the bytes: the SDK's TLS stack (rustls) meets a real handshake and real alerts. The API key travels inside
TLS, where a relay cannot read it: `FakeFrontend`, a gRPC server over mTLS that answers the calls a client makes
on connecting, records the metadata it was sent and refuses a wrong key as a server checking keys does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig
from temporalio.testing import WorkflowEnvironment

from rollart.cli.errors import UserError
from rollart.cli.main import build_parser
from rollart.cli.spec import load_spec
from rollart.cli.stack import connect_client, server_for
from rollart.cli.train import attach_command
from rollart.cli.worker import worker_settings
from rollart.client.connection import is_unreachable
from rollart.client.rollout import new_job_id, plan_trajectories, run_rollout
from rollart.infra.temporal.connection import TemporalSecurityError, connect
from rollart.infra.temporal.tls import certificate_verdict, closed_connection_hint, security_problem
from rollart.infra.waiting import Backoff
from rollart.spec.config import JobSpec, JobSpecError, StoreConfig, TemporalConfig, TemporalTLS, load_job
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack
from rollart.workers.pool_worker import serve
from rollart.workers.settings import WorkerSettings
from tests.support.cli import rollart
from tests.support.paths import REPO
from tests.support.standins import StandIns, standin_workers
from tests.support.tasks import frozenlake_task
from tests.support.tls import FakeFrontend, Pki, TLSFront, make_pki

ROLLART = [sys.executable, "-m", "rollart.cli"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _job(tmp_path: Path, **temporal: Any) -> JobSpec:
    return JobSpec(
        name="tls",
        tasks=[frozenlake_task(max_turns=2)],
        temporal=TemporalConfig(**temporal),
        store=StoreConfig(path=tmp_path / "store"),
    )


def _mtls(pki: Pki, **overrides: Any) -> TemporalTLS:
    return TemporalTLS(**{"ca": pki.ca, "cert": pki.client_cert, "key": pki.client_key, **overrides})


# ---------------------------------------------------------------- the spec and the flags


def _load(temporal: dict[str, Any]) -> JobSpec:
    return load_job(REPO / "examples" / "frozenlake.yaml", {"temporal": {"address": "t.example:7233", **temporal}})


@pytest.mark.parametrize(
    ("temporal", "expected"),
    [
        (
            {"tls": {"cert": "c.pem"}},
            "temporal.tls: Value error, tls.cert is set but tls.key is not: a client "
            "certificate goes with its private key; set both (mTLS), or neither",
        ),
        ({"tls": {"key": "k.pem"}}, "tls.key is set but tls.cert is not"),
        ({"tls": {"ca": "ca.pem", "pem": "x"}}, "temporal.tls.pem: Extra inputs are not permitted"),
        ({"tls": {"server_name": "a b"}}, "temporal.tls.server_name: String should match pattern"),
        ({"api_key_env": "sk-1234"}, "temporal.api_key_env: String should match pattern"),
    ],
)
def test_a_bad_tls_section_fails_on_load_naming_the_field(temporal: dict, expected: str) -> None:
    with pytest.raises(JobSpecError) as e:
        _load(temporal)
    assert expected in str(e.value) and "frozenlake.yaml" in str(e.value)


def test_tls_true_is_tls_with_the_trusted_roots_and_false_is_none() -> None:
    assert _load({"tls": True}).temporal.tls == TemporalTLS()
    assert _load({"tls": False}).temporal.tls is None
    secured = _load({"api_key_env": "TEMPORAL_API_KEY"}).temporal
    assert secured.secured and secured.tls is None and not _load({}).temporal.secured
    # the files are read when a process connects, not on load: a job rendered for a cluster names the pods' paths
    assert _load({"tls": {"ca": "/nowhere/ca.pem"}}).temporal.tls.ca == Path("/nowhere/ca.pem")


def test_every_command_that_connects_takes_the_tls_flags() -> None:
    """The flags set temporal.tls / api_key_env on the commands with a job (over the job's) and on status/attach."""
    parser = build_parser()
    flags = [
        "--temporal-tls-ca",
        "ca.pem",
        "--temporal-tls-cert",
        "c.pem",
        "--temporal-tls-key",
        "c.key",
        "--temporal-tls-server-name",
        "temporal.example",
        "--temporal-api-key-env",
        "MY_KEY",
    ]
    want = TemporalTLS(ca=Path("ca.pem"), cert=Path("c.pem"), key=Path("c.key"), server_name="temporal.example")
    example = str(REPO / "examples" / "frozenlake.yaml")
    for argv in (
        ["status", "j-1", *flags],
        ["attach", "j-1", *flags],
        ["show", "t-1", *flags],
        ["trajectories", "j-1", *flags],
        ["rollout", example, "--temporal-address", "t:7233", *flags],
        ["train", example, "--temporal-address", "t:7233", *flags],
    ):
        args = parser.parse_args(argv)
        temporal = load_spec(getattr(args, "job", None), args).temporal
        assert (temporal.tls, temporal.api_key_env) == (want, "MY_KEY"), argv[0]
    args = parser.parse_args(["status", "j-1", "--temporal-tls"])
    assert load_spec(None, args).temporal.tls == TemporalTLS()
    # workers: from a job, and without one; the settings (what the local stack and the autoscaler write to a
    # settings file for each worker process) carry them
    for job in (["--job", example], []):
        args = parser.parse_args(["worker", "--pool", "cpu", "--temporal-address", "t:7233", *job, *flags])
        settings = worker_settings(args, load_job(example) if job else None)
        assert settings.temporal.tls == want and settings.temporal.api_key_env == "MY_KEY"
        assert WorkerSettings.model_validate_json(settings.model_dump_json()).temporal == settings.temporal


def test_a_flag_given_the_key_instead_of_its_variable_says_so() -> None:
    args = build_parser().parse_args(["status", "j-1", "--temporal-api-key-env", "sk-live-1234"])
    with pytest.raises(UserError, match="--temporal-api-key-env: expected the NAME of an environment variable"):
        load_spec(None, args)


def test_the_reattach_command_carries_the_tls_flags() -> None:
    tls = TemporalTLS(ca=Path("certs/ca.pem"), cert=Path("certs/my client.pem"), key=Path("certs/c.key"))
    job = JobSpec(tasks=[frozenlake_task()], temporal=TemporalConfig(address="t:7233", tls=tls, api_key_env="K"))
    assert attach_command(job, "j-1") == (
        "rollart attach j-1 --temporal-address t:7233 --temporal-tls-ca certs/ca.pem --temporal-tls-cert "
        "'certs/my client.pem' --temporal-tls-key certs/c.key --temporal-api-key-env K"
    )
    roots = JobSpec(tasks=[frozenlake_task()], temporal=TemporalConfig(address="t:7233", tls=TemporalTLS()))
    assert attach_command(roots, "j-2") == "rollart attach j-2 --temporal-address t:7233 --temporal-tls"


def test_the_local_stack_serves_plain_grpc_and_a_secured_job_needs_an_address(tmp_path: Path) -> None:
    job = _job(tmp_path, address="t.example:7233", tls=TemporalTLS(ca=Path("ca.pem")), api_key_env="K")
    stack = LocalStack(job=job, home=tmp_path, port=17233)  # `rollart up --job`: the dev server has no TLS
    assert stack.temporal.address == "127.0.0.1:17233" and not stack.temporal.secured
    args = build_parser().parse_args(["rollout", "job.yaml"])
    unnamed = _job(tmp_path, tls=TemporalTLS(), api_key_env="K")
    said = r"job.yaml: temporal.tls and temporal.api_key_env are set but no server is named: set temporal.address"
    with pytest.raises(UserError, match=said), server_for(unnamed, args, training=False):
        pass


# ---------------------------------------------------------------- what connect() hands the SDK


@pytest.fixture
def sdk_connect(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Client.connect replaced by a recorder: the arguments connect() would dial the server with."""
    calls: list[dict[str, Any]] = []

    async def recorded(target_host: str, **kwargs: Any) -> str:
        calls.append({"target_host": target_host, **kwargs})
        return "client"

    monkeypatch.setattr(Client, "connect", recorded)
    return calls


async def test_connect_dials_with_the_files_the_server_name_and_the_api_key(
    tmp_path: Path, pki: Pki, sdk_connect: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLART_TEST_KEY", "  key-123\n")
    job = _job(
        tmp_path,
        address="t.example:7233",
        tls=_mtls(pki, server_name="temporal.example"),
        api_key_env="ROLLART_TEST_KEY",
    )
    assert await connect(job.temporal, job.store) == "client"
    (call,) = sdk_connect
    assert call["target_host"] == "t.example:7233" and call["api_key"] == "key-123"
    assert call["tls"] == TLSConfig(
        server_root_ca_cert=pki.ca.read_bytes(),
        client_cert=pki.client_cert.read_bytes(),
        client_private_key=pki.client_key.read_bytes(),
        domain="temporal.example",
    )
    # an API key alone: tls left to the SDK, which then uses TLS with the trusted roots; nothing: plain gRPC
    for temporal, (tls, key) in (
        (TemporalConfig(address="t:1", api_key_env="ROLLART_TEST_KEY"), (None, "key-123")),
        (TemporalConfig(address="t:1"), (None, None)),
    ):
        await connect(temporal, job.store)
        assert (sdk_connect[-1]["tls"], sdk_connect[-1]["api_key"]) == (tls, key)


async def test_what_cannot_be_read_fails_at_once_naming_the_setting(
    tmp_path: Path, pki: Pki, sdk_connect: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing or non-PEM file, an unset or empty variable: clients and waiting workers alike fail at once."""
    (tmp_path / "not.pem").write_text("hello")
    monkeypatch.delenv("ROLLART_UNSET_KEY", raising=False)
    monkeypatch.setenv("ROLLART_EMPTY_KEY", "")
    cases = [
        (
            TemporalTLS(ca=tmp_path / "missing.pem"),
            None,
            rf"temporal.tls.ca: cannot read {tmp_path}/missing.pem: "
            "No such file or directory",
        ),
        (
            TemporalTLS(cert=tmp_path / "not.pem", key=pki.client_key),
            None,
            r"temporal.tls.cert: .*not.pem is not a "
            r"PEM file",
        ),
        (
            None,
            "ROLLART_UNSET_KEY",
            r"temporal.api_key_env: the environment variable ROLLART_UNSET_KEY is not set in "
            r"this process: export ROLLART_UNSET_KEY=<the API key>, or remove api_key_env",
        ),
        (None, "ROLLART_EMPTY_KEY", "the environment variable ROLLART_EMPTY_KEY is empty"),
    ]
    for tls, key, message in cases:
        job = _job(tmp_path, address="t:7233", tls=tls, api_key_env=key)
        for wait in (None, Backoff(timeout_s=60)):
            t0 = time.monotonic()
            with pytest.raises(TemporalSecurityError, match=message):
                await connect(job.temporal, job.store, wait=wait)
            assert time.monotonic() - t0 < 2
    assert not sdk_connect


# What the SDK's core (rustls under tonic) reported in the handshakes of the orchestration tests below, verbatim.
_CORE = "Failed client connect: "
NO_CLIENT_CERT = (
    _CORE + '`get_system_info` call error after connection: Status { code: Unknown, message: "transport '
    'error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData, '
    'error: "received fatal alert: CertificateRequired" }))) }'
)
UNKNOWN_ISSUER = (
    _CORE + "Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { kind: "
    "InvalidData, error: InvalidCertificate(UnknownIssuer) }))"
)
WRONG_NAME = (
    _CORE + "Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { kind: "
    'InvalidData, error: InvalidCertificate(NotValidForNameContext { expected: DnsName("temporal.example"), '
    'presented: ["DnsName(\\"localhost\\")", "IpAddress(127.0.0.1)"] }) }))'
)
NOT_TLS = (
    _CORE + "Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { kind: "
    "InvalidData, error: InvalidMessage(InvalidContentType) }))"
)
PLAIN_TO_TLS = (
    _CORE + '`get_system_info` call error after connection: Status { code: Unknown, message: "transport '
    'error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Kind(ConnectionReset)))) }'
)
CLOSED = (
    _CORE + '`get_system_info` call error after connection: Status { code: Cancelled, message: "operation was '
    'canceled", source: Some(tonic::transport::Error(Transport, hyper::Error(Canceled, "connection closed"))) }'
)


def test_refusals_are_said_in_words_and_are_not_outages(pki: Pki) -> None:
    mtls = TemporalConfig(address="t:7233", tls=_mtls(pki))
    ca_only = TemporalConfig(address="t:7233", tls=TemporalTLS(ca=pki.ca))
    cases = [
        (
            NO_CLIENT_CERT,
            ca_only,
            "the Temporal server at t:7233 requires a client certificate (TLS alert "
            "CertificateRequired): set temporal.tls.cert and temporal.tls.key",
        ),
        (UNKNOWN_ISSUER, mtls, f"presented a certificate not signed by the CA in temporal.tls.ca ({pki.ca})"),
        (
            UNKNOWN_ISSUER,
            TemporalConfig(address="t:7233", tls=TemporalTLS()),
            "presented a certificate no CA this machine trusts has signed: set temporal.tls.ca",
        ),
        (
            WRONG_NAME,
            mtls,
            "presented a certificate for localhost, 127.0.0.1, not for temporal.example: set "
            "temporal.tls.server_name to a name it carries",
        ),
        (NOT_TLS, mtls, "did not answer the TLS handshake in TLS: it serves plain gRPC there"),
    ]
    for text, temporal, message in cases:
        said = security_problem(RuntimeError(text), "t:7233", temporal)
        assert said is not None and message in said, (said, message)
        assert not is_unreachable(RPCError(text, RPCStatusCode.UNKNOWN, b""))  # e.g. a call on an open client
        assert not is_unreachable(TemporalSecurityError(said))
    keyed = TemporalConfig(address="t:7233", api_key_env="MY_KEY")
    refused = RPCError("Request unauthorized.", RPCStatusCode.UNAUTHENTICATED, b"")
    assert security_problem(refused, "t:7233", keyed) == (
        "the Temporal server at t:7233 did not accept the API key in $MY_KEY: Request unauthorized."
    )
    denied = RPCError("no access", RPCStatusCode.PERMISSION_DENIED, b"")
    assert "denied this client access to namespace 'default' (no access)" in security_problem(denied, "t:7233", keyed)
    assert not is_unreachable(refused) and not is_unreachable(denied)
    # a server that resets a plain connection may want TLS (or be going down): still waited for, with a hint
    assert security_problem(RuntimeError(PLAIN_TO_TLS), "t:7233", TemporalConfig()) is None
    assert "requires TLS closes plain connections like this" in closed_connection_hint(PLAIN_TO_TLS, TemporalConfig())
    assert is_unreachable(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))
    # closed at once after a TLS handshake: often a refused certificate whose alert the core did not read (connect
    # then asks the server again: certificate_verdict), or a server going down
    assert security_problem(RuntimeError(CLOSED), "t:7233", mtls) is None
    assert "check temporal.tls.cert and temporal.tls.key" in closed_connection_hint(CLOSED, mtls)


# ---------------------------------------------------------------- against a TLS front of a real dev server


@pytest.fixture
def front(bare_env: WorkflowEnvironment, pki: Pki) -> Iterator[TLSFront]:
    """mTLS in front of the session's dev server: a client certificate signed by `pki.ca` is required."""
    with TLSFront(pki, bare_env.client.service_client.config.target_host) as f:
        yield f


@contextlib.asynccontextmanager
async def _control_worker(settings: WorkerSettings, tmp_path: Path) -> AsyncIterator[None]:
    """A real control worker (`rollart worker --pool control`'s `serve`), connecting as workers do: waiting."""
    ready = tmp_path / f"ready-{uuid.uuid4().hex[:6]}"
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings.model_copy(update={"ready_file": ready}), stop))
    try:
        while not ready.exists():
            if task.done():
                task.result()  # its error
            await asyncio.sleep(0.05)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.mark.orchestration
async def test_a_rollout_runs_over_mtls_with_its_workers_connected_through_it(
    front: TLSFront, pki: Pki, tmp_path: Path, queue_prefix: str
) -> None:
    """`rollart rollout`'s client, a real control worker and the stand-in activity workers all dial the TLS front."""
    job = _job(tmp_path, address=front.address, tls=_mtls(pki), task_queue_prefix=queue_prefix)
    async with _control_worker(WorkerSettings.from_job(job, Pool.CONTROL, connect_timeout_s=30), tmp_path):
        workers_client = await connect(job.temporal, job.store)
        s = StandIns(prefix=queue_prefix, turns=2)
        async with standin_workers(workers_client, s, missing_pools=("control",)):
            client = await connect_client(job, wait_s=10)  # what `rollart rollout` connects with
            job_id = new_job_id(job)
            outcomes = await run_rollout(client, plan_trajectories(job, 3, 0, job_id), job_id)
    assert [o.status for o in outcomes] == ["completed"] * 3 and all(o.result and o.result.turns == 2 for o in outcomes)
    assert front.relayed >= 3 and front.refused == []  # three clients, each through the front


@pytest.mark.orchestration
@pytest.mark.parametrize(
    ("tls", "message", "server_saw"),
    [
        (
            lambda p: TemporalTLS(ca=p.ca),
            r"requires a client certificate \(TLS alert CertificateRequired\): set "
            "temporal.tls.cert and temporal.tls.key",
            "PEER_DID_NOT_RETURN_A_CERTIFICATE",
        ),
        (
            lambda p: _mtls(p, ca=p.other_ca),
            r"presented a certificate not signed by the CA in temporal.tls.ca "
            r"\(.*other-ca.pem\)",
            "ALERT_UNKNOWN_CA",
        ),
        (
            lambda p: _mtls(p, cert=p.stranger_cert, key=p.stranger_key),
            r"refused this client's certificate \(temporal.tls.cert .*stranger.pem\): TLS alert UnknownCA; it is not "
            r"signed "
            "by a CA the server trusts",
            "CERTIFICATE_VERIFY_FAILED",
        ),
        (
            lambda p: _mtls(p, server_name="temporal.example"),
            "presented a certificate for localhost, 127.0.0.1, not for temporal.example",
            "ALERT_BAD_CERTIFICATE",
        ),
    ],
    ids=["no client certificate", "wrong CA", "client certificate of another CA", "wrong server name"],
)
async def test_a_refused_handshake_is_a_clear_error_at_once_for_clients_and_workers(
    front: TLSFront, pki: Pki, tmp_path: Path, tls: Any, message: str, server_saw: str
) -> None:
    job = _job(tmp_path, address=front.address, tls=tls(pki))
    t0 = time.monotonic()
    with pytest.raises(UserError, match=message):  # `rollart train/rollout`: would otherwise retry for 60 s
        await connect_client(job, wait_s=60)
    with pytest.raises(TemporalSecurityError, match=message):  # a worker: would otherwise wait forever
        await connect(job.temporal, job.store, wait=Backoff(timeout_s=60))
    assert time.monotonic() - t0 < 10
    assert front.refused and all(server_saw in why for why in front.refused)


@pytest.mark.orchestration
async def test_a_connection_closed_at_once_is_asked_again_whether_it_was_the_certificate(
    front: TLSFront, pki: Pki
) -> None:
    """The core often sees only a closed connection where the server sent an alert (a TLS 1.3 client sends its first
    request with its last handshake message; the server's answer to both is the alert and a close). A handshake that
    only listens hears the alert, and nothing from a server that took the certificate."""

    def verdict(tls: TemporalTLS) -> Any:
        return certificate_verdict(front.address, TemporalConfig(address=front.address, tls=tls))

    assert await verdict(_mtls(pki)) is None
    assert "requires a client certificate (TLS alert CertificateRequired)" in await verdict(TemporalTLS(ca=pki.ca))
    stranger = await verdict(_mtls(pki, cert=pki.stranger_cert, key=pki.stranger_key))
    assert f"refused this client's certificate (temporal.tls.cert {pki.stranger_cert}): TLS alert UnknownCA" in stranger


@pytest.mark.orchestration
async def test_tls_to_a_plain_server_says_it_does_not_speak_tls(
    bare_env: WorkflowEnvironment, pki: Pki, tmp_path: Path
) -> None:
    plain = bare_env.client.service_client.config.target_host
    job = _job(tmp_path, address=plain, tls=_mtls(pki))
    with pytest.raises(UserError, match=f"the Temporal server at {plain} did not answer the TLS handshake in TLS"):
        await connect_client(job, wait_s=60)


@pytest.mark.orchestration
def test_the_cli_says_what_is_wrong_without_a_traceback(
    capsys: pytest.CaptureFixture[str], front: TLSFront, pki: Pki, tmp_path: Path
) -> None:
    """`rollart status` and `rollart worker` with the TLS flags but no client certificate: exit 2 at once, saying so."""
    tls = ["--temporal-address", front.address, "--temporal-tls-ca", str(pki.ca)]
    status = rollart(capsys, "status", "j-1", *tls)
    assert status.returncode == 2 and "Traceback" not in status.stderr, status.stderr
    assert status.stderr.startswith(
        f"error: cannot get the status of 'j-1' from {front.address}: the Temporal server "
        f"at {front.address} requires a client certificate"
    )
    t0 = time.monotonic()
    worker = rollart(capsys, "worker", "--pool", "serverless", *tls, "--store-path", str(tmp_path / "s"))
    assert worker.returncode == 2 and "Traceback" not in worker.stderr, worker.stderr
    assert "requires a client certificate" in worker.stderr and time.monotonic() - t0 < 60


@pytest.mark.orchestration
async def test_the_api_key_is_sent_as_a_bearer_token_and_a_refused_one_is_said(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("grpc")  # grpcio comes with tensorboard
    monkeypatch.setenv("ROLLART_TEST_KEY", "key-123")
    monkeypatch.setenv("ROLLART_OTHER_KEY", "key-456")
    with FakeFrontend(pki, api_key="key-123") as server:
        job = _job(tmp_path, address=server.address, tls=_mtls(pki), api_key_env="ROLLART_TEST_KEY")
        await connect(job.temporal, job.store)
        await connect(
            job.temporal, job.store, wait=Backoff(timeout_s=10)
        )  # a worker's, which also checks the namespace
        assert len(server.seen) == 3 and all(m["authorization"] == "Bearer key-123" for m in server.seen)
        wrong = _job(tmp_path, address=server.address, tls=_mtls(pki), api_key_env="ROLLART_OTHER_KEY")
        said = (
            f"the Temporal server at {server.address} did not accept the API key in \\$ROLLART_OTHER_KEY and "
            f"the client certificate {pki.client_cert}: Request unauthorized."
        )
        with pytest.raises(UserError, match=said):
            await connect_client(wrong, wait_s=60)
        t0 = time.monotonic()
        with pytest.raises(TemporalSecurityError, match=said):
            await connect(wrong.temporal, wrong.store, wait=Backoff(timeout_s=60))
        assert time.monotonic() - t0 < 5 and server.seen[-1]["authorization"] == "Bearer key-456"


# ---------------------------------------------------------------- checked up front, before any dial


def test_tls_files_that_cannot_work_are_said_before_dialing(pki: Pki, tmp_path: Path) -> None:
    from rollart.infra.temporal.tls import check_tls_files

    check_tls_files(_mtls(pki))  # a CA, and a client certificate with its own key: fine
    with pytest.raises(
        TemporalSecurityError, match=r"temporal.tls.key: .* is not the private key of temporal.tls.cert"
    ):
        check_tls_files(_mtls(pki, key=pki.stranger_key))
    with pytest.raises(TemporalSecurityError, match="lacks clientAuth"):  # a server's certificate shown as a client's
        check_tls_files(_mtls(pki, cert=pki.server_cert, key=pki.server_key))
    (tmp_path / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(TemporalSecurityError, match=r"temporal.tls.ca: .*junk.pem holds no usable CA certificate"):
        check_tls_files(TemporalTLS(ca=tmp_path / "junk.pem"))
