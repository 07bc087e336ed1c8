"""Env `openenv`: any OpenEnv environment server (openenv-core) as a rollart env; the session lives on the server.

Each env is one OpenEnv WebSocket session (openenv-core's `GenericEnvClient`, driven synchronously): the
server keeps one environment instance per connection, so every env of a cpu worker (every trajectory,
every member of a group) has its own. `reset(seed)` opens a fresh session and resets it with
``{"seed": seed, **reset_args}``; `step(text)` sends the action ``{action_field: text}``.

The mapping back (env_args):

- the observation text: the observation's ``observation_field`` (default ``text``, what rollart's own server
  sends); when that field is not there and ``observation_field`` was not given, the whole observation as
  compact JSON (sorted keys), so any server works unchanged;
- ``reward`` and ``done``: the server's own (a missing reward is 0.0);
- ``info``: the observation's ``info_field`` (default ``info``) when it is a dict, else the observation's other
  fields.

Failures: a server that does not answer at reset is waited for (``connect_wait_s``, default 30 s: a server
restarting); then the reset raises and is retried as any reset is. A session that breaks mid-episode (the
server died, restarted, or stopped answering for ``timeout_s``) raises `EnvSessionLost` from `step`: the
workflow restores the episode on a fresh session (same seed, actions replayed) and plays the step there;
nothing is ever sent again on a broken session, and a new connection is never taken for the old one. An
error the server reports for a step (its env raised) is an ordinary error: the env is broken.

Auth: a task of one of the job's own env servers (``server`` set) presents the job's token (`infra.env_server_token`:
the file ``$ROLLART_ENV_SERVER_TOKEN_FILE`` names, a mounted Secret on Kubernetes, read at each connection; else
``$ROLLART_ENV_SERVER_TOKEN``, minted by the local stack) as an ``Authorization: Bearer`` header of the WebSocket
handshake (`openenv_session`), never in the URL, which access logs record. rollart's server checks it; a server of
someone else's (no ``server``) is never shown it. Error texts never carry it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from rollart.infra.env_server_token import TOKEN_ENV, TOKEN_FILE_ENV, job_token
from rollart.spec.env import Env, EnvSessionLost, StepOutcome
from rollart.spec.registry import env

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "OpenEnv"]

log = logging.getLogger(__name__)

_SCHEMES = ("http://", "https://", "ws://", "wss://")
_CONNECT_BACKOFF_S = (0.1, 2.0)  # first and longest pause between connection attempts while a server is down


@env("openenv", reset_timeout=90, step_timeout=60)
class OpenEnv(Env):
    """A session on an OpenEnv server.

    env_args: ``base_url`` (required: ``http://host:port``; ``ws://`` also works), ``server`` (the name of the
    job's `env_servers` entry this URL was filled from; informational), ``action_field`` (default
    ``message``), ``observation_field`` (default ``text``), ``info_field`` (default ``info``), ``reset_args``
    (extra reset arguments, default none), ``timeout_s`` (per message, default 30), ``connect_wait_s`` (how
    long a reset waits for an unreachable server, default 30).
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        server: str | None = None,
        action_field: str = "message",
        observation_field: str | None = None,
        info_field: str = "info",
        reset_args: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
        connect_wait_s: float = 30.0,
        **unknown: Any,
    ) -> None:
        super().__init__(**unknown)
        if not isinstance(base_url, str) or not base_url.startswith(_SCHEMES):
            hint = f" (env server {server!r} was not resolved to a URL)" if server else ""
            raise ValueError(f"openenv: base_url must be the server's URL, http://HOST:PORT{hint}; got {base_url!r}")
        for name, value in (("action_field", action_field), ("info_field", info_field)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"openenv: {name} must be a non-empty string, got {value!r}")
        if observation_field is not None and (not isinstance(observation_field, str) or not observation_field):
            raise ValueError(f"openenv: observation_field must be a non-empty string, got {observation_field!r}")
        if reset_args is not None and not isinstance(reset_args, dict):
            raise ValueError(f"openenv: reset_args must be a mapping, got {reset_args!r}")
        for name, value in (("timeout_s", timeout_s), ("connect_wait_s", connect_wait_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"openenv: {name} must be a positive number of seconds, got {value!r}")
        self.base_url = base_url.rstrip("/")
        self.server = server
        self.action_field = action_field
        self.observation_field = observation_field
        self.info_field = info_field
        self.reset_args = dict(reset_args or {})
        self.timeout_s = float(timeout_s)
        self.connect_wait_s = float(connect_wait_s)
        self._client: Any = None  # openenv's SyncEnvClient: one WebSocket session
        self._lost: str | None = None  # why the session broke; nothing is sent on it again
        self._sent: str | None = None  # the token last presented: blanked out of error texts

    def reset(self, seed: int) -> str:
        self.close()
        self._client = self._connect()
        self._lost = None
        try:
            result = self._client.reset(seed=seed, **self.reset_args)
        except Exception as e:
            self.close()
            raise ConnectionError(
                f"openenv: reset(seed={seed}) at {self.base_url} failed: {_describe(e, self._sent)}"
            ) from e
        return self._text(result.observation)

    def step(self, action: str) -> StepOutcome:
        if self._lost is not None:
            raise EnvSessionLost(self._lost)
        if self._client is None:
            raise RuntimeError("openenv: step before reset; call reset(seed) first")
        try:
            result = self._client.step({self.action_field: action})
        except RuntimeError as e:  # the server answered with an error: its env raised (or refused the action)
            if not str(e).startswith("Server error"):
                raise self._lose(e) from e
            raise
        except Exception as e:  # connection closed or refused, a timeout: the session is gone
            raise self._lose(e) from e
        observation = result.observation if isinstance(result.observation, dict) else {}
        info = observation.get(self.info_field)
        if not isinstance(info, dict):
            info = {k: v for k, v in observation.items() if k != (self.observation_field or "text")}
        return StepOutcome(
            observation=self._text(observation),
            reward=float(result.reward) if result.reward is not None else 0.0,
            done=bool(result.done),
            info=info,
        )

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # a broken session has nothing left to close; the loop thread is stopped anyway
                log.debug("closing the OpenEnv session at %s", self.base_url, exc_info=True)

    def _connect(self) -> Any:
        """A connected session client; an unreachable server is retried for `connect_wait_s` (it may be restarting)."""
        from rollart.activities.envs.openenv_session import (
            BearerEnvClient,  # heavy (openenv: FastAPI, fastmcp): only where envs run
        )

        deadline = time.monotonic() + self.connect_wait_s
        pause = _CONNECT_BACKOFF_S[0]
        while True:
            token = self._sent = self._token()  # read at each attempt: a rotated Secret is picked up
            session = BearerEnvClient(
                base_url=self.base_url,
                connect_timeout_s=min(10.0, self.connect_wait_s),
                message_timeout_s=self.timeout_s,
                token=token,
            )
            client = session.sync()
            try:
                return client.connect()
            except Exception as e:
                _close_quietly(client)
                if time.monotonic() + pause > deadline:
                    raise ConnectionError(
                        f"openenv: no OpenEnv server answers at {self.base_url} (waited "
                        f"{self.connect_wait_s:g}s): {_describe(e, token)}"
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, _CONNECT_BACKOFF_S[1])

    def _token(self) -> str | None:
        """The job's env-server token, for the job's own servers only (`server` set); EnvTokenError when
        `$ROLLART_ENV_SERVER_TOKEN_FILE` names a file without one."""
        return job_token() if self.server else None

    def _lose(self, e: BaseException) -> EnvSessionLost:
        self._lost = f"the OpenEnv session at {self.base_url} is gone: {_describe(e, self._sent)}"
        self.close()
        return EnvSessionLost(self._lost)

    def _text(self, observation: Any) -> str:
        """The observation's text field, or (no such field, none asked for) the whole observation as JSON."""
        if not isinstance(observation, dict):
            raise TypeError(f"openenv: the server's observation is not an object: {observation!r}")
        field = self.observation_field or "text"
        text = observation.get(field)
        if isinstance(text, str):
            return text
        if self.observation_field is not None:
            raise ValueError(
                f"openenv: the server's observation has no text field {field!r} "
                f"(fields: {', '.join(sorted(observation))}); set env_args.observation_field"
            )
        return json.dumps(observation, sort_keys=True, separators=(",", ":"))


def _describe(e: BaseException, secret: str | None = None) -> str:
    """`Type: text`, with `secret` (the token, which openenv's errors quote in the URL) blanked out."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text.replace(secret, "***") if secret else text


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # never connected: only its loop thread to stop
        log.debug("closing an unconnected OpenEnv client", exc_info=True)
