"""`rollart k8s render|apply`: a job's Kubernetes manifests (a Deployment per pool, a StatefulSet of trainer nodes)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli import plan
from rollart.cli.errors import UserError
from rollart.cli.spec import load_spec

if TYPE_CHECKING:
    from rollart.infra.deploy.names import Manifest
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "apply", "render"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `k8s` with its sub-commands, `render`, `apply` and `plan`."""
    k8s = sub.add_parser(
        "k8s",
        help="render or apply Kubernetes manifests for a job (a Deployment per pool, a StatefulSet of trainer nodes)",
    )
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True, metavar="K8S_COMMAND")
    s = k8s_sub.add_parser("render", help="write the job's manifests to a directory, one YAML file per object")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON); its `kubernetes` section is optional")
    s.add_argument("-o", "--out", type=Path, required=True, help="directory to write the manifests to")
    _add_k8s_args(s)
    s.set_defaults(func=render)
    s = k8s_sub.add_parser("apply", help="server-side dry-run every object, then apply them (current kubeconfig)")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON); its `kubernetes` section is optional")
    s.add_argument("--dry-run", action="store_true", help="only the server-side dry-run; change nothing")
    s.add_argument("--context", help="kubeconfig context (default: the current one)")
    _add_k8s_args(s)
    s.set_defaults(func=apply)
    s = k8s_sub.add_parser(
        "plan", help="suggest each generation pool's replicas (and each task's pool) from a run's token profile"
    )
    plan.add_args(s)
    s.set_defaults(func=plan.run_k8s)


def _add_k8s_args(s: argparse.ArgumentParser) -> None:
    # each overrides a field of the job's `kubernetes` section (cli/spec.py's FLAGS)
    s.add_argument("--image", help="the CPU image, for pools without GPUs (overrides kubernetes.image)")
    s.add_argument(
        "--gpu-image",
        help="the GPU image, for generation pools and trainer ranks on GPUs (overrides kubernetes.gpu_image)",
    )
    s.add_argument(
        "--temporal-address",
        metavar="HOST:PORT",
        dest="k8s_temporal_address",
        help="Temporal frontend as the pods see it (overrides kubernetes.temporal_address)",
    )
    s.add_argument("--hpa", action="store_true", help="scale serverless with a CPU HPA instead of KEDA")


def render(args: argparse.Namespace) -> int:
    """Write one YAML file per object, for review before `kubectl apply`; say how to create the Secrets."""
    from rollart.infra.deploy.render import write_manifests

    job, manifests = _manifests(args)
    paths = write_manifests(manifests, args.out)
    for path in paths:
        print(f"wrote {path}")
    _say_secret(job, f"kubectl apply -f {paths[0]}")
    print(f"inspect them, then `kubectl apply -f {args.out}` or `rollart k8s apply {args.job}`")
    return 0


def apply(args: argparse.Namespace) -> int:
    """Server-side dry-run every object, then apply them (unless --dry-run)."""
    from rollart.infra.deploy.apply import ApplyError, apply_manifests, connect

    job, manifests = _manifests(args)
    _say_secret(job, "`rollart k8s apply` creates it first")
    try:
        report = apply_manifests(connect(args.context), manifests, dry_run_only=args.dry_run)
    except ApplyError as e:
        raise UserError(str(e)) from e
    for line in report.lines:
        print(line)
    print("applied." if report.applied else "dry run only: nothing was changed.")
    return 0


def _say_secret(job: JobSpec, namespace_first: str) -> None:
    """How to make the Secrets rollart does not write: the job's Temporal TLS files and API key, and the token of its
    env servers."""
    from rollart.infra.deploy.security import (
        env_token_command,
        env_token_secret_name,
        secret_command,
        temporal_secret_name,
    )

    command = secret_command(job)
    if command is not None:
        print(
            f"the pods read the job's Temporal credentials (temporal.tls files, the API key) as files from Secret "
            f"{temporal_secret_name(job)!r}, which is not rendered (it holds secrets): create it, once its namespace "
            f"exists ({namespace_first}), from the files and variable on this machine with\n  {command}\n"
            "(pods wait for it)"
        )
    command = env_token_command(job)
    if command is not None:
        print(
            f"the env servers serve only the job's workers, which present the token of Secret "
            f"{env_token_secret_name(job)!r}, which is not rendered (it holds a secret): create it, once its "
            f"namespace exists ({namespace_first}), with a random token:\n  {command}\n"
            "(the env servers and the pools that call them wait for it)"
        )


def _manifests(args: argparse.Namespace) -> tuple[JobSpec, list[Manifest]]:
    from rollart.infra.deploy.names import K8sRenderError
    from rollart.infra.deploy.render import render

    job = load_spec(args.job, args)
    try:
        return job, render(job)
    except (K8sRenderError, ValueError) as e:
        raise UserError(f"{args.job}: {e}") from e
