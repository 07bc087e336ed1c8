"""Mooncake Store against a real `mooncake_master` and store keeper on loopback (free ports, stopped by PID).

Payloads and weights cross between processes; a missing key or a dead master is
an error naming the key, never an empty read; `fallback: local` loses nothing
when the master dies mid-run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollart.infra.config import MooncakeConfig, StoreConfig
from rollart.infra.local.mooncake_service import MooncakeService
from rollart.infra.store.mooncake import MooncakeStore
from rollart.infra.store.payload import MirroredStore, StoreKeyError, StoreUnavailable, open_store
from rollart.infra.store.weights import fetch_latest, latest_weights, publish, weights_key
from tests.support.cli import rollart

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeService]:
    """One master + keeper for the module's tests that do not kill it."""
    home = tmp_path_factory.mktemp("mooncake")
    cfg = StoreConfig(
        kind="mooncake",
        path=home / "store",
        fallback="none",
        mooncake=MooncakeConfig(keeper_segment_mib=256, buffer_mib=8),
    )
    with MooncakeService(cfg, log_dir=home / "logs") as svc:
        yield svc


@pytest.fixture
def fresh_mooncake(tmp_path: Path) -> Iterator[MooncakeService]:
    """A master + keeper of its own, for tests that kill the master."""
    cfg = StoreConfig(
        kind="mooncake",
        path=tmp_path / "store",
        mooncake=MooncakeConfig(keeper_segment_mib=64, buffer_mib=8, retry_after_s=0.5),
    )
    with MooncakeService(cfg, log_dir=tmp_path / "logs") as svc:
        yield svc


