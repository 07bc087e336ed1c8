"""The training workflow's history records little per trajectory (issue 48): a unit's task is a claim stored once,
a result reaches the parent once (by its report, not again as the unit's return), and turn keys are written as a
prefix and a count; claims go once their job's workflows are gone (`rollart store gc`). TrainingWorkflow against a
dev server with stand-in activities, and the pieces without one.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo
from temporalio.testing import WorkflowEnvironment

from rollart.client.claims import owners, sweep
from rollart.client.job_trajectories import list_trajectories
from rollart.client.unit_history import results_of
from rollart.contracts.activities import SampleRef, turn_key
from rollart.contracts.rollouts import TrajectoryArgs, TrajectoryInput, TrajectoryResult
from rollart.infra.store.payload import LocalStore
from rollart.infra.temporal.payload_storage import (
    CLAIM_METADATA,
    ClaimingPayloadConverter,
    StorePayloadDriver,
    external_storage,
)
from rollart.spec.config import TaskSpec
from rollart.workflows import reporting
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task
from tests.test_lost_children import balanced, job, start

REFERENCE = b"temporal.api.sdk.v1.ExternalStorageReference"  # what the SDK puts in place of a stored payload


def claim_key(reference: Payload) -> str:
    """The store key a claim names: what makes two claims one. Not the reference's bytes: its metadata is a map,
    which protobuf writes in any order, and histories give it back in either."""
    return json.loads(reference.data)["claimData"]["key"]


@pytest.mark.unit
def test_turn_keys_are_a_prefix_and_a_count_in_json_and_a_list_in_python() -> None:
    keys = [turn_key("job", "job-g000001-0", k) for k in range(8)]
    r = TrajectoryResult(trajectory_id="t", task="x", seed=1, status="completed", turn_keys=keys)
    wire = json.loads(r.model_dump_json())
    assert wire["turn_keys"] == {"prefix": "trajectories/job/job-g000001-0/turn-", "count": 8}
    assert TrajectoryResult.model_validate_json(r.model_dump_json()) == r and r.model_dump()["turn_keys"] == keys
    sample = SampleRef.model_validate(
        {**r.model_dump(include={"trajectory_id", "task", "group_id"}), "reward": 1.0, "success": True}
        | {"turn_keys": wire["turn_keys"], "policy_version_min": 0, "policy_version_max": 0}
    )
    assert sample.turn_keys == keys
    for odd in (keys[1:], [keys[0], keys[2]], ["a", "b"], keys[:1]):  # not a run from 000: written as they are
        r2 = r.model_copy(update={"turn_keys": odd})
        assert json.loads(r2.model_dump_json())["turn_keys"] == odd
        assert TrajectoryResult.model_validate_json(r2.model_dump_json()) == r2


@pytest.mark.unit
def test_a_trajectory_input_splits_into_args_and_task_and_joins_back() -> None:
    whole = TrajectoryInput(task=frozenlake_task(), seed=7, job_id="j", report_to="j")
    args, task = whole.split()
    assert type(args) is TrajectoryArgs and "task" not in args.model_dump()
    assert args.with_task(task) == whole and whole.with_task(None) is whole
    # one argument (a client's start, `temporal workflow start`) reaches the workflow as a dict
    assert TrajectoryArgs.whole(whole.model_dump(mode="json"), None) == whole
    assert TrajectoryArgs.whole(args.model_dump(mode="json"), task) == whole
    with pytest.raises(ValidationError, match="task"):  # a unit started without its task fails on bad input
        args.with_task(None)


@pytest.mark.unit
def test_a_task_payload_goes_to_the_store_whatever_its_size_and_others_only_when_large(tmp_path) -> None:
    converter = ClaimingPayloadConverter()
    task, args = converter.to_payloads([frozenlake_task(), TrajectoryArgs(seed=1)])
    assert task.metadata[CLAIM_METADATA] == b"TaskSpec" and CLAIM_METADATA not in args.metadata
    storage = external_storage(LocalStore(tmp_path), threshold_bytes=4096)
    driver = storage.drivers[0]
    pick = storage.driver_selector
    assert pick is not None
    big = converter.to_payloads(["x" * 5000])[0]
    assert [pick(None, p) for p in (task, args, big)] == [driver, None, driver]  # type: ignore[arg-type]


@pytest.mark.unit
async def test_a_payload_is_stored_under_one_key_whatever_the_order_of_its_metadata(tmp_path) -> None:
    """Protobuf writes a map in any order (upb's follows a hash seeded per process): keyed by those bytes, one task
    was stored under a key per worker process, and units of one task started with different claims."""
    [task] = ClaimingPayloadConverter().to_payloads([frozenlake_task()])
    names = [f"m{i:02d}" for i in range(64)]  # enough entries that two insertion orders serialize apart
    ahead, behind = Payload(), Payload()
    ahead.CopyFrom(task)
    behind.CopyFrom(task)
    for name in names:
        ahead.metadata[name] = b"1"
    for name in reversed(names):
        behind.metadata[name] = b"1"
    driver, context = StorePayloadDriver(LocalStore(tmp_path)), StorageDriverStoreContext(target=None)
    [first], [second] = await driver.store(context, [ahead]), await driver.store(context, [behind])
    assert ahead == behind and first.claim_data == second.claim_data


@pytest.mark.unit
async def test_a_large_train_step_or_carried_state_goes_to_the_store_and_comes_back(tmp_path) -> None:
    """A train step's samples and the state a run carries are written once a step or a run: from
    `BULK_CLAIM_BYTES` each is a claim in the history (a paper-sized job's would be ~0.4 KB a trajectory each), a
    small one stays readable."""
    from rollart.contracts.activities import BULK_CLAIM_BYTES, TrainStepInput
    from rollart.contracts.training import TrainingInput, TrainingPlan, TrainingState
    from rollart.infra.temporal.connection import data_converter
    from rollart.spec.config import JobSpec, StoreConfig, TrainerConfig

    def step(n: int) -> TrainStepInput:
        ids = [f"job-g{i:06d}-0" for i in range(n)]
        samples = [
            SampleRef(
                trajectory_id=t,
                task="frozenlake",
                group_id=t[:-2],
                reward=1.0,
                success=True,
                turn_keys=[turn_key("job", t, 0)],
                policy_version_min=3,
                policy_version_max=3,
            )
            for t in ids
        ]
        trainer = TrainerConfig()
        return TrainStepInput(job_id="job", step=3, samples=samples, model_dir="m", run_dir="r", trainer=trainer)

    small, large = step(2), step(100)
    plan = TrainingPlan.of(JobSpec(tasks=[frozenlake_task()]))
    state = TrainingState(buffer=large.samples)
    carried = TrainingInput(plan=plan, job_id="job", run_dir="r", state=state)
    converter = ClaimingPayloadConverter()
    marks = [p.metadata.get(CLAIM_METADATA) for p in converter.to_payloads([small, large, carried])]
    assert marks == [None, b"TrainStepInput", b"TrainingInput"]
    assert len(converter.to_payloads([large])[0].data) > BULK_CLAIM_BYTES
    dc = data_converter(StoreConfig(path=tmp_path))
    for value in (large, carried):
        [payload] = await dc.encode([value])
        assert payload.metadata["messageType"] == REFERENCE and payload.ByteSize() < 1024
        assert await dc.decode([payload], [type(value)]) == [value]
    [payload] = await dc.encode([small])
    assert payload.metadata.get("messageType") != REFERENCE


@pytest.mark.unit
async def test_a_unit_returns_only_what_its_report_did_not_deliver(monkeypatch: pytest.MonkeyPatch) -> None:
    delivered = iter([True, False, True])

    async def report(report_to: str | None, results: list[TrajectoryResult]) -> bool:
        return next(delivered)

    monkeypatch.setattr(reporting, "report", report)
    rs = [TrajectoryResult(trajectory_id=f"t{i}", task="x", seed=i, status="completed") for i in range(3)]
    send = reporting.Reporter("parent")
    for r in rs:
        await send([r])
    assert send.undelivered == [rs[1]]


@pytest.mark.orchestration
async def test_the_parent_holds_a_claim_per_task_and_each_result_once(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    client = bare_env.client
    w = StandIns(prefix=queue_prefix, turns=2, score=full_marks)
    async with standin_workers(client, w):
        handle = await start(client, job(queue_prefix, steps=2), queue_prefix)
        result = await asyncio.wait_for(handle.result(), 90)
    assert balanced(result)
    starts = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in (await handle.fetch_history()).events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    assert len(starts) == result.started
    assert all(a.input.payloads[1].metadata["messageType"] == REFERENCE for a in starts)
    claims = Counter(claim_key(a.input.payloads[1]) for a in starts)
    assert len(claims) == 1  # the task stored once, every start naming it
    [task] = await client.data_converter.decode([starts[0].input.payloads[1]], [TaskSpec])  # the store has it
    assert task.name == job(queue_prefix).tasks[0].name
    assert all(len(a.input.payloads[0].data) < 400 for a in starts)  # the rest of the input: seed, ids, queues

    reported = 0
    for a in starts:
        wid = a.workflow_id
        history = await client.get_workflow_handle(wid).fetch_history()
        done = history.events[-1].workflow_execution_completed_event_attributes
        if not done.ByteSize():
            continue  # cancelled as the job ended
        [returned] = await client.data_converter.decode(done.result.payloads, [TrajectoryResult | None])
        assert returned is None  # its report reached the parent: the result is not returned again
        [r] = await results_of(client, wid)
        assert r.trajectory_id == wid and r.turns == 2 and len(r.turn_keys) == 2
        signal = next(
            e.signal_external_workflow_execution_initiated_event_attributes
            for e in history.events
            if e.HasField("signal_external_workflow_execution_initiated_event_attributes")
        )
        assert b'"count":2' in signal.input.payloads[0].data and b"turn-001" not in signal.input.payloads[0].data
        reported += 1
    assert reported >= result.trained
    rows = {row.trajectory_id: row for row in await list_trajectories(client, handle.id)}
    assert sum(row.status == "completed" for row in rows.values()) == reported  # read back from the reports


@pytest.mark.orchestration
async def test_store_gc_removes_the_claims_of_jobs_whose_workflows_are_gone_and_keeps_the_rest(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    client = bare_env.client
    driver = client.data_converter.external_storage.drivers[0]  # the store the workers' claims go to
    assert isinstance(driver, StorePayloadDriver) and isinstance(driver.backend, LocalStore)
    store, root = driver.backend, driver.backend.root
    async with standin_workers(client, StandIns(prefix=queue_prefix, turns=1, score=full_marks)):
        handle = await start(client, job(queue_prefix, steps=1), queue_prefix)
        await asyncio.wait_for(handle.result(), 60)
    # a job the server no longer holds (its histories gone with the retention), with a unit's claim of its own
    gone = StorageDriverWorkflowInfo(namespace="default", id="gone-3f2a-g000001-0", run_id="r", type="Trajectory")
    [claim] = await driver.store(
        StorageDriverStoreContext(target=gone), [ClaimingPayloadConverter().to_payloads(["x"])[0]]
    )
    assert claim.claim_data["key"].startswith("payloads/gone-3f2a/")
    assert set(owners(root)) >= {handle.id, "gone-3f2a"}

    dry = await sweep(client, store, root, dry_run=True)
    assert "gone-3f2a" in dry.removed and handle.id in dry.kept and dry.claims == 1
    assert store.exists(claim.claim_data["key"])  # a dry run removes nothing
    done = await sweep(client, store, root)
    assert "gone-3f2a" in done.removed and handle.id in done.kept
    assert not store.exists(claim.claim_data["key"]) and "gone-3f2a" not in owners(root)
    history = await handle.fetch_history()  # the running job's claims still read back
    start_event = next(
        e.start_child_workflow_execution_initiated_event_attributes
        for e in history.events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    )
    [task] = await client.data_converter.decode([start_event.input.payloads[1]], [TaskSpec])
    assert task.name == job(queue_prefix).tasks[0].name
