"""The agent endpoint serves a trajectory only to its own program, and plays each of its requests once.

Attacks that must fail the same way (one 401 body, whatever the path) and reach no workflow: a sibling member's path
with our key, a guessed path with no key, a closed trajectory's revoked key, a finished workflow's path; a `command`
program sees none of the worker's environment beyond its basics. The exactly-once tries run against a stand-in
Temporal that keeps update outcomes by id as the server does (a validator's refusal is not kept, a handler's is);
tests/test_agent_program.py checks the same on the real server.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import openai
import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from rollart.activities.agent_endpoint import IDEMPOTENCY_HEADER, AgentEndpoint, EndpointConfig
from rollart.activities.agent_program import AgentActivities
from rollart.contracts.agent import ChatInput, ChatReply, RunAgentInput, TurnRefused
from rollart.contracts.errors import ErrorType
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryResult
from rollart.infra.store.payload import open_store
from rollart.spec.config import StoreConfig
from rollart.spec.config.agent import AgentArgs
from rollart.spec.pools import queue_name
from tests.test_agent_program import ScriptedEngine, agent_task, chat_model, workers

__all__ = ["chat_model"]  # the fixture, shared with tests/test_agent_program.py

ASK = {"messages": [{"role": "user", "content": "hi"}]}


class NoTemporal:
    """A Temporal client no request may reach: each attempt is recorded and fails."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> Any:
        self.reached.append(workflow_id)
        raise AssertionError(f"a refused request reached workflow {workflow_id!r}")


@pytest.fixture
async def endpoint() -> AsyncIterator[AgentEndpoint]:
    ep = AgentEndpoint(cast(Client, NoTemporal()), EndpointConfig())
    await ep.start()
    yield ep
    await ep.shutdown()


async def call(ep: AgentEndpoint, path: str, key: str | None = None, *, scheme: str = "Bearer") -> tuple[int, str]:
    """POST a chat request to `path` (GET for `/models`), with `key` if any: the status and body."""
    headers = {"Authorization": f"{scheme} {key}"} if key is not None else {}
    async with aiohttp.ClientSession() as http:
        if path.endswith("/models"):
            got = await http.get(ep.address + path, headers=headers)
        else:
            got = await http.post(ep.address + path, json=ASK, headers=headers)
        return got.status, await got.text()


async def test_a_key_opens_its_own_trajectory_and_nothing_else(endpoint: AgentEndpoint) -> None:
    mine, sibling, closed = (endpoint.grant("wf-g", m) for m in ("a", "b", "c"))
    endpoint.revoke(closed)
    gone = endpoint.grant("wf-g", "d")
    endpoint.forget("wf-g", "d")
    attacks = {
        "a sibling's chat with our key": await call(endpoint, "/t/wf-g/b/v1/chat/completions", mine),
        "a sibling's models with our key": await call(endpoint, "/t/wf-g/b/v1/models", mine),
        "the group workflow's own path with our key": await call(endpoint, "/t/wf-g/v1/chat/completions", mine),
        "a guessed id with no key": await call(endpoint, "/t/wf-guess/v1/chat/completions"),
        "a guessed id with a made-up key": await call(endpoint, "/t/wf-guess/v1/chat/completions", "made-up"),
        "a closed trajectory's revoked key": await call(endpoint, "/t/wf-g/c/v1/chat/completions", closed),
        "a forgotten trajectory's key": await call(endpoint, "/t/wf-g/d/v1/chat/completions", gone),
        "our key under another scheme": await call(endpoint, "/t/wf-g/a/v1/chat/completions", mine, scheme="Basic"),
        "our key on a sibling of another workflow": await call(endpoint, "/t/wf-h/a/v1/chat/completions", mine),
    }
    assert {status for status, _ in attacks.values()} == {401}, attacks
    assert len({body for _, body in attacks.values()}) == 1, attacks  # no oracle: one body for all
    assert cast(NoTemporal, endpoint.client).reached == []
    assert (await call(endpoint, "/t/wf-g/a/v1/models", mine))[0] == 200
    assert (await call(endpoint, "/t/wf-g/b/v1/models", sibling))[0] == 200  # the attacks closed nothing
    async with aiohttp.ClientSession() as http, http.get(endpoint.address + "/health") as got:
        assert got.status == 200 and await got.json() == {"status": "ok"}


