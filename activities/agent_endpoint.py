"""The OpenAI-compatible endpoint agent programs talk to: one small HTTP server per env worker process.

`POST /t/<workflow id>/v1/chat/completions` becomes the `chat` update of that trajectory's workflow, which plays the
request as a turn and answers with the sampled assistant message; `GET /t/<workflow id>/v1/models` lists the one
model. So `openai.OpenAI(base_url=".../t/<id>/v1", api_key=<its secret>)` works unmodified, and every turn stays
inside the trajectory's workflow (durable, in its history, its tokens recorded).

Only its rollout can use a trajectory's endpoint: `grant` mints an unguessable secret for one (workflow, trajectory)
and `revoke` (or `forget`) drops it; a request whose `Authorization: Bearer` names no live grant for exactly its
path's trajectory gets one and the same 401, whatever the path, and reaches no workflow. `GET /health` needs none.

Each request is played once: its update id is its `Idempotency-Key` header, or else a digest of its messages and
tools, scoped by trajectory, so a client's retry gets the first call's reply and records no second turn (Temporal
returns a finished update's outcome to a later update of the same id). An identical request repeated is therefore
the same turn.

The server keeps only what each trajectory's workflow holds of its conversation, to send a request that continues
it as its new messages (the workflow checks the digest of the rest; a request it refuses so is sent whole): an agent
resends its whole history every time, and the history would hold it once per turn.

The server binds `ROLLART_AGENT_HOST` (127.0.0.1 by default) on `ROLLART_AGENT_PORT` (0: a free port), and base URLs
name `ROLLART_AGENT_ADVERTISE` (by default the bound host): set it, and the host to 0.0.0.0, when agent programs run
on another machine than their env worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from aiohttp import web
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from rollart.contracts.agent import CHAT_UPDATE, ChatInput, ChatReply, TurnRefused
from rollart.contracts.conversation import history_digest, plan_turn
from rollart.spec.chat import ChatMessage

__all__ = [
    "IDEMPOTENCY_HEADER",
    "AgentEndpoint",
    "EndpointConfig",
    "chat_input",
    "completion_body",
    "request_key",
    "stream_chunks",
    "update_id",
]

log = logging.getLogger(__name__)

MODEL_NAME = "rollart-policy"
"""The model `GET /models` lists; requests may name any model (the policy being trained answers them all)."""

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The request header whose value makes a request's update id: its retries, with the same value, are one turn."""

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
_FINISH_REASONS: frozenset[str] = frozenset(get_args(FinishReason))

_UNAUTHORIZED = {
    "error": {
        "message": "this endpoint serves a trajectory only to its own agent program: send the api_key rollart gave "
        "the program (`Authorization: Bearer <key>`; OPENAI_API_KEY of a command)",
        "type": "authentication_error",
        "code": "invalid_api_key",
    }
}
"""The one body of every refused request: the same for an unknown, revoked or foreign key, or none, on any path."""


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


def request_key(inp: ChatInput) -> str:
    """The idempotency key of a request that brings none: the digest of its messages and tools as canonical JSON
    (parsed first, so spelling does not matter), so that a client's blind retry is the same turn."""
    messages = [m.model_dump(mode="json") for m in inp.messages]
    canonical = json.dumps({"messages": messages, "tools": inp.tools}, sort_keys=True, separators=(",", ":"))
    return "request:" + hashlib.sha256(canonical.encode()).hexdigest()


def update_id(trajectory: str, key: str) -> str:
    """The `chat` update id of a request with idempotency key `key`: scoped by the member it is for (a group's
    members share one workflow, and Temporal's update ids are per workflow run), hashed to a fixed length."""
    return "chat-" + hashlib.sha256(f"{trajectory}\0{key}".encode()).hexdigest()[:40]


