"""The `run_agent` activity: runs one episode of a user's agent program against its trajectory's endpoint.

The program is `env_args.entry` (`module:function`, called as `run(base_url, seed, api_key=...)`: sync in a thread,
async awaited) or `env_args.command` (a subprocess with `ROLLART_BASE_URL`, `ROLLART_SEED`, `ROLLART_API_KEY`, and
`OPENAI_BASE_URL` / `OPENAI_API_KEY` for an unmodified `openai` client; the last line it prints may be its reward as
JSON). The API key is a secret granted for this episode alone and revoked when it ends: with it the program's
requests reach its own trajectory and no other. A command's environment is an allowlist of the worker's basics
(`INHERITED_ENV`) and `env_args.env`, never the worker's whole environment (which may hold Temporal's credentials).
It returns the episode's reward — a number, `{"value": ..., "success": ...}`, or an object with those attributes —
or None for the task's reward to score the transcript. A crash, a non-zero exit, a kill or a run past
`timeout_s` is `AgentFailed`: the trajectory fails (infra, masked), it is never scored 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import signal
import traceback
from collections.abc import Iterator
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from rollart.activities.agent_endpoint import AgentEndpoint
from rollart.activities.heartbeat import heartbeating
from rollart.contracts.agent import RunAgentInput, RunAgentResult
from rollart.contracts.errors import ErrorType
from rollart.infra.secrets import remember, scrub
from rollart.spec.config.agent import AgentArgs, FromEnv
from rollart.spec.imports import ImportPathError, resolve_import_path

__all__ = ["AgentActivities", "as_result"]

HEARTBEAT_EVERY_S = 5.0
OUTPUT_TAIL_CHARS = 2000

INHERITED_ENV = re.compile(
    r"PATH|HOME|USER|LOGNAME|SHELL|LANG|LANGUAGE|LC_\w+|TZ|TERM|TMPDIR|TEMP|TMP|PYTHONPATH|VIRTUAL_ENV|"
    r"SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|"
    r"SYSTEMROOT|SYSTEMDRIVE|WINDIR|COMSPEC|PATHEXT|USERPROFILE|APPDATA|LOCALAPPDATA"
)
"""The worker's variables an agent `command` inherits (the rest it gets only from `env_args.env`): what a program
needs to find its interpreter, its packages, its locale, certificates and a temporary directory: no credentials."""


def _failed(why: str, api_key: str = "") -> ApplicationError:
    """The program's failure, its output scrubbed of the worker's secrets and its own key before it is recorded."""
    return ErrorType.AGENT_FAILED.error(scrub(why, extra=(api_key,)))


def as_result(value: Any) -> RunAgentResult:
    """What a program returned as its result; a value of another kind is the program's bug (InvalidInput)."""
    if value is None:
        return RunAgentResult()
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        reward, success = getattr(value, "value", None), getattr(value, "success", None)
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            return RunAgentResult(reward=float(reward), success=None if success is None else bool(success))
    elif isinstance(value, int | float):
        return RunAgentResult(reward=float(value))
    else:
        reward = value.get("value", value.get("reward"))
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            success = value.get("success")
            return RunAgentResult(reward=float(reward), success=None if success is None else bool(success))
    raise ErrorType.INVALID_INPUT.error(
        f"an agent program returns its reward (a number, {{'value': ..., 'success': ...}}) or None, not {value!r}"
    )


def _last_line_result(stdout: str) -> RunAgentResult:
    """A command's reward: its last non-empty line of output if that is JSON, else None (the task's reward)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return RunAgentResult()
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return RunAgentResult()
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        return RunAgentResult()
    return as_result(value)


def _command_env(args: AgentArgs, base_url: str, seed: int, api_key: str) -> dict[str, str]:
    """An agent command's environment: the worker's basics, `env_args.env`, then rollart's variables (which no
    `env_args.env` overrides: the key is the only one its endpoint takes)."""
    inherited = {k: v for k, v in os.environ.items() if INHERITED_ENV.fullmatch(k)}
    ours = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}
    ours |= {"ROLLART_BASE_URL": base_url, "ROLLART_SEED": str(seed), "ROLLART_API_KEY": api_key}
    return {**inherited, **{k: _value(k, v) for k, v in args.env.items()}, **ours}


def _value(name: str, value: str | FromEnv) -> str:
    """An `env_args.env` value: as written, or the worker's own variable it names (remembered as a secret, so that
    the program printing it leaves `[redacted]` in what is recorded)."""
    if isinstance(value, str):
        return value
    found = os.environ.get(value.from_env)
    if found is None:
        raise ErrorType.INVALID_INPUT.error(
            f"env_args.env.{name} is the worker's variable {value.from_env}, which is not set on this worker: set it "
            "in the env workers' environment (on Kubernetes, from a Secret)"
        )
    remember(found)
    return found


def _takes_api_key(fn: Any) -> bool:
    """Whether `fn` can be called with `api_key=` (a parameter of that name, or **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature Python cannot read: called as documented
        return True
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == "api_key" and p.kind in named) for p in params)


