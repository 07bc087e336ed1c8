"""The job's `temporal` section: where the server is, how to reach it securely, how workers poll, tracing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollart.spec.config.base import Section
from rollart.spec.pools import QUEUE_PREFIX_PATTERN

__all__ = ["TemporalConfig", "TemporalLimits", "TemporalTLS", "TracingConfig", "WorkerTuning"]


class WorkerTuning(Section):
    """How each worker process polls Temporal and runs workflow tasks (infra/temporal/worker_tuning.py turns it into
    `Worker` options). The defaults are the fast choice measured by `python -m bench overhead` and the
    profile in docs/benchmarks.md: with the SDK's 5 polls per queue, 64 workflows of an activity per episode
    left each workflow task ~0.5–1.5 s in the server's queue while the control worker sat mostly idle, and
    the strict sandbox costs the control worker twice the CPU per workflow run."""

    workflow_task_pollers: int = Field(32, ge=2, le=500)
    """Concurrent workflow-task polls of the control worker (sticky and non-sticky together; the SDK's is 5)."""
    activity_task_pollers: int = Field(32, ge=1, le=500)
    """Concurrent activity-task polls per queue of an activity worker (the SDK's is 5)."""
    max_cached_workflows: int = Field(2048, ge=1)
    """Workflows the control worker keeps in memory (sticky execution): at least the workflows in flight, or
    each workflow task of an evicted one replays its whole history (a job is refused when its episodes in flight
    could outnumber it). 2,048 holds every child the server lets one workflow have running (2,000) and the
    training workflow; the SDK's default is 1,000."""
    max_concurrent_workflow_tasks: int = Field(200, ge=2)
    pollers: Literal["fixed", "autoscaling"] = "fixed"
    """`fixed`: each queue keeps the poll counts above; `autoscaling`: the SDK scales each queue's polls between 1
    and those counts by the server's feedback (`PollerBehaviorAutoscaling`), so a large fleet's idle workers hold
    few long polls on the server."""
    sandbox: Literal["strict", "off"] = "off"
    """`strict`: the SDK's sandbox, which re-imports each workflow's module for every run and checks calls made
    from it; `off`: workflows run unsandboxed (half the control worker's CPU per workflow run). rollart's
    workflow logic lives in passed-through modules (workflows/driver) that the sandbox never checked;
    determinism is guarded by the replay tests (tests/test_replay.py, under both) and the import contracts."""


class TracingConfig(Section):
    """OpenTelemetry traces of workflows and activities (`temporal.tracing`), through temporalio's contrib
    `TracingInterceptor`: every process that connects exports spans over OTLP to `endpoint` (a collector, Jaeger,
    Tempo, ...), tagged with its `service_name` and host."""

    endpoint: str = Field(
        ...,
        pattern=r"^https?://[^\s/]+(/.*)?$",
        description="the collector's OTLP address: http://HOST:4317 (gRPC) or http://HOST:4318 (HTTP)",
    )
    protocol: Literal["grpc", "http"] = "grpc"
    service_name: str = Field("rollart", min_length=1, max_length=128)


class TemporalTLS(Section):
    """TLS to the Temporal server (`temporal.tls`): the CA that vouches for the server, and this client's certificate
    for a server that asks for one (mTLS).

    `tls: {}` (or `tls: true`) is TLS with this machine's trusted roots and no client certificate. The files are
    read when a process connects (relative paths from its working directory), not when the spec is loaded: a job
    rendered for Kubernetes names the paths inside the pods (`rollart k8s render` rewrites them).
    """

    ca: Path | None = Field(
        None,
        description="PEM file of the CA that signed the server's certificate (default: this machine's trusted roots)",
    )
    cert: Path | None = Field(None, description="PEM file of this client's certificate (mTLS), with `key`")
    key: Path | None = Field(None, description="PEM file of the private key of `cert`")
    server_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="the name the server's certificate must carry, also sent as SNI (default: the host of "
        "temporal.address)",
    )

    @model_validator(mode="after")
    def _cert_with_key(self) -> TemporalTLS:
        if (self.cert is None) != (self.key is None):
            given, missing = ("cert", "key") if self.cert is not None else ("key", "cert")
            raise ValueError(
                f"tls.{given} is set but tls.{missing} is not: a client certificate goes with its private "
                "key; set both (mTLS), or neither"
            )
        return self

    def files(self) -> dict[str, Path]:
        """The files it names, by field (`ca`, `cert`, `key`)."""
        return {
            name: path for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)) if path is not None
        }