def _in_other_process(cfg: StoreConfig, code: str) -> str:
    """Run `code` in a fresh Python process with `store` opened on `cfg`; its stdout."""
    script = (
        textwrap.dedent("""
        import os, sys
        from rollart.infra.config import StoreConfig
        from rollart.infra.store.payload import open_store
        store = open_store(StoreConfig.model_validate_json(sys.argv[1]))
    """)
        + textwrap.dedent(code)
        + "\nsys.stdout.flush(); os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, cfg.model_dump_json()], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.integration
def test_payloads_and_weights_cross_processes(mooncake: MooncakeService, tmp_path: Path) -> None:
    """Another process writes a turn record and a 24 MiB weights blob (zero-copy path); this one reads both."""
    cfg = mooncake.config
    job = f"job-{uuid.uuid4().hex[:6]}"
    _in_other_process(
        cfg,
        f"""
        from rollart.infra.store.weights import publish
        store.put_json("turns/{job}/t0", {{"token_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0]}})
        publish(store, "{job}", 1, bytes(range(256)) * (24 * 4096))
    """,
    )
    store = open_store(cfg)
    assert isinstance(store, MooncakeStore)
    assert store.get_json(f"turns/{job}/t0") == {"token_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0]}
    ref = latest_weights(store, job)
    assert ref is not None and ref.version == 1
    assert store.get(ref.key) == bytes(range(256)) * (24 * 4096)
    # and back: this process publishes v2, the other one reads it into a file
    publish(store, job, 2, b"\x07" * (9 << 20))
    out = _in_other_process(
        cfg,
        f"""
        from pathlib import Path
        from rollart.infra.store.weights import fetch_latest
        ref = fetch_latest(store, "{job}", Path("{tmp_path}") / "w.bin")
        data = (Path("{tmp_path}") / "w.bin").read_bytes()
        print(ref.version, len(data), set(data))
    """,
    )
    assert out.split() == ["2", str(9 << 20), "{7}"]


@pytest.mark.integration
def test_missing_key_is_an_error_naming_it(mooncake: MooncakeService) -> None:
    store = open_store(mooncake.config)
    with pytest.raises(StoreKeyError, match=r"key 'nowhere/k' is not in Mooncake .*fallback: local"):
        store.get("nowhere/k")
    assert not store.exists("nowhere/k")
    store.put("empty/k", b"")
    assert store.get("empty/k") == b""  # an empty value is a value, not a miss


@pytest.mark.integration
def test_publish_keeps_recent_versions_and_overwrites_latest(mooncake: MooncakeService) -> None:
    store = open_store(mooncake.config)
    job = f"keep-{uuid.uuid4().hex[:6]}"
    for v in range(1, 6):
        publish(store, job, v, bytes([v]) * 1000, keep=2)
    assert [store.exists(weights_key(job, v)) for v in range(1, 6)] == [False, False, False, True, True]
    ref = latest_weights(store, job)
    assert ref is not None and ref.version == 5


@pytest.mark.integration
@pytest.mark.chaos  # kills the master
def test_master_killed_without_fallback_is_a_clear_error(fresh_mooncake: MooncakeService) -> None:
    cfg = fresh_mooncake.config.model_copy(update={"fallback": "none"})
    store = MooncakeStore.connect(cfg.mooncake)
    store.put("a/k", b"v")
    fresh_mooncake.kill_master()
    with pytest.raises(StoreUnavailable, match=r"master 127\.0\.0\.1:\d+ unreachable while reading 'a/k'.*restart it"):
        store.get("a/k")
    with pytest.raises(StoreUnavailable, match="writing 'b/k'"):
        store.put("b/k", b"v")
    store.close()


@pytest.mark.integration
@pytest.mark.chaos  # kills the master
def test_master_killed_with_local_fallback_loses_nothing(fresh_mooncake: MooncakeService, tmp_path: Path) -> None:
    """Everything written before, during and after the outage reads back; after a restart Mooncake serves again."""
    cfg = fresh_mooncake.config
    store = MooncakeStore.connect(cfg.mooncake)
    mirrored = MirroredStore(store, open_store(cfg.model_copy(update={"kind": "local"})), retry_after_s=0.5)
    mirrored.put_json("t/before", {"ids": [1]})
    publish(mirrored, "j", 1, b"w" * (6 << 20))
    fresh_mooncake.kill_master()
    assert mirrored.get_json("t/before") == {"ids": [1]}
    mirrored.put_json("t/during", {"ids": [2]})
    ref = fetch_latest(mirrored, "j", tmp_path / "w.bin")
    assert ref is not None and ref.version == 1 and (tmp_path / "w.bin").stat().st_size == 6 << 20
    fresh_mooncake.start_master()
    import time

    time.sleep(0.6)  # past retry_after_s: the next write tries Mooncake again (the client reconnects itself)
    deadline = time.monotonic() + 20
    back = False
    while not back and time.monotonic() < deadline:
        mirrored.put_json("t/after", {"ids": [3]})
        try:
            back = store.exists("t/after")
        except StoreUnavailable:
            time.sleep(0.6)
    assert back, "Mooncake did not come back after the master restarted"
    assert [mirrored.get_json(f"t/{k}")["ids"] for k in ("before", "during", "after")] == [[1], [2], [3]]
    with pytest.raises(StoreKeyError, match="neither in"):
        mirrored.get("t/never")
    store.close()


def test_config_rejects_a_bad_master_address() -> None:
    from pydantic import ValidationError

    from rollart.infra.config import JobSpec, format_validation_error

    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(
            {
                "tasks": [{"name": "a", "env": "x", "reward": "y"}],
                "store": {"kind": "mooncake", "mooncake": {"master": "no-port"}},
            }
        )
    assert "store.mooncake.master" in format_validation_error(err.value, "job.yaml")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--store-master", "not an address"], "--store-master: expected HOST:PORT"),
        ([], "the job's store is Mooncake but no master is given: pass --store-master"),
    ],
)
def test_worker_needs_a_valid_master_for_a_mooncake_job(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], message: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("tasks: [{name: a, env: frozenlake, reward: success}]\nstore: {kind: mooncake}\n")
    out = rollart(capsys, "worker", "--pool", "cpu", "--job", str(job), *extra)
    assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.integration
async def test_temporal_payloads_over_the_threshold_go_through_mooncake(mooncake: MooncakeService) -> None:
    """Temporal's external storage on Mooncake: 3 MiB through an activity and a workflow result, history stays small."""
    from temporalio.client import Client
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    from rollart.infra.local.devserver import find_temporal_cli
    from rollart.infra.temporal.connection import data_converter
    from tests.support.blob import BlobWorkflow, make_blob
    from tests.support.history import payload_sizes

    cfg = mooncake.config.model_copy(update={"payload_threshold_bytes": 64 * 1024})
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(), data_converter=data_converter(cfg), ui=False
    ) as env:
        client: Client = env.client
        queue = f"mc-blob-{uuid.uuid4().hex[:6]}"
        async with Worker(
            client,
            task_queue=queue,
            workflows=[BlobWorkflow],
            activities=[make_blob],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await client.start_workflow(BlobWorkflow.run, 3 * 1024, id=queue, task_queue=queue)
            assert await handle.result() == "x" * (3 * 1024 * 1024) + "!"
            history = await handle.fetch_history()
    assert max(payload_sizes(history)) < cfg.payload_threshold_bytes
    store = open_store(cfg)
    assert isinstance(store, MooncakeStore)  # fallback none: the round trip above went through Mooncake only
    assert not cfg.path.exists()  # and nothing landed in the local directory