def _finish_reason(reason: str) -> FinishReason:
    """OpenAI's finish reasons are a closed set: an engine's other ones (vLLM's `abort`) are reported as `stop`."""
    return cast(FinishReason, reason) if reason in _FINISH_REASONS else "stop"


def _message(reply: ChatReply) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in reply.tool_calls]
    return out


def _usage(reply: ChatReply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens, "total_tokens": total}


def _envelope(reply: ChatReply, model: str, request_id: str, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
    """What a completion and a chunk share: ids, the model, the policy version and the usage, around one choice."""
    return {
        "id": request_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"rollart-v{reply.policy_version}",
        "choices": [choice],
        "usage": _usage(reply),
    }


def completion_body(reply: ChatReply, model: str, request_id: str) -> dict[str, Any]:
    """The OpenAI `chat.completion` of a reply as JSON (the policy version as its `system_fingerprint`): built as
    `openai`'s own type, so a field out of shape fails here, not in the agent's client. Fields left unset are left
    out; those set to null (a tool call's `content`) stay, as OpenAI sends them."""
    choice = {"index": 0, "message": _message(reply), "finish_reason": _finish_reason(reply.finish_reason)}
    body = _envelope(reply, model, request_id, "chat.completion", {**choice, "logprobs": None})
    return ChatCompletion.model_validate(body).model_dump(mode="json", exclude_unset=True)


def stream_chunks(reply: ChatReply, model: str, request_id: str) -> list[dict[str, Any]]:
    """`stream: true`: the whole reply as one `chat.completion.chunk` (`openai`'s type, as JSON; then the caller
    sends `[DONE]`)."""
    delta = _message(reply)
    if reply.tool_calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    choice = {"index": 0, "delta": delta, "finish_reason": _finish_reason(reply.finish_reason), "logprobs": None}
    body = _envelope(reply, model, request_id, "chat.completion.chunk", choice)
    return [ChatCompletionChunk.model_validate(body).model_dump(mode="json", exclude_unset=True)]


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _unauthorized() -> web.Response:
    return web.json_response(_UNAUTHORIZED, status=401, headers={"WWW-Authenticate": "Bearer"})


def _refused_for_history(e: WorkflowUpdateFailedError) -> bool:
    cause = e.cause
    return isinstance(cause, ApplicationError) and cause.type == TurnRefused.HISTORY_MISMATCH


Owner = tuple[str, str]
"""A grant's (workflow id, trajectory): the one path its secret opens."""


class AgentEndpoint:
    """The HTTP server of one worker process (started on first use by `start`, stopped by `shutdown`)."""

    def __init__(self, client: Client, config: EndpointConfig | None = None) -> None:
        self.client = client
        self.config = config or EndpointConfig.from_env()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._starting = asyncio.Lock()
        self._held: dict[Owner, tuple[list[ChatMessage], list[dict[str, Any]] | None]] = {}
        """Per (workflow, trajectory), the conversation its workflow holds after the last reply (what a next request
        continues)."""
        self._grants: dict[str, Owner] = {}
        """The live secrets, each with the one trajectory it opens."""

    @property
    def address(self) -> str:
        """`http://host:port` as agent programs reach it (the advertised host)."""
        return f"http://{self.config.advertise or self.config.host}:{self._port}"

    def base_url(self, workflow_id: str, trajectory: str = "") -> str:
        """The OpenAI base URL of one trajectory: its chat requests become that workflow's turns. `trajectory` names
        one of the several a workflow plays (a group's free members); "": the workflow's own."""
        member = f"/{trajectory}" if trajectory else ""
        return f"{self.address}/t/{workflow_id}{member}/v1"

    def grant(self, workflow_id: str, trajectory: str = "") -> str:
        """A new secret that opens this trajectory's endpoint (and no other) until revoked: its program's API key."""
        secret = secrets.token_urlsafe(32)
        self._grants[secret] = (workflow_id, trajectory)
        return secret

    def revoke(self, secret: str) -> None:
        """Close what `secret` opened (its program has ended): its later requests get 401."""
        self._grants.pop(secret, None)

    def forget(self, workflow_id: str, trajectory: str = "") -> None:
        """Drop what is known of a trajectory (its program has ended): its conversation and every grant for it."""
        self._held.pop((workflow_id, trajectory), None)
        for secret in [s for s, owner in self._grants.items() if owner == (workflow_id, trajectory)]:
            del self._grants[secret]

    async def start(self) -> None:
        """Listen, once per process (later calls return at once)."""
        async with self._starting:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_get("/health", self._health)
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

    def _owner(self, request: web.Request) -> Owner | None:
        """The trajectory the request's path names, if its bearer secret is a live grant for exactly it; else None.
        Looked up by the secret itself (a dict of unguessable keys), never by the path."""
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        owner = self._grants.get(secret.strip())
        named = (request.match_info["workflow_id"], request.match_info.get("trajectory", ""))
        return owner if owner == named else None

    def _new_messages(self, held_key: Owner, inp: ChatInput) -> ChatInput:
        """`inp` as its new messages only, when it continues what its workflow holds (as far as this endpoint
        knows, with the digest of that for the workflow to check); else `inp` itself."""
        held = self._held.get(held_key)
        if held is None:
            return inp
        plan = plan_turn(held[0], held[1], inp.messages, inp.tools)
        if not plan.continues:
            return inp
        digest = history_digest(held[0], held[1])
        return ChatInput(
            messages=plan.messages, history_len=len(held[0]), history_digest=digest, trajectory=inp.trajectory
        )

    async def _play(self, workflow_id: str, inp: ChatInput, key: str) -> ChatReply:
        """The `chat` update for `inp`, played once per idempotency `key`: only its new messages when it continues
        what the workflow holds (the workflow checks the digest), and whole when the workflow refuses that.

        Every try of one request uses ids derived from `key` alone, never from what was sent, so a retry finds the
        first call's outcome whatever form either took: a refusal by the update's validator is not stored (the
        whole request then goes under the same id), but one by its handler is (a turn took the history meanwhile),
        and then the whole request goes under a second id, which a retry reaches the same way."""
        handle = self.client.get_workflow_handle(workflow_id)
        held_key, uid = (workflow_id, inp.trajectory), update_id(inp.trajectory, key)
        first = self._new_messages(held_key, inp)
        tries = [(first, uid), *([(inp, uid)] if first is not inp else []), (inp, f"{uid}-whole")]
        *before, (whole, last_id) = tries
        for send, try_id in before:
            try:
                reply = await handle.execute_update(CHAT_UPDATE, send, id=try_id, result_type=ChatReply)
                break
            except WorkflowUpdateFailedError as e:
                if not _refused_for_history(e):
                    raise
                self._held.pop(held_key, None)
        else:
            reply = await handle.execute_update(CHAT_UPDATE, whole, id=last_id, result_type=ChatReply)
        said = ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)
        self._held[held_key] = ([*inp.messages, said], inp.tools)
        return reply

    async def _health(self, request: web.Request) -> web.Response:
        """Liveness for probes and load balancers: no auth, and nothing about any trajectory."""
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        if self._owner(request) is None:
            return _unauthorized()
        model = {"id": MODEL_NAME, "object": "model", "owned_by": "rollart"}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        owner = self._owner(request)  # first: a refused request is not even read
        if owner is None:
            return _unauthorized()
        workflow_id, trajectory = owner
        try:
            body = await request.json()
            inp = chat_input(body).model_copy(update={"trajectory": trajectory})
        except ValueError as e:  # json.JSONDecodeError is one
            return _error(400, f"bad chat request: {e}", "invalid_request_error")
        given = request.headers.get(IDEMPOTENCY_HEADER, "").strip()
        key = f"header:{given}" if given else request_key(inp)
        try:
            reply = await self._play(workflow_id, inp, key)
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
