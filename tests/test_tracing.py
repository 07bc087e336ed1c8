"""OpenTelemetry traces (`temporal.tracing`): a training job's spans reach an OTLP collector as one trace, from the
client's start through child workflows to each activity on its pool's worker."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from pydantic import ValidationError
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.training import TrainingInput, TrainingResult
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.infra.temporal.tracing import flush_traces
from rollart.spec.config import StoreConfig, TemporalConfig, TracingConfig
from rollart.spec.pools import Pool, queue_name
from tests.support.standins import standin_workers
from tests.support.tasks import with_queue_prefix
from tests.test_training_workflow import job, world


class _Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps (name, trace id, span id, parent id, service) of every span posted."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.spans: list[tuple[str, bytes, bytes, bytes, str]] = []


class _Receive(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
            for ss in rs.scope_spans:
                self.server.spans += [(s.name, s.trace_id, s.span_id, s.parent_span_id, service) for s in ss.spans]  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_the_endpoint_must_be_a_url_and_the_protocol_known() -> None:
    with pytest.raises(ValidationError, match="endpoint"):
        TracingConfig(endpoint="127.0.0.1:4317")
    with pytest.raises(ValidationError, match="protocol"):
        TracingConfig(endpoint="http://127.0.0.1:4317", protocol="thrift")  # type: ignore[arg-type]


@pytest.mark.orchestration
async def test_a_training_job_is_one_trace_from_start_to_every_activity(
    bare_env: WorkflowEnvironment, collector: _Collector, queue_prefix: str, tmp_path: Path
) -> None:
    address = bare_env.client.service_client.config.target_host
    tracing = TracingConfig(endpoint=f"http://127.0.0.1:{collector.server_port}", protocol="http", service_name="rt")
    client = await connect(TemporalConfig(address=address, tracing=tracing), StoreConfig(path=tmp_path / "store"))
    await ensure_registered(client)
    w = world(queue_prefix)
    spec = with_queue_prefix(job(steps=2), queue_prefix)
    job_id = f"traced-{uuid.uuid4().hex[:8]}"
    async with standin_workers(client, w):
        handle = await client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrainingResult,
        )
        result = await asyncio.wait_for(handle.result(), 120)
    assert result.version == 2
    assert await asyncio.to_thread(flush_traces)
    names = [s[0] for s in collector.spans]
    for name in (
        "StartWorkflow:TrainingWorkflow",
        "RunWorkflow:TrainingWorkflow",
        "StartChildWorkflow:TrajectoryWorkflow",
        "RunWorkflow:TrajectoryWorkflow",
        "RunActivity:reset",
        "RunActivity:generate",
        "RunActivity:step",
        "RunActivity:train_step",
    ):
        assert name in names, (name, sorted(set(names)))
    [start] = [s for s in collector.spans if s[0] == "StartWorkflow:TrainingWorkflow"]
    ours = [s for s in collector.spans if s[1] == start[1]]
    assert {s[0] for s in ours} >= {"RunActivity:train_step", "RunActivity:generate"}  # one trace, start to activities
    assert names.count("RunActivity:train_step") >= 2 and {s[4] for s in ours} == {"rt"}
    ids = {s[2] for s in ours}
    assert all(s[3] in ids for s in ours if s is not start)  # every span's parent is in the trace: no orphans