@dataclass
class StoredOutcomes:
    """A workflow as Temporal treats update ids: an update's outcome, reply or its handler's refusal, is kept under
    its id and returned to any later update of that id whatever its input; its validator's refusal is not kept.
    It refuses every request sent as new messages only, by `refuse_new_messages_in` ("validator" or "handler")."""

    refuse_new_messages_in: str
    outcomes: dict[str, ChatReply | WorkflowUpdateFailedError] = field(default_factory=dict)
    played: list[ChatInput] = field(default_factory=list)

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> StoredOutcomes:
        return self

    async def execute_update(self, update: str, req: ChatInput, *, id: str, result_type: type) -> ChatReply:
        if id not in self.outcomes:
            refused = WorkflowUpdateFailedError(TurnRefused.HISTORY_MISMATCH.error("the history moved on"))
            if req.history_len and self.refuse_new_messages_in == "validator":
                raise refused
            if req.history_len:
                self.outcomes[id] = refused
            else:
                self.played.append(req)
                self.outcomes[id] = ChatReply(content=f"turn {len(self.played) - 1}", turn=len(self.played) - 1)
        outcome = self.outcomes[id]
        if isinstance(outcome, WorkflowUpdateFailedError):
            raise outcome
        return outcome


async def chat(ep: AgentEndpoint, key: str, messages: list[dict], idempotency_key: str = "", who: str = "") -> str:
    """A chat request's reply: its id (which names the turn) and its text."""
    headers = {"Authorization": f"Bearer {key}"} | ({IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key else {})
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{ep.base_url('wf', who)}/chat/completions", json={"messages": messages}, headers=headers) as got,
    ):
        body = await got.json()
        assert got.status == 200, body
        return f"{body['id']}: {body['choices'][0]['message']['content']}"


@pytest.mark.parametrize("refused_in", ["validator", "handler"])
async def test_a_retried_request_is_one_turn_even_after_a_refused_continuation(refused_in: str) -> None:
    """The endpoint sends a continuing request as its new messages; the workflow refuses that, in its validator (not
    kept) or, when another turn took the history meanwhile, in its handler (kept under the update id): either way
    the request is played whole once, and its retry finds that reply, not a second turn."""
    temporal = StoredOutcomes(refused_in)
    ep = AgentEndpoint(cast(Client, temporal), EndpointConfig())
    await ep.start()
    try:
        key = ep.grant("wf")
        first = [{"role": "user", "content": "hi"}]
        assert await chat(ep, key, first) == "chatcmpl-wf-0: turn 0"
        more = [*first, {"role": "assistant", "content": "turn 0"}, {"role": "user", "content": "more"}]
        replies = {await chat(ep, key, more) for _ in range(3)}
    finally:
        await ep.shutdown()
    assert replies == {"chatcmpl-wf-1: turn 1"} and len(temporal.played) == 2
    assert temporal.played[1].history_len == 0 and len(temporal.played[1].messages) == 3


async def test_the_idempotency_key_names_the_turn_per_member() -> None:
    """The header, when given, is the key (a retry may even differ in body); without it, the request is; each
    member's keys are its own."""
    temporal = StoredOutcomes("validator")
    ep = AgentEndpoint(cast(Client, temporal), EndpointConfig())
    await ep.start()
    try:
        a, b = ep.grant("wf", "a"), ep.grant("wf", "b")
        hi, other = [{"role": "user", "content": "hi"}], [{"role": "user", "content": "other"}]
        one = await chat(ep, a, hi, idempotency_key="k1", who="a")
        assert await chat(ep, a, other, idempotency_key="k1", who="a") == one  # a retry: the first call's reply
        assert await chat(ep, a, hi, idempotency_key="k2", who="a") != one  # another call, though the same body
        assert await chat(ep, b, hi, idempotency_key="k1", who="b") != one  # another member's k1
        assert await chat(ep, b, other, who="b") == await chat(ep, b, other, who="b")  # no key: the body is it
    finally:
        await ep.shutdown()
    assert len(temporal.played) == 4


async def keyless_agent(base_url: str, seed: int) -> None:
    """A program written before api keys: refused before it runs, saying how to fix it."""
    raise AssertionError("never called")


class Recording(AgentEndpoint):
    """An endpoint that keeps each key it granted (to try them once they are revoked)."""

    def __init__(self) -> None:
        super().__init__(cast(Client, NoTemporal()), EndpointConfig())
        self.granted: list[tuple[str, str]] = []

    def grant(self, workflow_id: str, trajectory: str = "") -> str:
        key = super().grant(workflow_id, trajectory)
        self.granted.append((key, self.base_url(workflow_id, trajectory)))
        return key


async def models_status(base_url: str, key: str) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{base_url}/models", headers={"Authorization": f"Bearer {key}"}) as got,
    ):
        return got.status


async def test_an_entry_that_cannot_take_its_key_is_refused_saying_how_to_fix_it() -> None:
    ep = Recording()
    agents = AgentActivities(cast(Client, None), ep)
    inp = RunAgentInput(args=AgentArgs(entry="tests.test_agent_endpoint_security:keyless_agent"), seed=1)
    try:
        with pytest.raises(Exception, match=r"def run\(base_url, seed, api_key\)") as refused:
            await ActivityEnvironment().run(agents.run_agent, inp)
        assert getattr(refused.value, "type", None) == ErrorType.INVALID_INPUT.value
        [(key, base_url)] = ep.granted
        assert await models_status(base_url, key) == 401  # revoked as the program ended
    finally:
        await agents.shutdown()


