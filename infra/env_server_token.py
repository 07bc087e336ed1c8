"""The job's env-server token: where a process finds it, for the env servers that check it and the clients that send it.

Two places, both named by environment variables so the servers and workers a stack or a pod starts inherit them:

- ``$ROLLART_ENV_SERVER_TOKEN_FILE``: a file holding the token (Kubernetes mounts the job's Secret there, so the
  token is in no process's environment and no pod spec). Read at every call: a rotated Secret is picked up by the
  clients without a restart (a server reads it once, at start).
- ``$ROLLART_ENV_SERVER_TOKEN``: the token itself (the local stack mints one and its children inherit it).

A file that is named must hold a token: a missing, unreadable or empty one is an error (`EnvTokenError`), never
"no token", so a server that was meant to check one cannot start serving everyone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "EnvTokenError", "job_token"]

TOKEN_ENV: Final = "ROLLART_ENV_SERVER_TOKEN"
"""The environment variable holding the job's env-server token (the local stack's)."""

TOKEN_FILE_ENV: Final = "ROLLART_ENV_SERVER_TOKEN_FILE"
"""The environment variable naming a file that holds the token (Kubernetes: the job's mounted Secret)."""


class EnvTokenError(RuntimeError):
    """`$ROLLART_ENV_SERVER_TOKEN_FILE` names a file that does not hold a token."""


def job_token() -> str | None:
    """The job's env-server token: the file `$ROLLART_ENV_SERVER_TOKEN_FILE` names when set, else
    `$ROLLART_ENV_SERVER_TOKEN`, else None (no token: a server serves everyone who reaches it)."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise EnvTokenError(
                f"${TOKEN_FILE_ENV} names {path}, which cannot be read ({type(e).__name__}: {e}); on Kubernetes, "
                "create the job's env-token Secret (`rollart k8s render` prints the command)"
            ) from None
        if not token:
            raise EnvTokenError(f"${TOKEN_FILE_ENV} names {path}, which is empty: it must hold the job's token")
        return token
    return os.environ.get(TOKEN_ENV) or None
