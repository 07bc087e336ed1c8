"""OpenTelemetry traces of workflows and activities (`temporal.tracing`): temporalio's `TracingInterceptor`, its
spans exported over OTLP by one tracer provider per process and collector.

The interceptor goes on the client; workers built on that client take it from there, so a job's trace runs
from `rollart train` starting the training workflow, through every child workflow it starts, to each
activity on whichever pool ran it (the span context travels in Temporal headers). Imported only when a job
asks for traces.
"""

from __future__ import annotations

import atexit
import functools
import socket
from urllib.parse import urlparse

from temporalio.client import Interceptor

from rollart.spec.config import TracingConfig

__all__ = ["flush_traces", "tracing_interceptors"]

_PROVIDERS: list = []  # every provider made in this process, flushed at exit


def tracing_interceptors(cfg: TracingConfig | None) -> list[Interceptor]:
    """The client interceptors for `cfg`: none without it, else one TracingInterceptor on `cfg`'s exporter."""
    if cfg is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(_provider(cfg).get_tracer("rollart"))]


@functools.cache
def _provider(cfg: TracingConfig):
    """One provider per config: a batch processor on an OTLP exporter, flushed when the process exits."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": cfg.service_name, "host.name": socket.gethostname()})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(_exporter(cfg), schedule_delay_millis=1000))
    if not _PROVIDERS:
        atexit.register(_shutdown)
    _PROVIDERS.append(provider)
    return provider


def _exporter(cfg: TracingConfig):
    """OTLP over gRPC (`http://HOST:4317`) or HTTP (`http://HOST:4318`, spans to `/v1/traces` unless a path says)."""
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=cfg.endpoint, insecure=cfg.endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    path = urlparse(cfg.endpoint).path
    return HttpExporter(endpoint=cfg.endpoint if path not in ("", "/") else cfg.endpoint.rstrip("/") + "/v1/traces")


def flush_traces(timeout_ms: int = 5000) -> bool:
    """Export every span ended so far (a command that is about to exit, a test); False if some could not be."""
    return all(p.force_flush(timeout_ms) for p in _PROVIDERS)


def _shutdown() -> None:
    for provider in _PROVIDERS:
        provider.shutdown()
