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
import torch

from rollart.infra.local.mooncake_service import MooncakeService
from rollart.infra.store.mooncake import MooncakeStore
from rollart.infra.store.payload import MirroredStore, StoreKeyError, StoreUnavailable, open_store
from rollart.infra.store.weight_stream import WeightsTransferError, read_all
from rollart.infra.store.weights import manifest_key, read_manifest
from rollart.spec.config import MooncakeConfig, StoreConfig
from tests.support.cli import rollart
from tests.support.weights import latest_tensors
from tests.support.weights import publish_tensors as publish

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
        from rollart.spec.config import StoreConfig
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
        import torch
        from tests.support.weights import publish_tensors as publish
        store.put_json("turns/{job}/t0", {{"token_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0]}})
        tensors = {{f"a{{i}}": torch.arange(3 << 19, dtype=torch.float32) + i for i in range(4)}}
        publish(store, "{job}", 1, {{**tensors, "b": torch.ones(3)}})
    """,
    )
    store = open_store(cfg)
    assert isinstance(store, MooncakeStore)
    assert store.get_json(f"turns/{job}/t0") == {"token_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0]}
    got = latest_tensors(store, job)  # 4 x 6 MiB and 12 bytes in buckets of at most 8 MiB: a0 | a1 | a2 | a3 b
    assert [len(b.tensors) for b in read_manifest(store, manifest_key(job, 1)).buckets] == [1, 1, 1, 2]
    assert all(torch.equal(got[f"a{i}"], torch.arange(3 << 19, dtype=torch.float32) + i) for i in range(4))
    assert torch.equal(got["b"], torch.ones(3))
    # and back: this process publishes v2, the other one streams it
    publish(store, job, 2, {"a": torch.full((9 << 18,), 7.0)})
    out = _in_other_process(
        cfg,
        f"""
        from rollart.infra.store.weight_stream import read_all
        from rollart.infra.store.weights import latest_weights, read_manifest
        ref = latest_weights(store, "{job}")
        a = read_all(store, read_manifest(store, ref.key))["a"]
        print(ref.version, a.numel(), set(a.tolist()))
    """,
    )
    assert out.split() == ["2", str(9 << 18), "{7.0}"]


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
    buckets = {}
    for v in range(1, 6):
        publish(store, job, v, {"w": torch.full((1000,), float(v))}, keep=2)
        buckets[v] = read_manifest(store, manifest_key(job, v)).buckets[0].key
    assert [store.exists(manifest_key(job, v)) for v in range(1, 6)] == [False, False, False, True, True]
    assert [store.exists(buckets[v]) for v in range(1, 6)] == [False, False, False, True, True]
    assert latest_tensors(store, job)["w"][0] == 5.0


@pytest.mark.integration
@pytest.mark.chaos  # kills the store keeper
def test_weights_whose_peer_died_fail_naming_version_and_peer(fresh_mooncake: MooncakeService) -> None:
    """The keeper holding a version's buckets dies: reading it fails within the timeout, naming the version, its
    publisher and the store, and never hangs."""
    import time

    cfg = fresh_mooncake.config.model_copy(update={"fallback": "none"})
    store = MooncakeStore.connect(cfg.mooncake)
    store._config = cfg
    publish(store, "peer", 3, {"w": torch.ones(1 << 20)}, timeout_s=5.0)
    manifest = read_manifest(store, manifest_key("peer", 3))
    fresh_mooncake.keeper_proc.kill()
    fresh_mooncake.keeper_proc.wait()
    t0 = time.monotonic()
    with pytest.raises(WeightsTransferError) as err:
        read_all(store, manifest)
    took = time.monotonic() - t0
    assert "weights v3 of job 'peer'" in str(err.value) and "published by trainer" in str(err.value)
    assert "Mooncake" in str(err.value) and took < manifest.timeout_s + 2
    store.close()


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
    publish(mirrored, "j", 1, {"w": torch.full((6 << 18,), 2.0)})
    fresh_mooncake.kill_master()
    assert mirrored.get_json("t/before") == {"ids": [1]}
    mirrored.put_json("t/during", {"ids": [2]})
    w = latest_tensors(mirrored, "j")["w"]
    assert w.numel() == 6 << 18 and set(w.tolist()) == {2.0}
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

    from rollart.spec.config import JobSpec, format_validation_error

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
