"""No listener open to strangers: what rollart's processes listen on, and who they serve.

Unit: the trainer's rendezvous store binds loopback (torch's TCPStore alone binds every interface); an env server
with a token serves only clients presenting it, in a header that no request line (so no access log) carries; a
server given a token file (Kubernetes' Secret) serves with it and never without it. Integration: every listening
socket of the running local stack (the session `stack`: dev server, workers, their children) is on loopback.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import uvicorn

from rollart.activities.envs.openenv_client import TOKEN_ENV, TOKEN_FILE_ENV, OpenEnv
from rollart.activities.envs.openenv_server import openenv_app
from rollart.infra.env_server_token import EnvTokenError, job_token
from rollart.infra.local.devserver import free_port
from rollart.workers.env_server import wait_healthy
from rollart.workers.local_stack import LocalStack
from rollart.workers.trainer_ranks import RankGroup, rank_env, rendezvous_listener
from tests.test_openenv import _ThreadServer

TOKEN = "job-token-for-the-test"


def _listening(pids: set[int]) -> list[tuple[str, int, str, int]]:
    """(process name, pid, address, port) of every listening inet socket of `pids`."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="inet")
            name = " ".join(proc.cmdline()[:4]) or proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(name, pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def _open_to_strangers(listeners: list[tuple[str, int, str, int]]) -> list[str]:
    return [
        f"{name} (pid {pid}) listens on {ip}:{port}"
        for name, pid, ip, port in listeners
        if not ipaddress.ip_address(ip.split("%")[0]).is_loopback
    ]


def test_the_rendezvous_store_of_one_node_listens_on_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    group = RankGroup()
    try:
        mine = [entry for entry in _listening({psutil.Process().pid}) if entry[3] == int(group.rdzv.rsplit(":")[1])]
        assert [ip for _, _, ip, _ in mine] == ["127.0.0.1"]
        group.store.set("k", "v")  # and it still serves
        assert group.store.get("k") == b"v"
    finally:
        group.close()
    assert rank_env(1)["GLOO_SOCKET_IFNAME"] == "lo"  # the ranks' own gloo/NCCL sockets too, on one node


def test_a_rendezvous_host_of_another_machine_listens_everywhere_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Several nodes behind a Service name: the NetworkPolicy, not the bind, keeps strangers out."""
    port = free_port()
    with rendezvous_listener("203.0.113.9", port) as sock:  # TEST-NET-3: never this machine's
        assert ipaddress.ip_address(sock.getsockname()[0]).is_unspecified
    assert "listens on every interface" in caplog.text


@pytest.fixture(scope="module")
def token_server() -> Iterator[_ThreadServer]:
    with _ThreadServer({"maps": "standard"}, token=TOKEN) as server:
        yield server


def _get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_an_env_server_with_a_token_serves_only_clients_presenting_it(
    token_server: _ThreadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _get(token_server.url + "/health") == 200  # probes carry no token
    assert _get(token_server.url + "/stats") == 401
    assert _get(token_server.url + "/stats", "wrong") == 401
    assert _get(token_server.url + "/stats", TOKEN) == 200
    assert _get(token_server.url + f"/stats?token={TOKEN}") == 401  # a URL ends up in logs: the header only

    monkeypatch.setenv(TOKEN_ENV, "wrong-token")
    env = OpenEnv(base_url=token_server.url, server="lake", connect_wait_s=0.3)
    with pytest.raises(ConnectionError) as refused:
        env.reset(0)
    assert "wrong-token" not in str(refused.value)  # the token is never in an error (nor a log)

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    env = OpenEnv(base_url=token_server.url, server="lake")
    assert env.reset(0).startswith("AFFF")
    env.close()
    outsider = OpenEnv(base_url=token_server.url, connect_wait_s=0.3)  # not one of the job's servers: no token
    with pytest.raises(ConnectionError):
        outsider.reset(0)


def test_the_token_rides_in_a_header_never_in_the_request_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn logs each request line (and a WebSocket's path with its query) at INFO: the token is in none."""
    app = openenv_app("frozenlake", {"maps": "standard"}, token=TOKEN)
    seen: list[dict[str, Any]] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            seen.append({"path": scope["path"], "query": scope["query_string"], "headers": dict(scope["headers"])})
        await app(scope, receive, send)

    port = free_port()
    config = uvicorn.Config(recording, host="127.0.0.1", port=port, log_level="info", log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    caplog.set_level(logging.INFO)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the in-thread server did not start"
            time.sleep(0.02)
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        env = OpenEnv(base_url=f"http://127.0.0.1:{port}", server="lake")
        assert env.reset(0).startswith("AFFF")  # served: the header was enough
        env.close()
    finally:
        server.should_exit = True
        thread.join(10)
    (ws,) = [r for r in seen if r["path"] == "/ws"]
    assert ws["query"] == b"" and ws["headers"][b"authorization"] == f"Bearer {TOKEN}".encode()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "/ws" in logged  # uvicorn did log the handshake's request line...
    assert TOKEN not in logged  # ...without the token


def test_the_job_token_comes_from_the_file_named_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "from-the-variable")
    assert job_token() == "from-the-variable"
    path = tmp_path / "token"
    path.write_text("from-the-secret\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    assert job_token() == "from-the-secret"  # the mounted Secret wins, trailing newline dropped
    path.write_text("rotated")
    assert job_token() == "rotated"  # read at each call
    path.write_text("  \n")
    with pytest.raises(EnvTokenError, match="is empty"):
        job_token()
    path.unlink()
    with pytest.raises(EnvTokenError, match=r"cannot be read.*create the job's env-token Secret"):
        job_token()  # never "no token": a server meant to check one must not serve everyone


@pytest.mark.integration  # starts `rollart env-server`
def test_a_server_given_a_token_file_serves_only_clients_presenting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rollart env-server` as a pod runs it: the token from the file `$ROLLART_ENV_SERVER_TOKEN_FILE` names."""
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {TOKEN_FILE_ENV: str(secret)}
    cmd = [sys.executable, "-m", "rollart.cli", "env-server", "--env", "frozenlake", "--port", str(port)]
    cmd += ["--env-args", '{"maps": "standard"}']
    missing = subprocess.run(
        cmd, env={**env, TOKEN_FILE_ENV: str(tmp_path / "absent")}, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode != 0 and "absent, which cannot be read" in missing.stderr  # refused before listening
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 60, proc)
        assert _get(url + "/stats") == 401 and _get(url + "/stats", TOKEN) == 200
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "wrong"))
        (tmp_path / "wrong").write_text("not-the-token")
        with pytest.raises(ConnectionError):
            OpenEnv(base_url=url, server="lake", connect_wait_s=0.3).reset(0)
        monkeypatch.setenv(TOKEN_FILE_ENV, str(secret))  # the worker's pod mounts the same Secret
        client = OpenEnv(base_url=url, server="lake")
        assert client.reset(0).startswith("AFFF")
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_no_listener_of_the_local_stack_is_open_to_strangers(stack: LocalStack) -> None:
    """Every process the stack started (its dev server, workers, their engines' and ranks' children)."""
    pids = {p.pid for p in psutil.Process().children(recursive=True)}
    listeners = _listening(pids)
    assert listeners, "the stack's processes listen on nothing: the test sees no process of it"
    assert not _open_to_strangers(listeners), json.dumps(_open_to_strangers(listeners), indent=1)
