"""The payload store and Temporal external storage: large payloads leave history, and come back intact."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from rollart.infra.config import StoreConfig
from rollart.infra.store import LocalStore, StoreKeyError
from rollart.infra.temporal import data_converter
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.support.blob import BlobWorkflow, make_blob
from tests.support.history import payload_sizes


def test_local_store_round_trip_and_missing_key(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/b/c", b"\x00\x01")
    assert store.get("a/b/c") == b"\x00\x01" and store.exists("a/b/c")
    store.put_json("j/1", {"x": [1, 2.5]})
    assert store.get_json("j/1") == {"x": [1, 2.5]}
    store.delete("a/b/c")
    with pytest.raises(StoreKeyError, match="key 'a/b/c' is not in the local store"):
        store.get("a/b/c")
    assert list(tmp_path.rglob(".tmp-*")) == []


@pytest.mark.parametrize("key", ["../escape", "a//b", "/abs", "a/./b", "spaces here", ""])
def test_local_store_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="invalid store key"):
        LocalStore(tmp_path).put(key, b"x")


@pytest.mark.orchestration
async def test_payloads_over_threshold_go_to_the_store(tmp_path: Path) -> None:
    """3 MiB through an activity result and a workflow result: beyond Temporal's 2 MiB limit, yet it works."""
    cfg = StoreConfig(path=tmp_path / "store", payload_threshold_bytes=64 * 1024)
    from rollart.infra.devserver import find_temporal_cli

    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(), data_converter=data_converter(cfg), ui=False
    ) as env:
        client: Client = env.client
        queue = f"blob-{uuid.uuid4().hex[:6]}"
        async with Worker(client, task_queue=queue, workflows=[BlobWorkflow], activities=[make_blob],
                          workflow_runner=UnsandboxedWorkflowRunner()):  # fmt: skip
            handle = await client.start_workflow(BlobWorkflow.run, 3 * 1024, id=queue, task_queue=queue)
            assert await handle.result() == "x" * (3 * 1024 * 1024) + "!"
            history = await handle.fetch_history()
    sizes = payload_sizes(history)
    assert sizes and max(sizes) < cfg.payload_threshold_bytes
    stored = list((tmp_path / "store" / "payloads").iterdir())
    assert len(stored) == 2  # the activity result and the workflow result
    payload = Payload()
    payload.ParseFromString(stored[0].read_bytes())
    assert payload.ByteSize() > 3 * 1024 * 1024
