"""OpenEnv: the `openenv` client env against rollart's own OpenEnv server, failover when the server dies, env servers
in the job spec and the local stack.

Unit tests run the server app in a thread of the test process (uvicorn on a loopback port: real WebSockets, no
subprocess). Integration tests run `rollart env-server` as a real process and SIGKILL it mid-episode: the env's
failover path (SessionLost, then `restore` on a fresh session: reset from the seed, actions replayed) recovers
the same state; and `rollart rollout` of examples/openenv.yaml on the local stack, whose env server is SIGKILLed
mid-rollout and restarted by the stack, ends with every trajectory completed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import psutil
import pytest
import uvicorn
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.env import EnvActivities
from rollart.activities.envs.frozenlake import FrozenLake
from rollart.activities.envs.openenv_client import OpenEnv
from rollart.activities.envs.openenv_server import openenv_app
from rollart.contracts.activities import ResetInput, RestoreInput, StepInput
from rollart.infra.local.devserver import free_port
from rollart.spec.config import JobSpec, load_job
from rollart.spec.env import Env, EnvSessionLost, StepOutcome
from rollart.workers.env_server import wait_healthy
from tests.support.paths import REPO

ENV = ActivityEnvironment()
RANDOM_MAPS = {"maps": "random", "size": 5, "p_hole": 0.3}
ACTIONS = ["R", "D", "zz", "D", "R", "d", "L", "U", "R", "D", "R", "D"]  # "zz": no move (invalid, a no-op)
ROLLART = [sys.executable, "-m", "rollart.cli"]


class _ThreadServer:
    """An OpenEnv server app on a loopback port, served by uvicorn in a thread of this process (with `token`, only
    to clients presenting it)."""

    def __init__(self, env_args: dict[str, Any], token: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            openenv_app("frozenlake", env_args, token=token),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            ws_ping_interval=None,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the in-thread server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as r:
            return json.loads(r.read())


@pytest.fixture(scope="module")
def lake_server() -> Iterator[_ThreadServer]:
    with _ThreadServer(RANDOM_MAPS) as server:
        yield server


def _play(env: Env, seed: int, actions: list[str]) -> tuple[str, list[StepOutcome]]:
    first, outcomes = env.reset(seed), []
    for a in actions:
        outcomes.append(env.step(a))
        if outcomes[-1].done:
            break
    return first, outcomes


# ---------------------------------------------------------------- unit: the mapping, over real WebSockets


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_an_episode_over_openenv_equals_the_env_played_in_process(lake_server: _ThreadServer, seed: int) -> None:
    remote = OpenEnv(base_url=lake_server.url)
    try:
        assert _play(remote, seed, ACTIONS) == _play(FrozenLake(**RANDOM_MAPS), seed, ACTIONS)
    finally:
        remote.close()


def test_each_env_has_its_own_session(lake_server: _ThreadServer) -> None:
    """Envs of one worker interleave on one server; each keeps its own state (one WebSocket session each)."""
    envs = [OpenEnv(base_url=lake_server.url) for _ in range(3)]
    local = [FrozenLake(**RANDOM_MAPS) for _ in range(3)]
    try:
        for i, (e, ref) in enumerate(zip(envs, local)):
            assert e.reset(10 + i) == ref.reset(10 + i)
        assert lake_server.stats()["sessions"] >= 3
        for turn in range(4):
            for i, (e, ref) in enumerate(zip(envs, local)):
                action = "RD"[(turn + i) % 2]
                if not ref._done:
                    assert e.step(action) == ref.step(action)
    finally:
        for e in envs:
            e.close()


def test_a_step_the_server_refuses_is_an_env_error_not_a_lost_session(lake_server: _ThreadServer) -> None:
    env, reference = OpenEnv(base_url=lake_server.url), FrozenLake(**RANDOM_MAPS)
    try:
        _, outcomes = _play(env, 3, ACTIONS * 3)
        assert outcomes == _play(reference, 3, ACTIONS * 3)[1] and outcomes[-1].done
        with pytest.raises(RuntimeError, match=r"Server error: .*after the episode ended") as err:
            env.step("R")  # the server's env raises: an env error (EnvBroken), not a lost session
        assert not isinstance(err.value, EnvSessionLost)
    finally:
        env.close()


def test_a_server_that_goes_away_loses_the_session_for_good() -> None:
    with _ThreadServer({"maps": "standard"}) as server:
        env = OpenEnv(base_url=server.url, connect_wait_s=0.5)
        assert env.reset(0).startswith("AFFF")
        env.step("R")
    with pytest.raises(EnvSessionLost, match=f"OpenEnv session at {server.url} is gone"):
        env.step("R")
    with pytest.raises(EnvSessionLost):  # never a silent new session in place of the lost one
        env.step("R")
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no OpenEnv server answers at {server.url}"):
        env.reset(0)  # nothing listens: waited for connect_wait_s, then a clear error (a retryable reset)
    assert time.monotonic() - t0 < 5


class _Reply:
    def __init__(self, observation: Any, reward: Any = 0.5, done: bool = False) -> None:
        self.observation, self.reward, self.done = observation, reward, done


class _FakeSession:
    def __init__(self, reply: _Reply) -> None:
        self.reply = reply
        self.sent: list[Any] = []

    def step(self, action: dict) -> _Reply:
        self.sent.append(action)
        return self.reply

    def close(self) -> None:
        pass


def _step_with(reply: _Reply, **env_args: Any) -> tuple[StepOutcome, list[Any]]:
    env = OpenEnv(base_url="http://server:1", **env_args)
    env._client = session = _FakeSession(reply)
    return env.step("go left"), session.sent


def test_the_mapping_for_servers_of_other_shapes() -> None:
    # rollart's own server: text and info fields
    out, sent = _step_with(_Reply({"text": "grid", "info": {"valid": True}}, reward=1, done=True))
    assert sent == [{"message": "go left"}] and out == StepOutcome("grid", 1.0, True, {"valid": True})
    # another server: the action under its own field, the observation's text field named, the rest as info
    out, sent = _step_with(
        _Reply({"echoed": "hi", "length": 2}, reward=None), action_field="cmd", observation_field="echoed"
    )
    assert sent == [{"cmd": "go left"}] and out == StepOutcome("hi", 0.0, False, {"length": 2})
    # no text field and none named: the whole observation as compact JSON
    out, _ = _step_with(_Reply({"board": [[1, 0]], "score": 3}))
    assert out.observation == '{"board":[[1,0]],"score":3}' and out.info == {"board": [[1, 0]], "score": 3}
    with pytest.raises(ValueError, match=r"has no text field 'prompt' .*fields: board"):
        _step_with(_Reply({"board": 1}), observation_field="prompt")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "base_url must be the server's URL"),
        ({"server": "lake"}, "env server 'lake' was not resolved"),
        ({"base_url": "localhost:8300"}, "base_url must be the server's URL"),
        ({"base_url": "http://h:1", "timeout_s": 0}, "timeout_s must be a positive number"),
        ({"base_url": "http://h:1", "reset_args": [1]}, "reset_args must be a mapping"),
        ({"base_url": "http://h:1", "actionfield": "x"}, "unknown env_args"),
    ],
)
def test_bad_env_args_name_the_argument(args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OpenEnv(**args)


# ---------------------------------------------------------------- unit: the env activities' failover path


class LosesItsSession(Env):
    """A remote env whose session breaks at its second step (from env_args `lose_at`)."""

    def __init__(self, lose_at: int = 2, **rest: Any) -> None:
        super().__init__(**rest)
        self.lose_at, self.steps = lose_at, 0

    def reset(self, seed: int) -> str:
        self.steps = 0
        return "start"

    def step(self, action: str) -> StepOutcome:
        self.steps += 1
        if self.steps == self.lose_at:
            raise EnvSessionLost("the server went away")
        return StepOutcome(f"after {self.steps}", 0.0, False, {})


async def test_a_lost_session_is_reported_as_session_lost_so_the_workflow_restores_it() -> None:
    acts = EnvActivities("w", queue="cpu@w")
    name = f"{__name__}:LosesItsSession"
    h = await ENV.run(acts.reset, ResetInput(env=name, seed=0, trajectory_id="t"))
    await ENV.run(acts.step, StepInput(session_id=h.session_id, action="a"))
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.step, StepInput(session_id=h.session_id, action="b"))
    assert err.value.type == "SessionLost" and err.value.non_retryable and "the server went away" in str(err.value)
    assert acts.open_sessions == 0  # dropped: the episode lives on in its restored session
    # a restore whose replay loses its fresh session too is retried (the server may still be coming back)
    with pytest.raises(ApplicationError) as err:
        await ENV.run(
            acts.restore,
            RestoreInput(
                env=name, env_args={"lose_at": 1}, seed=0, owner_id="t", actions=[["a"]], observations=["after 1"]
            ),
        )
    assert err.value.type == "EnvRestoreLost" and not err.value.non_retryable
    moved = await ENV.run(
        acts.restore, RestoreInput(env=name, seed=0, owner_id="t", actions=[["a"]], observations=["after 1"])
    )
    assert moved.observations == ["after 1"] and acts.open_sessions == 1
    acts.shutdown()


# ---------------------------------------------------------------- unit: env servers in the job spec


def _job(servers: list[dict], **env_args: Any) -> dict:
    task = {"name": "lake", "env": "openenv", "reward": "progress", "env_args": env_args}
    return {"tasks": [task], "env_servers": servers}


def test_a_task_naming_an_env_server_gets_its_url() -> None:
    job = JobSpec.model_validate(_job([{"name": "lake", "port": 8301}], server="lake"))
    assert job.tasks[0].env_args == {"server": "lake", "base_url": "http://127.0.0.1:8301"}
    assert job.env_servers[0].command("0.0.0.0") == [
        "rollart",
        "env-server",
        "--env",
        "frozenlake",
        "--env-args",
        "{}",
        "--host",
        "0.0.0.0",
        "--port",
        "8301",
        "--max-sessions",
        "256",
    ]
    moved = job.with_env_server_urls({"lake": "http://lake.ns.svc:8301"})
    assert moved.tasks[0].env_args["base_url"] == "http://lake.ns.svc:8301"
    assert JobSpec.model_validate(moved.model_dump()) == moved  # the pods load it unchanged


def test_the_example_job_loads_with_its_server() -> None:
    job = load_job(REPO / "examples" / "openenv.yaml")
    assert job.tasks[0].env_args["base_url"] == "http://127.0.0.1:8300" and job.env_servers[0].env == "frozenlake"


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (
            _job([{"name": "lake", "port": 1}], server="pond"),
            r"tasks.0.env_args.server: no env server 'pond' in env_servers \(defined: lake\)",
        ),
        (_job([], server="pond"), "no env server 'pond' .*add an env_servers section"),
        (
            _job([{"name": "lake", "port": 1}], server="lake", base_url="http://x:2"),
            "give base_url or server, not both",
        ),
        (_job([{"name": "lake", "port": 1}, {"name": "lake", "port": 2}]), "name 'lake' is used twice"),
        (_job([{"name": "Lake", "port": 1}], server="Lake"), "env_servers.0.name"),
        (_job([{"name": "lake"}]), "env_servers.0.port"),
    ],
)
def test_bad_env_servers_fail_on_load_naming_the_field(tmp_path: Path, job: dict, message: str) -> None:
    from rollart.spec.config import JobSpecError

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(JobSpecError, match=message):
        load_job(path)


# ---------------------------------------------------------------- integration: a real server process, SIGKILLed


def _start_server(port: int, log: Path) -> subprocess.Popen:
    cmd = [*ROLLART, "env-server", "--env", "frozenlake", "--env-args", json.dumps(RANDOM_MAPS), "--port", str(port)]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.integration
@pytest.mark.chaos  # kills the env server
async def test_a_sigkilled_server_loses_its_sessions_and_restore_replays_them_on_the_restarted_one(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = {"base_url": url}
    server = _start_server(port, tmp_path / "server.log")
    acts = EnvActivities("w", queue="cpu@w")
    try:
        wait_healthy(url, 120, server)
        played, last = ["R", "D", "R"], ""
        seed = next(
            s for s in range(100) if not any(o.done for o in _play(FrozenLake(**RANDOM_MAPS), s, [*played, "D"])[1])
        )
        h = await ENV.run(acts.reset, ResetInput(env="openenv", env_args=args, seed=seed, trajectory_id="t"))
        for a in played:
            last = (await ENV.run(acts.step, StepInput(session_id=h.session_id, action=a))).observation
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        with pytest.raises(ApplicationError) as err:  # mid-episode: the next step finds its session gone
            await ENV.run(acts.step, StepInput(session_id=h.session_id, action="D"))
        assert err.value.type == "SessionLost"
        server = _start_server(port, tmp_path / "server.log")  # what the local stack (or Kubernetes) does
        # restore starts while the server is still coming up: its reset waits for it (connect_wait_s)
        moved = await ENV.run(
            acts.restore,
            RestoreInput(env="openenv", env_args=args, seed=seed, owner_id="t", actions=[played], observations=[last]),
        )
        restored_after = time.monotonic() - killed
        on_fresh = await ENV.run(acts.step, StepInput(session_id=moved.session_id, action="D"))
        reference = FrozenLake(**RANDOM_MAPS)
        reference.reset(seed)
        for a in played:
            reference.step(a)
        assert on_fresh.model_dump(exclude={"messages"}) == {**reference.step("D").__dict__}
        assert on_fresh.messages is None  # a text env sends no messages
        print(f"server SIGKILLed and restarted: session restored {restored_after:.1f}s after the kill")
        assert restored_after < 60
    finally:
        acts.shutdown()
        server.send_signal(signal.SIGKILL)
        server.wait()


# ---------------------------------------------------------------- integration: the local stack, `rollart rollout`


def _env_server_of(proc: psutil.Process, port: int) -> psutil.Process:
    for child in proc.children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "env-server" in cmd and str(port) in cmd:
            return child
    raise LookupError(f"no env server on port {port} under pid {proc.pid}")


_JOB_TOKEN = "token-of-the-chaos-job"
"""The env-server token the rollout below is given (`$ROLLART_ENV_SERVER_TOKEN`): its server serves only it."""


def _stats(port: int) -> dict[str, int]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/stats", headers={"Authorization": f"Bearer {_JOB_TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


@pytest.mark.integration
@pytest.mark.chaos  # kills the env server
def test_rollout_of_the_example_survives_its_env_server_being_sigkilled(tmp_path: Path, tiny_model: Path) -> None:
    """The local stack starts the example's env server; SIGKILLed mid-rollout, it is restarted, every session
    restored (replayed on a fresh one), and every trajectory completes."""
    spec = yaml.safe_load((REPO / "examples" / "openenv.yaml").read_text())
    port = free_port()
    spec["env_servers"][0]["port"] = port
    spec.update(model_dir=str(tiny_model), store={"kind": "local", "path": str(tmp_path / "home" / "store")})
    spec["tasks"][0]["max_turns"] = 12  # long enough episodes that the kill lands mid-episode
    job = tmp_path / "openenv.yaml"
    job.write_text(yaml.safe_dump(spec))
    home = tmp_path / "home"
    cmd = [
        *ROLLART,
        "rollout",
        str(job),
        "-n",
        "16",
        "--home",
        str(home),
        "--port",
        str(free_port()),
        "--ui-port",
        str(free_port()),
    ]
    env = {**os.environ, "ROLLART_ENV_SERVER_TOKEN": _JOB_TOKEN}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 600
        while _stats(port).get("steps", 0) < 20:  # the rollout is under way: sessions hold episodes mid-play
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the rollout never stepped the env server"
            time.sleep(0.2)
        before = _stats(port)
        server = _env_server_of(psutil.Process(proc.pid), port)
        server.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while _stats(port).get("steps", 0) == 0 and proc.poll() is None:  # the restarted server plays again
            time.sleep(0.1)
        resumed_after = time.monotonic() - killed
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert before["sessions"] > 0, before
    assert proc.returncode == 0, out  # rollout exits 0 only if every trajectory completed
    assert re.search(r"16/16 completed", out), out
    restarted = re.search(r"env server frozenlake healthy again ([0-9.]+)s after it died", out)
    assert restarted, out
    control_log = "\n".join(p.read_text() for p in (home / "logs").glob("worker-control-*.log"))
    restores = re.findall(r"(\S+): \w+ failed: SessionLost: .*; restoring its env elsewhere", control_log)
    assert restores, control_log[-3000:]  # the groups in play moved to fresh sessions (their steps replayed)
    print(
        f"env server SIGKILLed with {before['sessions']} sessions open after {before['steps']} steps; healthy again "
        f"{restarted.group(1)}s later; {len(restores)} groups restored, stepping again {resumed_after:.1f}s after the "
        "kill; 16/16 trajectories completed"
    )
    assert not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE
