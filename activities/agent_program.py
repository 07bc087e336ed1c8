"""The `run_agent` activity: runs one episode of a user's agent program against its trajectory's endpoint.

The program is `env_args.entry` (`module:function`, called as `run(base_url, seed)`: sync in a thread, async
awaited) or `env_args.command` (a subprocess with `ROLLART_BASE_URL`, `ROLLART_SEED`, and `OPENAI_BASE_URL` /
`OPENAI_API_KEY` for an unmodified `openai` client; the last line it prints may be its reward as JSON). It
returns the episode's reward — a number, `{"value": ..., "success": ...}`, or an object with those attributes —
or None for the task's reward to score the transcript. A crash, a non-zero exit, a kill or a run past
`timeout_s` is `AgentFailed`: the trajectory fails (infra, masked), it is never scored 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import traceback
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from rollart.activities.agent_endpoint import AgentEndpoint
from rollart.activities.heartbeat import heartbeating
from rollart.contracts.agent import RunAgentInput, RunAgentResult
from rollart.contracts.errors import ErrorType
from rollart.spec.config.agent import AgentArgs
from rollart.spec.imports import ImportPathError, resolve_import_path

__all__ = ["AgentActivities", "as_result"]

HEARTBEAT_EVERY_S = 5.0
OUTPUT_TAIL_CHARS = 2000


def _failed(why: str) -> ApplicationError:
    return ErrorType.AGENT_FAILED.error(why)


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


class AgentActivities:
    """Binds `run_agent` to this worker's agent endpoint (one HTTP server per process, started on first use)."""

    def __init__(self, client: Client, endpoint: AgentEndpoint | None = None) -> None:
        self.endpoint = endpoint or AgentEndpoint(client)

    async def shutdown(self) -> None:
        """Stop the endpoint."""
        await self.endpoint.shutdown()

    @activity.defn(name="run_agent")
    async def run_agent(self, inp: RunAgentInput) -> RunAgentResult:
        """Run the program to its end (heartbeating), its base URL naming the calling trajectory's workflow."""
        await self.endpoint.start()
        workflow_id = activity.info().workflow_id
        base_url = self.endpoint.base_url(workflow_id, inp.trajectory)
        args = inp.args
        async with heartbeating(HEARTBEAT_EVERY_S, first_now=True):
            try:
                if args.entry is not None:
                    return await asyncio.wait_for(self._call(args, base_url, inp.seed), args.timeout_s)
                return await self._command(args, base_url, inp.seed)
            except TimeoutError as e:
                raise _failed(f"the agent program ran past its timeout_s ({args.timeout_s:g} s)") from e
            finally:
                self.endpoint.forget(workflow_id, inp.trajectory)

    async def _call(self, args: AgentArgs, base_url: str, seed: int) -> RunAgentResult:
        assert args.entry is not None
        try:
            fn = resolve_import_path(args.entry)
        except ImportPathError as e:
            raise ErrorType.INVALID_INPUT.error(str(e)) from e
        try:
            if inspect.iscoroutinefunction(fn):
                value = await fn(base_url, seed)
            else:  # a sync program blocks: a thread of its own (one past its timeout is abandoned, not killed)
                value = await asyncio.to_thread(fn, base_url, seed)
                if inspect.isawaitable(value):
                    value = await value
        except (ApplicationError, asyncio.CancelledError):
            raise
        except Exception as e:
            tail = "".join(traceback.format_exception(e))[-OUTPUT_TAIL_CHARS:]
            raise _failed(f"the agent program {args.entry} raised {type(e).__name__}: {e}\n{tail}") from e
        return as_result(value)

    async def _command(self, args: AgentArgs, base_url: str, seed: int) -> RunAgentResult:
        assert args.command is not None
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "rollart",
            **args.env,
            "ROLLART_BASE_URL": base_url,
            "ROLLART_SEED": str(seed),
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *args.command,
                env=env,
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
            raise _failed(f"the agent command {args.command[0]!r} {how}: {stderr[-OUTPUT_TAIL_CHARS:]}")
        return _last_line_result(stdout)