class AgentActivities:
    """Binds `run_agent` to this worker's agent endpoint (one HTTP server per process, started on first use)."""

    def __init__(self, client: Client, endpoint: AgentEndpoint | None = None) -> None:
        self.endpoint = endpoint or AgentEndpoint(client)

    async def shutdown(self) -> None:
        """Stop the endpoint."""
        await self.endpoint.shutdown()

    @activity.defn(name="run_agent")
    async def run_agent(self, inp: RunAgentInput) -> RunAgentResult:
        """Run the program to its end (heartbeating), its base URL naming the calling trajectory's workflow and its
        API key granted for that trajectory alone (revoked when the program ends, however it ends)."""
        await self.endpoint.start()
        workflow_id = activity.info().workflow_id
        base_url = self.endpoint.base_url(workflow_id, inp.trajectory)
        args = inp.args
        with self._granted(workflow_id, inp.trajectory) as api_key:
            async with heartbeating(HEARTBEAT_EVERY_S, first_now=True):
                try:
                    if args.entry is not None:
                        return await asyncio.wait_for(self._call(args, base_url, inp.seed, api_key), args.timeout_s)
                    return await self._command(args, base_url, inp.seed, api_key)
                except TimeoutError as e:
                    raise _failed(f"the agent program ran past its timeout_s ({args.timeout_s:g} s)") from e

    @contextlib.contextmanager
    def _granted(self, workflow_id: str, trajectory: str) -> Iterator[str]:
        """A secret that opens this trajectory's endpoint while the program runs; revoked, and its conversation
        forgotten, when it ends, however it ends."""
        api_key = self.endpoint.grant(workflow_id, trajectory)
        try:
            yield api_key
        finally:
            self.endpoint.revoke(api_key)
            self.endpoint.forget(workflow_id, trajectory)

    async def _call(self, args: AgentArgs, base_url: str, seed: int, api_key: str) -> RunAgentResult:
        assert args.entry is not None
        try:
            fn = resolve_import_path(args.entry)
        except ImportPathError as e:
            raise ErrorType.INVALID_INPUT.error(str(e)) from e
        if not _takes_api_key(fn):
            raise ErrorType.INVALID_INPUT.error(
                f"the agent program {args.entry} must take the API key of its endpoint: define it as "
                "`def run(base_url, seed, api_key)` and give the key to its client "
                "(`OpenAI(base_url=base_url, api_key=api_key)`)"
            )
        try:
            if inspect.iscoroutinefunction(fn):
                value = await fn(base_url, seed, api_key=api_key)
            else:  # a sync program blocks: a thread of its own (one past its timeout is abandoned, not killed)
                value = await asyncio.to_thread(fn, base_url, seed, api_key=api_key)
                if inspect.isawaitable(value):
                    value = await value
        except (ApplicationError, asyncio.CancelledError):
            raise
        except Exception as e:
            tail = "".join(traceback.format_exception(e))[-OUTPUT_TAIL_CHARS:]
            raise _failed(f"the agent program {args.entry} raised {type(e).__name__}: {e}\n{tail}", api_key) from e
        return as_result(value)

    async def _command(self, args: AgentArgs, base_url: str, seed: int, api_key: str) -> RunAgentResult:
        assert args.command is not None
        try:
            proc = await asyncio.create_subprocess_exec(
                *args.command,
                env=_command_env(args, base_url, seed, api_key),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its children are killed with it
            )
        except OSError as e:
            raise ErrorType.INVALID_INPUT.error(f"cannot start agent command {args.command!r}: {e}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), args.timeout_s)
        finally:
            if proc.returncode is None:  # timed out or cancelled: the program and its children go
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if proc.returncode != 0:
            how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
            raise _failed(f"the agent command {args.command[0]!r} {how}: {stderr[-OUTPUT_TAIL_CHARS:]}", api_key)
        return _last_line_result(stdout)
