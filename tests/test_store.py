"""The payload store and Temporal external storage: large payloads leave history, and come back intact."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollart.infra.store.payload import LocalStore, StoreKeyError
from rollart.infra.temporal.connection import data_converter
from rollart.spec.config import StoreConfig
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


# ---------------------------------------------------------------- the stored turn record

OLD_RECORD = {
    "prompt": "SFFF\nFHAH\nmove:",
    "prompt_ids": [5, 6, 7],
    "policy_version": 2,
    "policy_version_end": 3,
    "completions": [
        {"text": "R", "token_ids": [7, 8], "logprobs": [-0.5, -1e-05], "finish_reason": "length"},
        {"text": "", "token_ids": [], "logprobs": [], "finish_reason": "None"},
    ],
}
"""A record as generate wrote it before StoredTurn: a dict through `put_json` (and a vLLM "None" reason)."""


def test_records_already_in_a_store_load_and_new_ones_are_written_byte_for_byte_alike(tmp_path: Path) -> None:
    from rollart.contracts.store import StoredTurn

    store = LocalStore(tmp_path)
    store.put_json("t/old", OLD_RECORD)  # the old writer
    turn = StoredTurn.from_bytes(store.get("t/old"))
    assert turn.prompt_ids == [5, 6, 7] and (turn.policy_version, turn.policy_version_end) == (2, 3)
    assert turn.completions[0].logprobs == [-0.5, -1e-05] and turn.completions[1].finish_reason == "None"
    assert turn.to_bytes() == store.get("t/old")  # the format is unchanged: old readers read new records
    store.put("t/new", turn.to_bytes())
    assert store.get_json("t/new") == OLD_RECORD


def test_malformed_turn_records_are_refused_naming_the_key(tmp_path: Path) -> None:
    from rollart.activities.rl.batch import InvalidSample, load_sequences
    from rollart.contracts.activities import SampleRef

    store = LocalStore(tmp_path)
    bad = {**OLD_RECORD, "completions": [{"token_ids": [1, 2], "logprobs": [-0.1]}]}
    store.put_json("t/bad", bad)
    sample = SampleRef(
        trajectory_id="t",
        task="x",
        group_id="g",
        reward=1.0,
        success=True,
        turn_keys=["t/bad"],
        policy_version_min=0,
        policy_version_max=0,
    )
    with pytest.raises(InvalidSample, match=r"turn record 't/bad' is malformed.*2 tokens but 1 logprobs"):
        load_sequences(store, [sample], [1.0])
    store.put_json("t/bad", OLD_RECORD)
    with pytest.raises(InvalidSample, match=r"turn record 't/bad' has no completion #5 \(it has 2\)"):
        load_sequences(store, [sample.model_copy(update={"completion_index": 5})], [1.0])


def test_finish_reasons_are_the_engines_own() -> None:
    from pydantic import ValidationError

    from rollart.contracts.generation import Completion

    for reason in ("stop", "length", "abort", "error", "repetition", "None"):  # "None": old vLLM records
        assert Completion(text="", num_tokens=0, finish_reason=reason).finish_reason == reason
    with pytest.raises(ValidationError, match="finish_reason"):
        Completion(text="", num_tokens=0, finish_reason="done")


@pytest.mark.parametrize("key", ["../escape", "a//b", "/abs", "a/./b", "spaces here", ""])
def test_local_store_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="invalid store key"):
        LocalStore(tmp_path).put(key, b"x")


@pytest.mark.orchestration
async def test_payloads_over_threshold_go_to_the_store(tmp_path: Path) -> None:
    """3 MiB through an activity result and a workflow result: beyond Temporal's 2 MiB limit, yet it works."""
    cfg = StoreConfig(path=tmp_path / "store", payload_threshold_bytes=64 * 1024)
    from rollart.infra.local.devserver import find_temporal_cli

    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(), data_converter=data_converter(cfg), ui=False
    ) as env:
        client: Client = env.client
        queue = f"blob-{uuid.uuid4().hex[:6]}"
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
    sizes = payload_sizes(history)
    assert sizes and max(sizes) < cfg.payload_threshold_bytes
    [owned] = (tmp_path / "store" / "payloads").iterdir()  # under their owner, the workflow they were stored for
    assert (owned / "owner").read_text() == queue
    stored = [p for p in owned.iterdir() if p.name != "owner"]
    assert len(stored) == 2  # the activity result and the workflow result
    payload = Payload()
    payload.ParseFromString(stored[0].read_bytes())
    assert payload.ByteSize() > 3 * 1024 * 1024


@pytest.mark.orchestration
async def test_workers_with_autoscaling_pollers_serve(bare_env: WorkflowEnvironment) -> None:
    """`temporal.workers.pollers: autoscaling` gives workers the SDK's PollerBehaviorAutoscaling, and they serve."""
    from rollart.infra.temporal.worker_tuning import activity_worker_options, workflow_worker_options
    from rollart.spec.config import WorkerTuning

    tuning = WorkerTuning(pollers="autoscaling")
    queue = f"scaled-{uuid.uuid4().hex[:6]}"
    options = {**workflow_worker_options(tuning), **activity_worker_options(tuning)}
    async with Worker(bare_env.client, task_queue=queue, workflows=[BlobWorkflow], activities=[make_blob], **options):
        result = await bare_env.client.execute_workflow(BlobWorkflow.run, 1, id=queue, task_queue=queue)
    assert result == "x" * 1024 + "!"
