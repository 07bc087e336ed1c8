"""Job specs from the command line: the job file (or the default job) with the flags the user gave laid over it.

Every flag that overrides a spec field is in `FLAGS`, keyed by its argparse dest; `spec_overrides` turns
the parsed flags into one nested overrides dict and `override` applies it to a job spec (or to a
worker's settings, which share the field names), validating again so a bad value names its flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rollart.cli.errors import UserError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from rollart.spec.config import JobSpec

Model = TypeVar("Model", bound="BaseModel")  # a job spec, or a worker's settings

__all__ = [
    "FLAGS",
    "Flag",
    "add_temporal_args",
    "add_temporal_security_args",
    "check_components",
    "default_job",
    "load_spec",
    "override",
    "read_spec",
    "spec_overrides",
]


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets a spec field; `field` is dotted, `{pool}` stands for the --pool given."""

    option: str
    field: str
    implies: tuple[tuple[str, object], ...] = ()
    value: Callable[[Any], object] | None = None  # what the spec gets (default: the flag's value)
    expected: str | None = None  # the form a value must have, said instead of the field's validation message


FLAGS: dict[str, Flag] = {
    "temporal_address": Flag("--temporal-address", "temporal.address"),
    "namespace": Flag("--namespace", "temporal.namespace"),
    "task_queue_prefix": Flag("--task-queue-prefix", "temporal.task_queue_prefix"),
    "temporal_tls": Flag("--temporal-tls", "temporal.tls", value=lambda _: {}),  # before the tls.* fields it holds
    "temporal_tls_ca": Flag("--temporal-tls-ca", "temporal.tls.ca"),
    "temporal_tls_cert": Flag("--temporal-tls-cert", "temporal.tls.cert"),
    "temporal_tls_key": Flag("--temporal-tls-key", "temporal.tls.key"),
    "temporal_tls_server_name": Flag("--temporal-tls-server-name", "temporal.tls.server_name"),
    "temporal_api_key_env": Flag(
        "--temporal-api-key-env",
        "temporal.api_key_env",
        expected="the NAME of an environment variable holding the key (letters, digits, _), not the key itself",
    ),
    "model_dir": Flag("--model-dir", "model_dir"),
    "engine": Flag("--engine", "engine.kind"),
    "store_path": Flag("--store-path", "store.path"),
    "store_master": Flag(
        "--store-master", "store.mooncake.master", implies=(("store.kind", "mooncake"),), expected="HOST:PORT"
    ),
    "steps": Flag("--steps", "training.steps"),
    "async_bound": Flag("--async-bound", "training.async_bound"),
    "rollout_mode": Flag("--rollout-mode", "training.rollout_mode"),
    "min_workers": Flag("--min", "pools.{pool}.min_workers"),
    "max_workers": Flag("--max", "pools.{pool}.max_workers"),
    "max_concurrent_activities": Flag("--concurrency", "pools.{pool}.max_concurrent_activities"),
    "backlog_per_worker": Flag("--backlog-per-worker", "pools.{pool}.backlog_per_worker"),
    "scale_up_cooldown_s": Flag("--scale-up-cooldown", "pools.{pool}.scale_up_cooldown_s"),
    "scale_down_cooldown_s": Flag("--scale-down-cooldown", "pools.{pool}.scale_down_cooldown_s"),
    "poll_interval_s": Flag("--poll-interval", "pools.{pool}.poll_interval_s"),
    "image": Flag("--image", "kubernetes.image"),
    "gpu_image": Flag("--gpu-image", "kubernetes.gpu_image"),
    "k8s_temporal_address": Flag("--temporal-address", "kubernetes.temporal_address"),
    "hpa": Flag("--hpa", "kubernetes.serverless.keda", value=lambda _: False),
}


def add_temporal_args(s: argparse.ArgumentParser) -> None:
    """--temporal-address, --namespace and the TLS flags, for commands that reach a server named by the job or the
    flags."""
    s.add_argument("--temporal-address", metavar="HOST:PORT", help="an existing Temporal server (default: local)")
    s.add_argument("--namespace", help="Temporal namespace (default: the job's, else 'default')")
    s.add_argument(
        "--task-queue-prefix",
        metavar="PREFIX",
        help="prepended to every task queue (default: the job's temporal.task_queue_prefix, else none)",
    )
    add_temporal_security_args(s)


