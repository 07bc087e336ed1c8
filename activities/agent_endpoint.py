"""The OpenAI-compatible endpoint agent programs talk to: one small HTTP server per env worker process.

`POST /t/<workflow id>/v1/chat/completions` becomes the `chat` update of that trajectory's workflow, which plays the
request as a turn and answers with the sampled assistant message; `GET /t/<workflow id>/v1/models` lists the one
model. So `openai.OpenAI(base_url=".../t/<id>/v1", api_key="x")` works unmodified, and every turn stays inside the
trajectory's workflow (durable, in its history, its tokens recorded). The server keeps only what each trajectory's
workflow holds of its conversation, to send a request that continues it as its new messages (the workflow checks
the digest of the rest; a request it refuses so is sent whole): an agent resends its whole history every time, and
the history would hold it once per turn.

The server binds `ROLLART_AGENT_HOST` (127.0.0.1 by default) on `ROLLART_AGENT_PORT` (0: a free port), and base URLs
name `ROLLART_AGENT_ADVERTISE` (by default the bound host): set it, and the host to 0.0.0.0, when agent programs run
on another machine than their env worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from rollart.contracts.agent import CHAT_UPDATE, ChatInput, ChatReply, TurnRefused
from rollart.contracts.conversation import history_digest, plan_turn
from rollart.spec.chat import ChatMessage

__all__ = ["AgentEndpoint", "EndpointConfig", "chat_input", "completion_body", "stream_chunks"]

log = logging.getLogger(__name__)

MODEL_NAME = "rollart-policy"
"""The model `GET /models` lists; requests may name any model (the policy being trained answers them all)."""


@dataclass(frozen=True)
class EndpointConfig:
    """Where the endpoint listens and the host its base URLs name."""

    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None

    @classmethod
    def from_env(cls) -> EndpointConfig:
        """From `ROLLART_AGENT_HOST`, `ROLLART_AGENT_PORT` and `ROLLART_AGENT_ADVERTISE` (see the module's doc)."""
        return cls(
            host=os.environ.get("ROLLART_AGENT_HOST", "127.0.0.1"),
            port=int(os.environ.get("ROLLART_AGENT_PORT", "0")),
            advertise=os.environ.get("ROLLART_AGENT_ADVERTISE") or None,
        )


def _text(content: Any) -> str | None:
    """A message's content as text: OpenAI's list of parts is joined (only text parts are understood)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in ("text", None)]
        return "".join(parts)
    raise ValueError(f"message content must be text or a list of text parts, got {type(content).__name__}")


def chat_input(body: Any) -> ChatInput:
    """An OpenAI chat-completions request body as the `chat` update's input; ValueError saying what is wrong.

    A `developer` message counts as a system message; sampling fields (temperature, max_tokens, ...) are ignored:
    the task's `sampling` is how the policy being trained samples.
    """
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("the request needs a non-empty `messages` list")
    messages = []
    for i, raw in enumerate(body["messages"]):
        if not isinstance(raw, dict):
            raise ValueError(f"messages[{i}] is not an object")
        m = {**raw, "content": _text(raw.get("content"))}
        if m.get("role") == "developer":
            m["role"] = "system"
        try:
            messages.append(ChatMessage.model_validate(m))
        except ValueError as e:
            raise ValueError(f"messages[{i}]: {e}") from e
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise ValueError("`tools` must be a list")
    return ChatInput(messages=messages, tools=tools)


def _message_body(reply: ChatReply) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in reply.tool_calls]
    return out


def completion_body(reply: ChatReply, model: str, request_id: str) -> dict[str, Any]:
    """The OpenAI `chat.completion` object of a reply (the policy version as its `system_fingerprint`)."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"rollart-v{reply.policy_version}",
        "choices": [
            {"index": 0, "message": _message_body(reply), "finish_reason": reply.finish_reason, "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def stream_chunks(reply: ChatReply, model: str, request_id: str) -> list[dict[str, Any]]:
    """`stream: true`: the whole reply as one `chat.completion.chunk` (then the caller sends `[DONE]`)."""
    delta = _message_body(reply)
    if reply.tool_calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    whole = completion_body(reply, model, request_id)
    choice = {"index": 0, "delta": delta, "finish_reason": reply.finish_reason, "logprobs": None}
    return [{**whole, "object": "chat.completion.chunk", "choices": [choice]}]


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class AgentEndpoint:
    """The HTTP server of one worker process (started on first use by `start`, stopped by `shutdown`)."""

    def __init__(self, client: Client, config: EndpointConfig | None = None) -> None:
        self.client = client
        self.config = config or EndpointConfig.from_env()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._starting = asyncio.Lock()
        self._held: dict[tuple[str, str], tuple[list[ChatMessage], list[dict[str, Any]] | None]] = {}
        """Per (workflow, trajectory), the conversation its workflow holds after the last reply (what a next request
        continues)."""

    @property
    def address(self) -> str:
        """`http://host:port` as agent programs reach it (the advertised host)."""
        return f"http://{self.config.advertise or self.config.host}:{self._port}"

    def base_url(self, workflow_id: str, trajectory: str = "") -> str:
        """The OpenAI base URL of one trajectory: its chat requests become that workflow's turns. `trajectory` names
        one of the several a workflow plays (a group's free members); "": the workflow's own."""
        member = f"/{trajectory}" if trajectory else ""
        return f"{self.address}/t/{workflow_id}{member}/v1"

    async def start(self) -> None:
        """Listen, once per process (later calls return at once)."""
        async with self._starting:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=64 * 1024 * 1024)
            for path in ("/t/{workflow_id}/v1", "/t/{workflow_id}/{trajectory}/v1"):
                app.router.add_post(f"{path}/chat/completions", self._chat)
                app.router.add_get(f"{path}/models", self._models)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.config.host, self.config.port)
            await site.start()
            self._port = runner.addresses[0][1]
            self._runner = runner
            where = (self.config.host, self._port, self.address)
            log.info("agent endpoint listening on %s:%d (base URLs %s/t/<id>/v1)", *where)

    async def shutdown(self) -> None:
        """Stop listening (requests in flight are dropped: their programs are being stopped too)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def forget(self, workflow_id: str, trajectory: str = "") -> None:
        """Drop what is known of a trajectory's conversation (its program has ended)."""
        self._held.pop((workflow_id, trajectory), None)

    async def _play(self, workflow_id: str, inp: ChatInput) -> ChatReply:
        """The `chat` update for `inp`: only its new messages when it continues what the workflow holds (as far as
        this endpoint knows; the workflow checks the digest, and a request it refuses so is sent again whole)."""
        handle = self.client.get_workflow_handle(workflow_id)
        send, key = inp, (workflow_id, inp.trajectory)
        held = self._held.get(key)
        if held is not None:
            plan = plan_turn(held[0], held[1], inp.messages, inp.tools)
            if plan.continues:
                digest = history_digest(held[0], held[1])
                send = ChatInput(
                    messages=plan.messages,
                    history_len=len(held[0]),
                    history_digest=digest,
                    trajectory=inp.trajectory,
                )
        try:
            reply = await handle.execute_update(CHAT_UPDATE, send, result_type=ChatReply)
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            mismatch = isinstance(cause, ApplicationError) and cause.type == TurnRefused.HISTORY_MISMATCH
            if send is inp or not mismatch:
                raise
            self._held.pop(key, None)
            reply = await handle.execute_update(CHAT_UPDATE, inp, result_type=ChatReply)
        said = ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)
        self._held[key] = ([*inp.messages, said], inp.tools)
        return reply

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": MODEL_NAME, "object": "model", "owned_by": "rollart"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        workflow_id, trajectory = request.match_info["workflow_id"], request.match_info.get("trajectory", "")
        try:
            body = await request.json()
            inp = chat_input(body).model_copy(update={"trajectory": trajectory})
        except ValueError as e:  # json.JSONDecodeError is one
            return _error(400, f"bad chat request: {e}", "invalid_request_error")
        try:
            reply = await self._play(workflow_id, inp)
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            kind = cause.type if isinstance(cause, ApplicationError) and cause.type else "turn_refused"
            return _error(400, str(cause.message if isinstance(cause, ApplicationError) else cause or e), kind)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                named = f"{workflow_id}/{trajectory}" if trajectory else workflow_id
                return _error(404, f"no running trajectory {named!r}: {e.message}", "not_found_error")
            return _error(503, f"Temporal: {e.message}", "server_error")
        model = str(body.get("model") or MODEL_NAME)
        request_id = f"chatcmpl-{trajectory or workflow_id}-{reply.turn}"
        if not body.get("stream"):
            return web.json_response(completion_body(reply, model, request_id))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for chunk in stream_chunks(reply, model, request_id):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