ENV_PROBE = """
import json, os, urllib.request
asked = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/models", headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
)
models = [m["id"] for m in json.load(urllib.request.urlopen(asked))["data"]]
json.dump({"env": dict(os.environ), "models": models}, open(os.environ["PROBE_OUT"], "w"))
print(1.0)
"""


@pytest.mark.integration  # a subprocess
@pytest.mark.parametrize("listed", [False, True], ids=["worker-only", "listed"])
async def test_a_command_sees_only_its_basics_its_env_and_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listed: bool
) -> None:
    monkeypatch.setenv("TEMPORAL_API_KEY", "the-workers-own")
    out = tmp_path / "probe.json"
    given = {"PROBE_OUT": str(out), "OPENAI_API_KEY": "overridden?"} | ({"TEMPORAL_API_KEY": "given"} if listed else {})
    ep = Recording()
    agents = AgentActivities(cast(Client, None), ep)
    args = AgentArgs(command=[sys.executable, "-c", ENV_PROBE], env=given)
    try:
        result = await ActivityEnvironment().run(agents.run_agent, RunAgentInput(args=args, seed=7))
        probe = json.loads(out.read_text())
        [(key, base_url)] = ep.granted
        revoked = await models_status(base_url, key)
    finally:
        await agents.shutdown()
    env = probe["env"]
    assert result.reward == 1.0 and probe["models"] == ["rollart-policy"]  # its key opened its endpoint
    assert env.get("TEMPORAL_API_KEY") == ("given" if listed else None)
    assert env["OPENAI_API_KEY"] == env["ROLLART_API_KEY"] == key and env["OPENAI_BASE_URL"] == base_url
    assert env["ROLLART_SEED"] == "7" and "PATH" in env
    assert revoked == 401


@dataclass
class Gate:
    """Where the held programs of the attack test leave their base URL and key, and wait to be let go."""

    keys: dict[str, str] = field(default_factory=dict)
    open: asyncio.Event = field(default_factory=asyncio.Event)


GATE = Gate()


async def held_agent(base_url: str, seed: int, api_key: str) -> float:
    """One turn, then it waits (its key live) until the test has attacked its siblings' endpoints."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
    GATE.keys[base_url] = api_key
    await GATE.open.wait()
    return 1.0


async def post(url: str, key: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/chat/completions", json=ASK, headers=headers) as got:
        return got.status, await got.text()


@pytest.mark.integration
async def test_live_and_closed_members_of_a_group_cannot_be_reached_with_another_key(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    """Two members' real programs at once in one group workflow: while both are live, one's key does not open the
    other's endpoint, nor does a guess; once the workflow has finished, their revoked keys open nothing. The
    workflow's history holds each program's one turn and nothing else."""
    from transformers import AutoTokenizer

    GATE.keys.clear()
    GATE.open = asyncio.Event()
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(chat_model), ["hello"])
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task(
        {"entry": "tests.test_agent_endpoint_security:held_agent"},
        group_size=2,
        rollout_unit="group",
        group_play="free",
    )
    workflow_id = f"agent-attack-{uuid.uuid4().hex[:8]}"
    inp = GroupRolloutInput(
        task=task, groups=[GroupSeed(group_id=f"{workflow_id}-g0", seed=3)], job_id="attack", queue_prefix=queue_prefix
    )
    async with workers(bare_env.client, queue_prefix, engine, store, chat_model):
        handle = await bare_env.client.start_workflow(
            "GroupRolloutWorkflow",
            inp,
            id=workflow_id,
            task_queue=queue_name("control", queue_prefix),
            result_type=list[TrajectoryResult],
        )
        async with asyncio.timeout(30):
            while len(GATE.keys) < 2:
                await asyncio.sleep(0.05)
        (url_a, key_a), (url_b, key_b) = GATE.keys.items()
        address = url_a.split("/t/")[0]
        live = [
            await post(url_b, key_a),  # a sibling's endpoint with our key
            await post(url_a, key_b),
            await post(url_b, None),  # a live member's endpoint with no key
            await post(f"{address}/t/{workflow_id}/v1", key_a),  # the group workflow's own path
            await post(f"{address}/t/{workflow_id}-guess/v1", None),  # a guessed id
        ]
        GATE.open.set()
        results = await handle.result()
        closed = [await post(url_a, key_a), await post(url_b, key_b)]  # revoked keys of a finished workflow
    assert all(r.status == "completed" and r.turns == 1 for r in results), results
    assert {s for s, _ in live + closed} == {401} and len({b for _, b in live + closed}) == 1, live + closed
    history = await handle.fetch_history()
    accepted = [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
    assert len(accepted) == 2 and len(engine.prompts) == 2  # each program's one turn, nothing from the attacks
