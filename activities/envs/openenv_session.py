"""openenv's `GenericEnvClient`, connecting with an ``Authorization: Bearer`` header (the job's env-server token).

openenv-core 0.3's client takes no headers, and a token in the WebSocket URL's query string ends up in every
access log and proxy log on the way. This subclass overrides only `connect` (openenv's own opens the same
WebSocket with the same timeouts and size limit) and adds the header; nothing global is patched. Like openenv's,
it bypasses proxies for a server on the local machine (by websockets' `proxy=None`, not by editing
``$NO_PROXY`` for the whole process). Imported only where envs run (openenv pulls in FastAPI).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect as ws_connect

__all__ = ["BearerEnvClient"]

_LOOPBACK = ("localhost", "127.0.0.1", "::1")


class BearerEnvClient(GenericEnvClient):
    """A `GenericEnvClient` that presents `token` (when given) as ``Authorization: Bearer TOKEN``."""

    def __init__(self, *, token: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._bearer = token

    async def connect(self) -> BearerEnvClient:
        if self._ws is not None:
            return self
        headers = {"Authorization": f"Bearer {self._bearer}"} if self._bearer else None
        proxy = None if urlsplit(self._ws_url).hostname in _LOOPBACK else True
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=headers,
                proxy=proxy,
            )
        except Exception as e:  # openenv's own wording, which callers (and their retries) expect
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {e}") from e
        return self
