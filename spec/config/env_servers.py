"""The job's `env_servers` section: OpenEnv servers run beside the workers, and the tasks that name them."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationError

from rollart.spec.config.base import Section

__all__ = ["OPENENV", "EnvServerSpec", "fill_env_server_urls"]


OPENENV = "openenv"
"""The env that reaches an OpenEnv server; a task of it may name one of the job's `env_servers` (`env_args.server`)."""


class EnvServerSpec(Section):
    """An env server the job runs beside its workers: a rollart env served as an OpenEnv server (`rollart env-server`).

    The local stack starts one process per entry on `port` (loopback) and restarts it when it dies; `rollart k8s
    render` makes each a Deployment and a Service. A task reaches it with `env: openenv` and `env_args: {server:
    NAME}`, which fills the task's `base_url` with this server's `url` (default `http://127.0.0.1:PORT`, the local
    stack's; in the pods, the Service's address).
    """

    name: str = Field(
        min_length=1,
        max_length=30,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="lower-case letters, digits and '-': it names the Kubernetes Deployment and Service",
    )
    env: str = Field(
        "frozenlake", min_length=1, description="the rollart env it serves (a registered name or import path)"
    )
    env_args: dict[str, Any] = Field(default_factory=dict)
    port: int = Field(ge=1, le=65535, description="where it listens (and its Service's port on Kubernetes)")
    max_sessions: int = Field(256, ge=1, description="concurrent sessions at most: one per episode in flight")
    url: str | None = Field(
        None,
        pattern=r"^(http|https|ws|wss)://[^/\s]+$",
        description="how the workers reach it (default http://127.0.0.1:PORT, the local stack's)",
    )

    @property
    def local_url(self) -> str:
        """Where the local stack's process listens."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL the job's `openenv` tasks are given."""
        return self.url or self.local_url

    def command(self, host: str) -> list[str]:
        """The `rollart env-server` command line serving it on `host` (the local stack's process, a pod's container)."""
        return [
            "rollart",
            "env-server",
            "--env",
            self.env,
            "--env-args",
            json.dumps(self.env_args, sort_keys=True),
            "--host",
            host,
            "--port",
            str(self.port),
            "--max-sessions",
            str(self.max_sessions),
        ]


def fill_env_server_urls(data: Any) -> Any:
    """Before validation, fill `base_url` of every `openenv` task naming one of `env_servers` (`env_args.server`)."""
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        return data
    servers: dict[str, str] = {}
    for i, server in enumerate(data.get("env_servers") or []):
        try:
            spec = EnvServerSpec.model_validate(server)
        except ValidationError:  # reported, naming its fields, when the field itself is validated
            continue
        if spec.name in servers:
            raise ValueError(f"env_servers.{i}: name {spec.name!r} is used twice; each env server needs its own name")
        servers[spec.name] = spec.base_url
    tasks = []
    for i, task in enumerate(data["tasks"]):
        args = task.get("env_args") if isinstance(task, dict) else None
        if not isinstance(args, dict) or task.get("env") != OPENENV or "server" not in args:
            tasks.append(task)
            continue
        name = args["server"]
        if name not in servers and any(
            isinstance(v, dict) and v.get("name") == name for v in data.get("env_servers") or []
        ):
            tasks.append(task)  # that server's own fields do not validate: its errors say why
            continue
        if name not in servers:
            known = ", ".join(sorted(servers)) or "none: add an env_servers section"
            raise ValueError(f"tasks.{i}.env_args.server: no env server {name!r} in env_servers (defined: {known})")
        if args.get("base_url") not in (None, servers[name]):
            raise ValueError(
                f"tasks.{i}.env_args: give base_url or server, not both (server {name!r} is at "
                f"{servers[name]}, base_url says {args['base_url']!r})"
            )
        tasks.append({**task, "env_args": {**args, "base_url": servers[name]}})
    return {**data, "tasks": tasks}