class TemporalLimits(Section):
    """The server's per-workflow limits the training workflow keeps under (`temporal.limits`): Temporal's defaults,
    to be lowered for a namespace or cluster configured lower (Temporal Cloud, a tuned server). Past them the
    server terminates the workflow (history) or refuses what is sent to it (signals), so a run of the training
    workflow continues as new once it reaches `continue_at` of any of them, or when the server suggests it."""

    history_events: int = Field(51_200, ge=100, description="`limit.historyCount.error`: events in one run")
    history_bytes: int = Field(
        50 * 1024 * 1024, ge=100_000, description="`limit.historySize.error`: bytes of one run's history"
    )
    signals: int = Field(10_000, ge=10, description="`history.maximumSignalsPerExecution`: signals one run takes")
    updates: int = Field(
        2_000,
        ge=10,
        description="`history.maxTotalUpdates`: updates one workflow execution takes; each model call of an agent "
        "is one (its retries are the same one), so an agent task's turns per workflow must fit",
    )
    continue_at: float = Field(
        0.08,
        gt=0.0,
        le=0.9,
        description="the share of any limit at which a run of the training workflow continues as new (at most "
        "once a second, between steps or while it waits). Reports that arrive while a run continues land in it, "
        "so runs end a little past this share: 8 % keeps them under 10 % (`python -m bench temporal`)",
    )


class TemporalConfig(Section):
    """Where the Temporal server is, and how to reach it securely. `address: null` means: start the local dev server.

    `tls` and `api_key_env` are for a server named in `address` (the local dev server has no TLS); the API key
    itself never goes in the spec, only the name of the environment variable that holds it.
    """

    address: str | None = None
    tls: TemporalTLS | None = Field(None, description="TLS to the server (see TemporalTLS); null: plain gRPC")
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=128,
        description="the environment variable holding an API key for the server, sent as `authorization: Bearer "
        "KEY` on every call; it turns TLS on (this machine's trusted roots unless `tls` says otherwise)",
    )
    api_key_file: Path | None = Field(
        None,
        description="a file holding the API key instead (read when a process connects; on Kubernetes the pods "
        "mount it from the Temporal Secret): a key in a file is not in every child process's environment",
    )
    namespace: str = "default"
    ui_port: int = Field(8233, ge=1, le=65535)
    task_queue_prefix: str = Field(
        "",
        pattern=QUEUE_PREFIX_PATTERN,
        max_length=64,
        description="prepended to every task queue the job's workflows and workers use (`team-a-` → `team-a-cpu`): "
        "jobs sharing one server with their own workers keep them apart",
    )
    worker_heartbeat_s: float = Field(
        5.0,
        ge=1.0,
        le=60.0,
        description="how often each worker tells the server it is alive (Temporal's worker heartbeats): the stall "
        "checks tell a dead pool from a busy one by them, within a few of these",
    )
    max_pending_children: int = Field(
        2000,
        ge=1,
        description="child workflows one workflow may have running on this server (its "
        "`limit.numPendingChildExecutions.error`; 2,000 is Temporal's default, and the local dev server is started "
        "with this value). With trajectory rollout every episode is a child of the training workflow, so a job "
        "whose (async_bound + 1) x batch_size exceeds it is refused when it is loaded: past the limit the server "
        "refuses every start and the job would hang",
    )
    limits: TemporalLimits = Field(default_factory=TemporalLimits)
    workers: WorkerTuning = Field(default_factory=WorkerTuning)
    tracing: TracingConfig | None = Field(
        None, description="OpenTelemetry traces of workflows and activities (see TracingConfig); null: none"
    )

    @field_validator("tls", mode="before")
    @classmethod
    def _tls_switch(cls, value: Any) -> Any:
        """`tls: true` is TLS with the trusted roots (`tls: {}`); `tls: false` is none."""
        if value is True:
            return {}
        return None if value is False else value

    @model_validator(mode="after")
    def _one_api_key(self) -> TemporalConfig:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give api_key_env or api_key_file, not both: each names where the one API key is")
        return self

    @property
    def secured(self) -> bool:
        """Whether connections to the server use TLS (set explicitly, or turned on by an API key)."""
        return self.tls is not None or self.api_key_env is not None or self.api_key_file is not None

    @property
    def has_api_key(self) -> bool:
        """Whether an API key is sent (from `api_key_env`'s variable or `api_key_file`)."""
        return self.api_key_env is not None or self.api_key_file is not None

    def without_security(self) -> TemporalConfig:
        """These settings without TLS and API key: for the local dev server, which has neither."""
        return self.model_copy(update={"tls": None, "api_key_env": None, "api_key_file": None})
