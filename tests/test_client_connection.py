"""The client side of an outage: which errors mean unreachable, one line per outage, backoff, waiting at start."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode

from rollart.cli.errors import UserError
from rollart.cli.stack import connect_client
from rollart.cli.train import attach_command
from rollart.client.connection import Outage, is_unreachable, probe, retry_unreachable
from rollart.client.train import MetricsWriter
from rollart.contracts.training import StepRecord
from rollart.infra.local.devserver import DevServer, free_port
from rollart.infra.temporal.connection import NamespaceNotFound, TemporalAddressError
from rollart.spec.config import JobSpec, StoreConfig, TemporalConfig, TemporalTLS
from tests.support.tasks import frozenlake_task


def test_unreachable_is_a_lost_connection_not_an_answer() -> None:
    assert is_unreachable(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))
    assert is_unreachable(RPCError("transport error", RPCStatusCode.UNKNOWN, b""))
    assert is_unreachable(ConnectionError("cannot reach the Temporal server"))
    assert not is_unreachable(RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b""))
    assert not is_unreachable(RPCError("query timed out", RPCStatusCode.DEADLINE_EXCEEDED, b""))
    assert not is_unreachable(ValueError("bad input"))
    assert not is_unreachable(TemporalAddressError("bad Temporal address 'x'"))  # waiting would not help
    assert not is_unreachable(NamespaceNotFound("no namespace 'x'"))


def test_an_outage_is_said_once_and_its_end_once_with_a_capped_backoff() -> None:
    said: list[str] = []
    outage = Outage(say=said.append, min_delay_s=0.5, max_delay_s=2.0)
    outage.ok()
    for _ in range(5):
        outage.failed(RPCError("tcp connect error\nmore", RPCStatusCode.UNAVAILABLE, b""))
    assert [outage.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    outage.ok()
    outage.ok()
    assert said == ["Temporal unreachable, retrying (tcp connect error)", "Temporal is back after 0 s"]
    outage.failed(ConnectionError("refused"))
    assert outage.down and outage.outages == 2 and outage.next_delay() == 0.5  # a new outage starts over


def test_a_call_cut_off_once_on_a_live_server_is_no_outage() -> None:
    """A loaded server cuts a call off now and then ("operation was canceled"): only two in a row are an outage."""
    said: list[str] = []
    outage = Outage(say=said.append)
    cut_off = RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")
    for _ in range(3):
        outage.ok()
        outage.failed(cut_off)
        assert not outage.down
    outage.ok()
    assert said == []
    outage.failed(cut_off)
    outage.failed(RPCError("Timeout expired", RPCStatusCode.CANCELLED, b""))  # a hung server: no answer twice
    assert outage.down and said == ["Temporal unreachable, retrying (Timeout expired)"]
    outage.ok()
    refused = Outage(say=said.append)
    refused.failed(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))  # nothing listens: at once
    assert refused.down and len(said) == 3


class _HealthOf:
    """A client whose health check raises `error` (a fake for the probe's logic; the real one: test_client_outage)."""

    def __init__(self, error: Exception | None) -> None:
        self.service_client = self
        self.error = error

    async def check_health(self, **kwargs: object) -> bool:
        if self.error is not None:
            raise self.error
        return True


async def test_a_slow_health_check_is_a_server_that_is_there() -> None:
    said: list[str] = []
    outage = Outage(say=said.append)
    slow = RPCError("context deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b"")
    assert await probe(_HealthOf(slow), outage) and not outage.down  # type: ignore[arg-type]
    assert not await probe(_HealthOf(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")), outage)  # type: ignore[arg-type]
    assert outage.down
    with pytest.raises(RPCError, match="permission"):
        await probe(_HealthOf(RPCError("permission denied", RPCStatusCode.PERMISSION_DENIED, b"")), outage)  # type: ignore[arg-type]
    assert said == ["Temporal unreachable, retrying (tcp connect error)"]


async def test_retry_waits_out_unreachable_errors_and_raises_the_others() -> None:
    said: list[str] = []
    outage = Outage(say=said.append, min_delay_s=0.0, max_delay_s=0.0)
    answers: list[object] = [RPCError("transport error", RPCStatusCode.UNAVAILABLE, b""), ConnectionError("x"), 7]

    async def call() -> int:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a  # type: ignore[return-value]

    assert await retry_unreachable(call, outage) == 7 and len(said) == 2
    answers.append(RPCError("not found", RPCStatusCode.NOT_FOUND, b""))
    with pytest.raises(RPCError):
        await retry_unreachable(call, outage)


def _record(step: int) -> StepRecord:
    return StepRecord(step=step, version=step + 1, time=100.0 + step, samples=4, reward_mean=1.0, success_rate=1.0)


def test_a_reattached_metrics_writer_continues_the_file(tmp_path: Path) -> None:
    MetricsWriter(tmp_path).write([_record(0), _record(1)], started_at=99.0)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "ti')  # the last client died mid-line
    again = MetricsWriter(tmp_path)
    new = again.write([_record(0), _record(1), _record(2)], started_at=99.0)
    assert [r["step"] for r in new] == [2] and new[0]["step_interval_s"] == pytest.approx(1.0)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_the_reattach_command_names_server_and_namespace() -> None:
    job = JobSpec(tasks=[frozenlake_task()], temporal=TemporalConfig(address="10.0.0.5:7233"))
    assert attach_command(job, "j-1") == "rollart attach j-1 --temporal-address 10.0.0.5:7233"
    other = JobSpec(tasks=[frozenlake_task()], temporal=TemporalConfig(address="t:7233", namespace="team"))
    assert attach_command(other, "j-2") == "rollart attach j-2 --temporal-address t:7233 --namespace team"


def _job_on(address: str, tmp_path: Path) -> JobSpec:
    return JobSpec(
        name="c",
        tasks=[frozenlake_task()],
        temporal=TemporalConfig(address=address),
        store=StoreConfig(path=tmp_path / "store"),
    )


@pytest.mark.orchestration
@pytest.mark.timeout(120)
async def test_train_and_rollout_wait_for_a_server_that_is_still_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`connect_client` (rollart train, rollart rollout) waits out a server that comes up 3 s later."""
    server = DevServer(db_file=tmp_path / "temporal.db", port=free_port(), ui_port=None)
    t0 = time.monotonic()
    later = asyncio.get_running_loop().run_in_executor(None, lambda: (time.sleep(3), server.start()))
    try:
        client = await connect_client(_job_on(server.address, tmp_path), wait_s=60)
        assert await client.service_client.check_health() and time.monotonic() - t0 >= 3
        await later
    finally:
        await later
        server.stop()
    out = capsys.readouterr().out
    assert "Temporal unreachable, retrying" in out and "Temporal is back after" in out


async def test_a_bad_or_absent_server_fails_without_a_long_wait(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(UserError, match="bad Temporal address"):
        await connect_client(_job_on("no-port-here", tmp_path), wait_s=60)
    assert time.monotonic() - t0 < 5  # a malformed address is not waited for
    with pytest.raises(UserError, match=r"cannot reach the Temporal server .* \(waited 1 s\)"):
        await connect_client(_job_on(f"127.0.0.1:{free_port()}", tmp_path), wait_s=1)


class _GoneHandle:
    """A workflow handle whose server has just gone away (or answers with `error`)."""

    id = "job-x"

    def __init__(self, error: RPCError) -> None:
        self.error = error

    async def describe(self) -> None:
        raise self.error


async def test_asking_who_serves_a_job_when_the_server_just_went_away_is_not_an_error() -> None:
    """The follower's health check passed, then the server died before `describe`: nothing said, nothing raised
    (the CI saw `rollart status --follow` crash here); an answer the server gave still raises."""
    from rollart.client.unserved import Unserved

    said: list[str] = []
    unserved = Unserved(say=said.append)
    gone = RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")
    await unserved.no_answer(None, _GoneHandle(gone))  # type: ignore[arg-type]
    assert said == [] and not unserved.missing
    with pytest.raises(RPCError, match="not found"):
        await unserved.no_answer(None, _GoneHandle(RPCError("not found", RPCStatusCode.NOT_FOUND, b"")))  # type: ignore[arg-type]


# ---------------------------------------------------------------- Temporal's own configuration (temporalio.envconfig)


def _profile_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> None:
    """This process's Temporal configuration: only `env` (and a config file of ours), nothing of the machine's."""
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE", "TEMPORAL_TLS"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "temporal.toml").write_text(
        '[profile.default]\naddress = "file.example:7233"\nnamespace = "from-file"\n'
        '[profile.cloud]\naddress = "cloud.example:7233"\n[profile.cloud.tls]\nserver_ca_cert_path = "/ca.pem"\n'
    )
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "temporal.toml"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_temporal_configuration_fills_what_the_job_leaves_open(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rollart.infra.temporal.connection import with_environment

    _profile_env(monkeypatch, tmp_path)
    filled = with_environment(TemporalConfig())  # no address in the job: the config file's profile
    assert (filled.address, filled.namespace, filled.tls) == ("file.example:7233", "from-file", None)

    _profile_env(monkeypatch, tmp_path, TEMPORAL_ADDRESS="env.example:7233", TEMPORAL_API_KEY="k")
    filled = with_environment(TemporalConfig())  # the variables over the file
    assert (filled.address, filled.api_key_env) == ("env.example:7233", "TEMPORAL_API_KEY")

    mine = with_environment(TemporalConfig(address="mine:7233", namespace="ns"))  # the job's (and flags') win...
    assert (mine.address, mine.namespace, mine.api_key_env) == ("mine:7233", "ns", None)  # ...and no key for it

    _profile_env(monkeypatch, tmp_path, TEMPORAL_PROFILE="cloud")
    cloud = with_environment(TemporalConfig())
    assert cloud.address == "cloud.example:7233" and cloud.tls == TemporalTLS(ca=Path("/ca.pem"))


def test_no_temporal_configuration_keeps_the_local_dev_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rollart.infra.temporal.connection import with_environment

    _profile_env(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "empty.toml"))
    (tmp_path / "empty.toml").write_text("")
    assert with_environment(TemporalConfig()).address is None  # `rollart up` starts the dev server
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(TemporalAddressError, match=r"TEMPORAL_CONFIG_FILE names .*missing.toml, which is not a file"):
        with_environment(TemporalConfig())
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "empty.toml"))
    monkeypatch.setenv("TEMPORAL_PROFILE", "nope")
    with pytest.raises(TemporalAddressError, match="nope"):
        with_environment(TemporalConfig())
