"""The command line as a user meets it: --help everywhere, `rollart up` and `rollart worker` as processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rollart.client.rollout import plan_trajectories
from rollart.infra.local.devserver import DevServer, free_port
from rollart.spec.config import EngineConfig, load_job
from tests.support.cli import rollart
from tests.support.paths import REPO

ROLLART = [sys.executable, "-m", "rollart.cli"]


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["init-model"],
        ["worker"],
        ["autoscale"],
        ["up"],
        ["rollout"],
        ["train"],
        ["status"],
        ["plot"],
        ["k8s"],
        ["k8s", "render"],
        ["k8s", "apply"],
        ["eval"],
        ["export"],
        ["attach"],
        ["env-server"],
        ["show"],
        ["trajectories"],
        ["report"],
        ["sft"],
        ["sft-data"],
    ],
)
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    done = rollart(capsys, *command, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: rollart")


@pytest.mark.integration
def test_the_console_script_exits_with_the_commands_code() -> None:
    """The one real process of the argument checks: `main` ends in os._exit with what `run` returned."""
    ok = subprocess.run([*ROLLART, "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("usage: rollart")
    bad = subprocess.run([*ROLLART, "autoscale", "--pool", "gpu"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown pool 'gpu'" in bad.stderr, bad.stderr
    flag = subprocess.run([*ROLLART, "train", "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert flag.returncode == 2 and "unrecognized arguments: --no-such-flag" in flag.stderr, flag.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool", "gpu"], "unknown pool 'gpu'; pools are control, cpu, h800, h20, serverless, trainer"),
        (
            ["--pool", "h800"],
            "'h800' has a fixed set of workers (`rollart worker --pool h800`); only reward pools autoscale: serverless",
        ),
        (["--min", "3", "--max", "2"], "min_workers (3) exceeds max_workers (2)"),
    ],
)
def test_autoscale_rejects_bad_pools_and_bounds(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    done = rollart(capsys, "autoscale", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU: cuda is not refused here")
def test_a_cuda_trainer_on_a_machine_without_a_gpu_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        (REPO / "examples" / "frozenlake.yaml").read_text().replace("trainer:\n", "trainer:\n  device: cuda\n")
    )
    done = rollart(capsys, "train", str(job), "--home", str(tmp_path / "home"))
    assert done.returncode == 2 and "trainer.device is cuda, but this process sees no GPU" in done.stderr, done.stderr
    assert not (tmp_path / "home" / "temporal.db").exists()  # no stack was started
    worker = rollart(
        capsys, "worker", "--pool", "trainer", "--job", str(job), "--temporal-address", f"127.0.0.1:{free_port()}"
    )
    assert worker.returncode != 0 and "sees no GPU" in worker.stderr, worker.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2"], "2 nodes need --rdzv HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv", "10.0.0.1:29400"], "--node-rank 2 is not below --nnodes 2"),
        (
            ["--nnodes", "3", "--rdzv", "10.0.0.1:29400", "--job", str(REPO / "examples" / "frozenlake_megatron.yaml")],
            "tensor 2 x data 1 = 2 ranks do not split over --nnodes 3",
        ),
    ],
)
def test_trainer_node_flags_are_checked(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    done = rollart(capsys, "worker", "--pool", "trainer", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    done = rollart(capsys, "worker", "--pool", "h800", "--nnodes", "2")
    assert done.returncode == 2 and "for --pool trainer only" in done.stderr


def test_init_model_builds_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "m"
    first = rollart(capsys, "init-model", "--out", str(out))
    assert first.returncode == 0 and "built tiny model" in first.stdout
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    again = rollart(capsys, "init-model", "--out", str(out))
    assert again.returncode == 0 and "already holds a model" in again.stdout


def test_plan_draws_groups_by_weight() -> None:
    job = load_job(REPO / "examples" / "frozenlake.yaml")
    two = job.model_copy(update={"tasks": [job.tasks[0], job.tasks[0].model_copy(update={"name": "b", "weight": 3.0})]})
    plan = plan_trajectories(two, 400, seed=1)
    assert len(plan) == 400
    seeds = {}
    for inp in plan:  # every group of 8 shares a seed and a task
        seeds.setdefault(inp.seed, set()).add(inp.task.name)
    assert all(len(names) == 1 for names in seeds.values())
    share_b = sum(inp.task.name == "b" for inp in plan) / len(plan)
    assert 0.6 < share_b < 0.9  # weight 3 : 1
    assert plan == plan_trajectories(two, 400, seed=1)


def test_rollout_units_follow_each_tasks_rollout_unit() -> None:
    """Members of a grouped multi-turn task's group share a workflow; everything else gets one each."""
    from rollart.client.rollout import rollout_units

    job = load_job(REPO / "examples" / "frozenlake.yaml")  # rollout_unit group, groups of 8
    single = job.tasks[0].model_copy(update={"name": "single", "rollout_unit": "trajectory"})
    two = job.model_copy(update={"tasks": [job.tasks[0], single]})
    plan = plan_trajectories(two, 60, seed=2)
    units = rollout_units(plan)
    assert [i for first, members in units for i in range(first, first + len(members))] == list(range(60))
    for first, members in units:
        if members[0].task.name == "single":
            assert len(members) == 1
        else:
            assert len({m.seed for m in members}) == 1 and len(members) == (8 if first + 8 <= 60 else 60 - first)
    assert any(m[0].task.name == "single" for _, m in units) and any(len(m) == 8 for _, m in units)


