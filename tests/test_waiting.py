"""Waiting for a dependency: the backoff, what is waited out and what fails at once (no server needed)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from temporalio.service import RPCError, RPCStatusCode

from rollart.cli.main import build_parser
from rollart.cli.worker import worker_settings
from rollart.infra.temporal.connection import TemporalAddressError, _check_address, _transient
from rollart.infra.waiting import Backoff, DependencyTimeout, unless_stopped, wait_for

REFUSED = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError("
    'ConnectError("tcp connect error", 127.0.0.1:1, Os { code: 111, kind: ConnectionRefused, '
    'message: "Connection refused" })))'
)
NO_DNS = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError("
    'ConnectError("dns error", Custom { kind: Uncategorized, error: "failed to lookup address information" })))'
)


def test_backoff_doubles_from_half_a_second_up_to_ten() -> None:
    delays = Backoff().delays()
    assert [next(delays) for _ in range(8)] == [0.5, 1, 2, 4, 8, 10, 10, 10]


def test_wait_for_retries_what_is_transient_and_logs_each_attempt(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("down")
        return "up"

    with caplog.at_level(logging.WARNING, logger="rollart.waiting"):
        got = asyncio.run(wait_for("the thing at X", attempt, lambda e: "down", Backoff(first_s=0.01)))
    assert got == "up" and len(calls) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "waiting for the thing at X (attempt 1): down",
        "waiting for the thing at X (attempt 2): down",
    ]


def test_wait_for_raises_a_permanent_error_at_once() -> None:
    calls = []

    async def attempt() -> None:
        calls.append(1)
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        asyncio.run(wait_for("x", attempt, lambda e: None, Backoff(first_s=0.01)))
    assert len(calls) == 1


def test_wait_for_gives_up_at_its_limit() -> None:
    async def attempt() -> None:
        raise RuntimeError("down")

    with pytest.raises(DependencyTimeout, match=r"gave up waiting for x after 0\.\d+s .*limit 0\.3s\): down"):
        asyncio.run(wait_for("x", attempt, lambda e: "down", Backoff(first_s=0.05, timeout_s=0.3)))


def test_refused_and_unavailable_are_waited_out_a_bad_host_and_a_missing_namespace_are_not() -> None:
    assert _transient(RuntimeError(REFUSED), "a:1") == "connection refused"
    assert _transient(RPCError("down", RPCStatusCode.UNAVAILABLE, b""), "a:1") == "UNAVAILABLE: down"
    assert _transient(RPCError("Namespace x is not found.", RPCStatusCode.NOT_FOUND, b""), "a:1") is None
    assert _transient(ValueError("invalid target URL"), "a:1") is None
    with pytest.raises(TemporalAddressError, match="cannot resolve the host of the Temporal address 'nohost:1'"):
        _transient(RuntimeError(NO_DNS), "nohost:1")


@pytest.mark.parametrize("address", ["127.0.0.1", "not an address", "host:0", "host:99999", "http://host:7233"])
def test_a_malformed_address_is_refused(address: str) -> None:
    with pytest.raises(TemporalAddressError, match="expected HOST:PORT"):
        _check_address(address)


@pytest.mark.parametrize(
    "address", ["127.0.0.1:7233", "temporal-frontend.temporal.svc.cluster.local:7233", "[::1]:7233"]
)
def test_a_well_formed_address_passes(address: str) -> None:
    _check_address(address)


def test_connect_timeout_flag_sets_the_worker_setting() -> None:
    args = build_parser().parse_args(["worker", "--pool", "cpu", "--connect-timeout", "2.5"])
    assert worker_settings(args, None).connect_timeout_s == 2.5
    args = build_parser().parse_args(["worker", "--pool", "cpu"])
    assert worker_settings(args, None).connect_timeout_s is None


def test_unless_stopped_returns_the_result_or_cancels_the_work_when_stopped() -> None:
    async def main() -> tuple[str | None, str | None, bool]:
        stop = asyncio.Event()
        done = await unless_stopped(asyncio.sleep(0, result="up"), stop)
        cancelled = asyncio.Event()

        async def forever() -> str:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "never"

        asyncio.get_running_loop().call_later(0.05, stop.set)
        return done, await unless_stopped(forever(), stop), cancelled.is_set()

    assert asyncio.run(main()) == ("up", None, True)
