"""No listener open to strangers: what rollart's processes listen on, and who they serve.

Unit: the trainer's rendezvous store binds loopback (torch's TCPStore alone binds every interface), and an env
server with a token serves only clients presenting it. Integration: every listening socket of the running local
stack (the session `stack`: dev server, workers, their children) is on loopback.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import psutil
import pytest

from rollart.activities.envs.openenv_client import TOKEN_ENV, OpenEnv
from rollart.infra.local.devserver import free_port
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
    assert _get(token_server.url + f"/stats?token={TOKEN}") == 200

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


@pytest.mark.integration
def test_no_listener_of_the_local_stack_is_open_to_strangers(stack: LocalStack) -> None:
    """Every process the stack started (its dev server, workers, their engines' and ranks' children)."""
    pids = {p.pid for p in psutil.Process().children(recursive=True)}
    listeners = _listening(pids)
    assert listeners, "the stack's processes listen on nothing: the test sees no process of it"
    assert not _open_to_strangers(listeners), json.dumps(_open_to_strangers(listeners), indent=1)