def test_free_ports_stay_out_of_the_ephemeral_range_and_skip_taken_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port the kernel hands to outgoing connections could be taken before a server binds it (a CI flake)."""
    import socket

    from rollart.infra.local import devserver

    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    ports = {devserver.free_port() for _ in range(20)}
    assert all(p in devserver.FREE_PORTS and p + 1000 < int(ephemeral[0]) for p in ports)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(devserver, "FREE_PORTS", range(busy, busy + 1))
        with pytest.raises(OSError, match="no free port"):
            devserver.free_port()


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout_s: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"exited ({proc.poll()}) before {needle!r}:\n" + "".join(seen))
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"no {needle!r} within {timeout_s}s:\n" + "".join(seen))


@pytest.mark.integration
def test_up_serves_the_ui_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port, ui = free_port(), free_port()
    cmd = [
        *ROLLART,
        "up",
        "--pools",
        "control,cpu,serverless",
        "--home",
        str(tmp_path),
        "--port",
        str(port),
        "--ui-port",
        str(ui),
        "--control-processes",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        lines = _wait_for_line(proc, "Ctrl-C stops everything", 120)
        assert any(f"Temporal UI: http://127.0.0.1:{ui}" in line for line in lines)
        pids = [int(line.split("pid")[1]) for line in lines if line.strip().startswith("worker ")]
        assert len(pids) == 4  # two control processes on the one control queue
        assert sum(line.strip().startswith(("worker control#0 ", "worker control#1 ")) for line in lines) == 2, lines
        assert any("serverless#0 (elastic)" in line for line in lines)  # the autoscaler runs the serverless pool
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/api/v1/namespaces/default/workflows", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0 and "stopped." in out
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_worker_joins_a_given_server_and_drains_on_sigterm(tmp_path: Path) -> None:
    with DevServer(db_file=tmp_path / "t.db", port=free_port(), ui_port=None) as server:
        cmd = [
            *ROLLART,
            "worker",
            "--pool",
            "cpu",
            "--temporal-address",
            server.address,
            "--store-path",
            str(tmp_path),
            "--task-queue-prefix",
            "team-a-",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        try:
            lines = _wait_for_line(proc, "ready: pool=cpu", 60)
            assert any("queues=[team-a-cpu, team-a-cpu@cpu-" in line for line in lines)
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            assert proc.returncode == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.integration
def test_train_interrupted_terminates_its_job_and_stops_the_stack(tmp_path: Path, tiny_model: Path) -> None:
    """The HF engine: what is under test is the command's interruption and the stack's exit, not vLLM (whose
    engine processes the chaos tier's worker kills check for leftovers); it starts 15 s sooner."""
    base = load_job(REPO / "examples" / "frozenlake.yaml")
    store = base.store.model_copy(update={"path": tmp_path / "store"})
    job = base.model_copy(update={"model_dir": tiny_model, "store": store, "engine": EngineConfig(kind="hf")})
    spec = tmp_path / "job.json"
    spec.write_text(job.model_dump_json())
    cmd = [
        *ROLLART,
        "train",
        str(spec),
        "--steps",
        "50",
        "--home",
        str(tmp_path / "home"),
        "--run-dir",
        str(tmp_path / "run"),
        "--port",
        str(free_port()),
        "--ui-port",
        str(free_port()),
        "--task-queue-prefix",
        "it-",
    ]  # every worker, the job and its children on it-* queues
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        _wait_for_line(proc, "step 1/50", 240)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert "interrupted: terminated job frozenlake-" in out  # the job id, though the job is gone
        assert "the local stack stops with this command" in out
        assert proc.returncode != 0
        assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") >= 1
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "home").rglob("*.log"))
        for pool in ("control", "cpu", "h800", "serverless", "trainer"):
            assert f"queues=[it-{pool}" in logs, pool
        leftovers = subprocess.run(["pgrep", "-f", str(tmp_path / "home")], capture_output=True, text=True)
        assert leftovers.stdout.strip() == ""  # no worker or server outlives the command
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _fake_run(run_dir: Path, success: list[float]) -> Path:
    run_dir.mkdir(parents=True)
    rows = [
        {
            "step": i,
            "elapsed_s": 3.0 * (i + 1),
            "reward_mean": s,
            "success_rate": s,
            "task_success": {"t": s},
            "staleness_mean": 1.0,
            "dropped": 0,
            "failed": 0,
        }
        for i, s in enumerate(success)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_plot_one_run_and_compare_several(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a = _fake_run(tmp_path / "a", [0.0, 0.1, 0.5, 0.9])
    b = _fake_run(tmp_path / "b", [0.0, 0.0, 0.2, 0.4])
    one = rollart(capsys, "plot", str(a))
    assert one.returncode == 0 and (a / "learning.png").read_bytes()[:4] == b"\x89PNG"
    out = tmp_path / "cmp.png"
    two = rollart(capsys, "plot", str(a), str(b), "--labels", "bound 0,bound 1", "--out", str(out))
    assert two.returncode == 0 and out.read_bytes()[:4] == b"\x89PNG", two.stderr
    bad = rollart(capsys, "plot", str(a), str(b), "--labels", "only-one")
    assert bad.returncode != 0 and "2 run dirs" in bad.stderr
    missing = rollart(capsys, "plot", str(tmp_path / "nope"))
    assert missing.returncode != 0 and "metrics.jsonl" in missing.stderr


def test_moving_mean_is_a_trailing_window() -> None:
    from rollart.client.plot import _moving_mean

    assert _moving_mean([0.0, 1.0, 1.0, 0.0], 2) == [0.0, 0.5, 1.0, 0.5]


def test_eval_scores_the_untrained_policy_and_rejects_unknown_weights(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model: Path
) -> None:
    spec = {
        "name": "ev",
        "model_dir": str(tiny_model),
        "store": {"path": str(tmp_path / "store")},
        "engine": {"kind": "hf", "max_model_len": 128},
        "tasks": [
            {
                "name": "lake",
                "env": "frozenlake",
                "reward": "success",
                "max_turns": 3,
                "env_args": {"maps": "standard"},
                "sampling": {"max_tokens": 1},
            }
        ],
    }
    job = tmp_path / "job.json"
    job.write_text(json.dumps(spec))
    done = rollart(capsys, "eval", str(job), "-n", "3")
    assert done.returncode == 0, done.stderr
    row = next(line.split() for line in done.stdout.splitlines() if line.startswith("lake"))
    assert row[1:3] == ["0", "3"] and 0.0 <= float(row[3]) <= 1.0  # version 0, 3 episodes
    missing = rollart(capsys, "eval", str(job), "--job-id", "nope", "-n", "1")
    assert missing.returncode != 0 and "'nope' has published no weights" in missing.stderr
    bad = rollart(capsys, "eval", str(job), "--task", "x")
    assert bad.returncode != 0 and "no task 'x'" in bad.stderr


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["eval"], ["-n", "1"]),
        (["rollout"], ["--home", "HOME"]),
        (["train"], ["--home", "HOME"]),
        (["worker", "--pool", "h800", "--job"], ["--temporal-address", "127.0.0.1:1"]),
    ],
)
def test_a_mistyped_model_dir_fails_instead_of_building_a_fresh_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str], extra: list[str]
) -> None:
    typo = tmp_path / "modles" / "tiny"
    spec = {
        "name": "typo",
        "model_dir": str(typo),
        "store": {"path": str(tmp_path / "store")},
        "tasks": [{"name": "lake", "env": "frozenlake", "reward": "success"}],
    }
    job = tmp_path / "job.json"
    job.write_text(json.dumps(spec))
    extra = [str(tmp_path / "home") if a == "HOME" else a for a in extra]
    done = rollart(capsys, *command, str(job), *extra)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"model_dir {typo} does not exist" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not typo.exists() and not (tmp_path / "home" / "temporal.db").exists()  # nothing built, no stack started