def add_temporal_security_args(s: argparse.ArgumentParser) -> None:
    """TLS and API-key flags (`temporal.tls`, `temporal.api_key_env`), for every command that connects to Temporal."""
    g = s.add_argument_group(
        "secured Temporal", "TLS and an API key, over the job's temporal.tls / temporal.api_key_env"
    )
    g.add_argument(
        "--temporal-tls",
        action="store_true",
        help="TLS with this machine's trusted roots (implied by any --temporal-tls-* flag)",
    )
    g.add_argument(
        "--temporal-tls-ca",
        type=Path,
        metavar="PEM",
        help="CA certificate the server's certificate is checked against (turns TLS on)",
    )
    g.add_argument("--temporal-tls-cert", type=Path, metavar="PEM", help="client certificate, for mTLS (with the key)")
    g.add_argument("--temporal-tls-key", type=Path, metavar="PEM", help="the client certificate's private key")
    g.add_argument(
        "--temporal-tls-server-name",
        metavar="NAME",
        help="name the server's certificate must carry, also sent as SNI (default: the address's host)",
    )
    g.add_argument(
        "--temporal-api-key-env",
        metavar="NAME",
        help="environment variable holding an API key for the server (turns TLS on)",
    )


def spec_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags the user gave, as one nested dict over the spec's fields (flags left at None/False are not given)."""
    overrides: dict[str, Any] = {}
    for flag, value in _given(args):
        fields = [(flag.field, flag.value(value) if flag.value else value), *flag.implies]
        for field, v in fields:
            *parents, leaf = field.format_map(vars(args)).split(".")
            node = overrides
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = v
    return overrides


def override(model: Model, args: argparse.Namespace, source: str | None) -> Model:
    """`model` (a job spec, or worker settings) with the flags in `args` laid over it, nested fields merged.

    Merged field by field rather than through `load_job`'s top-level merge, so that `--store-master` keeps
    the file's other `store.mooncake` settings; a value that does not validate names the flag and field.
    """
    if not _given(args):
        return model
    from pydantic import ValidationError

    try:
        return type(model).model_validate(_merge(model.model_dump(), spec_overrides(args)))
    except ValidationError as e:
        raise UserError(_describe(e, args, source)) from e


def load_spec(path: Path | None, args: argparse.Namespace) -> JobSpec:
    """The job at `path` (the default job when None) with the command's flags laid over it, then resolved (a
    flag may change a pool that the placement rules check: `--max 0`)."""
    from pydantic import ValidationError

    from rollart.spec.config import resolve

    source = str(path) if path else None
    job = _with_temporal_environment(override(read_spec(path) if path else default_job(), args, source))
    try:
        return resolve(job)
    except ValidationError as e:
        raise UserError(_describe(e, args, source)) from e


def _with_temporal_environment(job: JobSpec) -> JobSpec:
    """The job's `temporal` section completed from Temporal's own configuration (`TEMPORAL_ADDRESS`, the config
    file's profile, ...) where the file and the flags leave it open: infra/temporal/connection.py's order."""
    from rollart.infra.temporal.connection import TemporalAddressError, with_environment

    try:
        temporal = with_environment(job.temporal)
    except TemporalAddressError as e:
        raise UserError(str(e)) from e
    return job if temporal is job.temporal else job.model_copy(update={"temporal": temporal})


def read_spec(path: Path) -> JobSpec:
    """The job spec at `path` as written; an unreadable or invalid file is a UserError naming file and field."""
    from rollart.spec.config import JobSpecError, load_job

    try:
        return load_job(path)
    except JobSpecError as e:
        raise UserError(str(e)) from e


def default_job() -> JobSpec:
    """The job `rollart up` serves without --job: FrozenLake with the embedded tiny model."""
    from rollart.spec.config import JobSpec, TaskSpec

    return JobSpec(tasks=[TaskSpec(name="frozenlake", env="frozenlake", reward="success")])


def check_components(job: JobSpec, path: Path) -> None:
    """The job's envs and rewards resolve and build, before any workflow or worker starts."""
    from rollart.spec.checks import JobCheckError, check_job_components

    try:
        check_job_components(job)
    except JobCheckError as e:
        raise UserError(f"{path}: {e}") from e


def _given(args: argparse.Namespace) -> list[tuple[Flag, object]]:
    return [
        (flag, v) for dest, flag in FLAGS.items() if (v := getattr(args, dest, None)) is not None and v is not False
    ]


def _describe(err: ValidationError, args: argparse.Namespace, source: str | None) -> str:
    from rollart.spec.config import format_validation_error

    given = _given(args)
    by_field = {flag.field.format_map(vars(args)): (flag, value) for flag, value in given}
    for e in err.errors():
        flag, value = by_field.get(".".join(str(p) for p in e["loc"]), (None, None))
        if flag is not None and flag.expected:
            return f"{flag.option}: expected {flag.expected}, got {value!r}"
    flags = " ".join(f.option if v is True else f"{f.option} {v}" for f, v in given)
    message = format_validation_error(err, f"{source} with {flags}" if source else flags)
    return message if source else message.replace("invalid job spec", "invalid")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merge(merged[key], value) if nested else value
    return merged
