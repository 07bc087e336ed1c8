"""`rollart env-server`: serve a rollart env as an OpenEnv environment server (one session per WebSocket)."""

from __future__ import annotations

import argparse
import json

from rollart.cli.errors import UserError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `env-server` and its flags."""
    s = sub.add_parser(
        "env-server",
        help="serve a rollart env (e.g. frozenlake) as an OpenEnv server; jobs reach it with `env: openenv`",
    )
    s.add_argument(
        "--env",
        default="frozenlake",
        help="the env to serve: a registered name or mypkg.envs:MyEnv (default frozenlake)",
    )
    s.add_argument(
        "--env-args",
        default="{}",
        metavar="JSON",
        help='the env\'s arguments, as a JSON object (default {}; e.g. \'{"maps": "standard"}\')',
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    s.add_argument("--port", type=int, default=8300, help="port to listen on (default 8300)")
    s.add_argument(
        "--max-sessions", type=int, default=256, help="concurrent sessions (WebSockets) at most (default 256)"
    )
    s.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # the local stack's: stop when it dies
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/Ctrl-C; bad arguments or an unknown env fail before the server listens."""
    from rollart.spec.registry import UnknownComponentError

    try:
        env_args = json.loads(args.env_args)
    except json.JSONDecodeError as e:
        raise UserError(f"--env-args: not JSON ({e}): {args.env_args!r}") from e
    if not isinstance(env_args, dict):
        raise UserError(f"--env-args must be a JSON object, got {args.env_args!r}")
    if not 0 < args.port < 65536 or args.max_sessions < 1:
        raise UserError(f"--port must be 1..65535 and --max-sessions at least 1 (got {args.port}, {args.max_sessions})")
    from rollart.infra.env_server_token import EnvTokenError
    from rollart.workers.env_server import serve

    print(
        f"serving env {args.env!r} as an OpenEnv server on http://{args.host}:{args.port} (WebSocket /ws)", flush=True
    )
    try:
        serve(args.env, env_args, args.host, args.port, args.max_sessions, parent_pid=args.parent_pid)
    except (UnknownComponentError, EnvTokenError) as e:
        raise UserError(str(e)) from e
    except (TypeError, ValueError) as e:
        raise UserError(f"env {args.env!r} rejected --env-args {env_args!r}: {e}") from e
    return 0
