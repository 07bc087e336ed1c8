"""Any rollart env served as an OpenEnv environment (openenv-core's `Environment`, over its WebSocket protocol).

`openenv_app("frozenlake", {"maps": "standard"})` is a FastAPI app (openenv-core's `create_fastapi_app`)
whose every WebSocket session (`/ws`) holds its own instance of the rollart env: the game logic is the
env's own (`FrozenLake`), nothing is duplicated. The wire types:

- action ``{"message": "<the model's raw text>"}`` (`TextAction`), passed to the env's `step` as is;
- observation ``{"text": "<the next prompt>", "info": {...}}`` (`TextObservation`) with openenv's own
  ``reward`` and ``done``: what `StepOutcome` holds, field for field.

The client side, `activities/envs/openenv_client.py` (env `openenv`), maps these back by default. `rollart
env-server` (workers/env_server.py) runs the app with uvicorn. Besides openenv's routes (`/ws`, `/health`,
`/schema`, ...), `GET /stats` says how many sessions are open and how many steps were served.

With a `token` (rollart's env servers get the job's: `infra.env_server_token`), every route but `/health` wants
it as `Authorization: Bearer TOKEN`: a server reachable from elsewhere serves only the job. Not in the query
string: a URL is what access logs and proxies record.
"""

from __future__ import annotations

import functools
import hmac
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from openenv.core.env_server import (
    Action,
    Environment,
    Observation,
    State,
    create_fastapi_app,
)
from pydantic import Field

from rollart.spec.registry import lookup_env

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["RollartEnvironment", "ServerStats", "TextAction", "TextObservation", "openenv_app"]


class TextAction(Action):
    """The model's raw generated text: the env's own rule decides what it means."""

    message: str = Field(description="the model's raw generated text")


class TextObservation(Observation):
    """The whole next prompt, and the env's JSON-safe info (reward and done are openenv's own fields)."""

    text: str = Field(description="the whole prompt of the next turn")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info: str/number/bool/None, lists, dicts")


@dataclass
class ServerStats:
    """What one server has done: sessions open now, episodes reset and steps served since it started."""

    sessions: int = 0
    resets: int = 0
    steps: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:  # sessions run on threads of their own
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {"sessions": self.sessions, "resets": self.resets, "steps": self.steps}


class RollartEnvironment(Environment[TextAction, TextObservation, State]):
    """One session's rollart env (built from the server's `env_args`), behind openenv's reset/step/state.

    Sessions share nothing (each builds its own env), so the server may run many at once.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_cls: type, env_args: dict[str, Any], stats: ServerStats | None = None) -> None:
        super().__init__()
        self._env = env_cls(**env_args)
        self._state = State()
        self._stats = stats or ServerStats()
        self._stats.add(sessions=1)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        if seed is None:
            raise ValueError("reset needs a seed: rollart envs are deterministic in (seed, actions)")
        if kwargs:
            raise ValueError(f"unknown reset arguments {sorted(kwargs)}; this server takes seed and episode_id")
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        text = self._env.reset(seed)
        self._stats.add(resets=1)
        return TextObservation(text=text, reward=None, done=False)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        outcome = self._env.step(action.message)
        self._state.step_count += 1
        self._stats.add(steps=1)
        return TextObservation(text=outcome.observation, info=outcome.info, reward=outcome.reward, done=outcome.done)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._stats.add(sessions=-1)
        self._env.close()


def openenv_app(
    env: str, env_args: dict[str, Any] | None = None, max_sessions: int = 256, token: str | None = None
) -> FastAPI:
    """The OpenEnv app serving rollart env `env` (a registered name or import path), at most `max_sessions` at once;
    with `token`, only to clients that present it (`_TokenGate`).

    The env is built once here, so bad `env_args` fail at start-up rather than in the first session.
    """
    entry = lookup_env(env)
    env_args = dict(env_args or {})
    entry.cls(**env_args).close()
    stats = ServerStats()
    factory = functools.partial(RollartEnvironment, entry.cls, env_args, stats)
    app = create_fastapi_app(factory, TextAction, TextObservation, max_concurrent_envs=max_sessions)
    app.add_middleware(_QuietDisconnects)
    if token:
        app.add_middleware(_TokenGate, token=token)
    app.add_api_route(
        "/stats",
        stats.as_dict,
        methods=["GET"],
        tags=["Environment Info"],
        summary="sessions open now, episodes reset and steps served since the server started",
    )
    return app


class _QuietDisconnects:
    """Pure ASGI middleware: a session whose client left first is over, not an error.

    openenv-core 0.3.0 closes a session's WebSocket after the client's `close` message, when the client may
    already have closed it; starlette then raises `WebSocketDisconnect`, which uvicorn logs as a traceback.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise


class _TokenGate:
    """Pure ASGI middleware: a request or WebSocket without the server's token is refused before it reaches the env.

    `/health` stays open (probes and `wait_healthy` carry no token; it says nothing about the env). The token is
    compared in constant time and never logged.
    """

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket") or scope.get("path") == "/health" or self._admits(scope):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":  # refused before the handshake: the client sees HTTP 403
            await send({"type": "websocket.close", "code": 1008, "reason": "env server token required"})
            return
        body = b'{"detail":"env server token required (Authorization: Bearer TOKEN)"}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _admits(self, scope: Any) -> bool:
        """Whether an ``Authorization: Bearer`` header carries the token (the only place it is taken from)."""
        shown = [
            value[7:].strip()
            for name, value in scope.get("headers") or ()
            if name == b"authorization" and value[:7].lower() == b"bearer "
        ]
        return any(hmac.compare_digest(t, self._token) for t in shown)
