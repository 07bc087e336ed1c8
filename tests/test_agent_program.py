"""Agent programs (`env: agent`) through the endpoint, on a real Temporal server with in-process workers: the real
`openai` client, the real endpoint, `run_agent` and `generate` activities and the tiny-chat model's tokenizer and
template. The engine is scripted (a random tiny model never writes a tool call): it answers each turn with a fixed
text as token ids, and keeps the prompts it was given, so the test sees the conversation grow token by token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import openai
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from rollart.activities.agent_program import AgentActivities
from rollart.activities.engines.base import Engine
from rollart.activities.generate import GenerateActivities
from rollart.activities.reward import RewardActivities
from rollart.client.trajectory_loader import load_trajectory
from rollart.contracts.agent import ChatInput
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from rollart.contracts.store import StoredTurn
from rollart.infra.store.payload import Store, open_store
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import StoreConfig, TaskSpec, WorkerTuning
from rollart.spec.pools import queue_name
from rollart.workflows.group_rollout import GroupRolloutWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow
from tests.support.scripted import ScriptedEngine, SlowOn, play_group

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
        },
    }
]
TOOL_CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "2+3"}}</tool_call>'


def calculator_agent(base_url: str, seed: int, api_key: str) -> dict:
    """An agent as users write them: ask, run the tool the model calls, send its output, read the answer."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["rollart-policy"]
    messages: list[dict] = [{"role": "user", "content": f"What is 2+3? (seed {seed})"}]
    first = client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
    reply = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and reply.tool_calls, first
    messages.append(reply.model_dump(exclude_none=True))  # the SDK's own echo of the reply
    for call in reply.tool_calls:
        expr = json.loads(call.function.arguments)["expr"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expr))})
    second = client.chat.completions.create(model="any", messages=messages, tools=TOOLS, stream=True)
    answer = "".join(chunk.choices[0].delta.content or "" for chunk in second)
    messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": "Sure?"})
    try:
        client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
    except openai.BadRequestError as e:
        assert "max_turns (2) reached" in str(e), e
    else:
        raise AssertionError("a third turn past max_turns 2 was served")
    return {"value": 1.0 if "5" in answer else 0.0, "success": "5" in answer}


async def silent_agent(base_url: str, seed: int, api_key: str) -> None:
    """An async agent that leaves its score to the task's reward (returns None)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])


def rewriting_agent(base_url: str, seed: int, **kw: str) -> None:
    """An agent that rewrites its history (a summary instead of the conversation): a new segment. (It takes its
    api_key among keyword arguments, as a program with more options may.)"""
    client = openai.OpenAI(base_url=base_url, api_key=kw["api_key"], max_retries=0)
    client.chat.completions.create(model="any", messages=[{"role": "user", "content": "What is 2+3?"}])
    summary = [{"role": "system", "content": "Summary: asked for 2+3."}, {"role": "user", "content": "Go on."}]
    client.chat.completions.create(model="any", messages=summary)


def raising_agent(base_url: str, seed: int, api_key: str) -> float:
    openai.OpenAI(base_url=base_url, api_key=api_key).chat.completions.create(
        model="any", messages=[{"role": "user", "content": "hi"}]
    )
    raise RuntimeError("the agent's own bug")


async def hanging_agent(base_url: str, seed: int, *, api_key: str) -> float:
    await openai.AsyncOpenAI(base_url=base_url, api_key=api_key).chat.completions.create(
        model="any", messages=[{"role": "user", "content": "hi"}]
    )
    await asyncio.sleep(3600)
    return 1.0


ASK = [{"role": "user", "content": "What is 2+3?"}]


def retrying_agent(base_url: str, seed: int, api_key: str) -> float:
    """Sends each request more than once, as clients retry: with the same Idempotency-Key (even with another body),
    after its client timed out (the engine is slow on the second turn), and the very same request with no key.
    Each is one turn, and each retry gets the first call's reply."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    key = {"Idempotency-Key": f"call-0-of-seed-{seed}"}
    first = client.chat.completions.create(model="any", messages=ASK, extra_headers=key)
    again = client.chat.completions.create(model="any", messages=[*ASK, *ASK], extra_headers=key)
    more = [*ASK, first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
    sent: list[httpx.Request] = []
    watched = httpx.Client(event_hooks={"request": [sent.append]})
    impatient = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=0.5, max_retries=4, http_client=watched)
    second = impatient.chat.completions.create(model="any", messages=more)
    assert len(sent) >= 2, sent  # it timed out at least once, and was retried
    last = [*more, second.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Bye."}]
    third = client.chat.completions.create(model="any", messages=last)
    repeated = client.chat.completions.create(model="any", messages=last)
    replies = [(r.id.rsplit("-", 1)[1], r.choices[0].message.content) for r in (first, again, second, third, repeated)]
    assert replies == [("0", "one"), ("0", "one"), ("1", "two"), ("2", "three"), ("2", "three")], replies
    return 1.0


async def racing_agent(base_url: str, seed: int, api_key: str) -> float:
    """Two requests that continue the same turn at once. The second passes the update's validator while the first
    is being played, then is refused by its handler (the history moved on), a refusal Temporal keeps under its
    update id: the endpoint plays it whole under a second id, and its retry finds that turn again."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = await client.chat.completions.create(model="any", messages=ASK)
    held = [*ASK, first.choices[0].message.model_dump(exclude_none=True)]
    slow = [*held, {"role": "user", "content": "Sure?"}]
    playing = asyncio.create_task(client.chat.completions.create(model="any", messages=slow))
    await asyncio.sleep(0.5)  # the engine is slow on this turn: the next request comes while it is played
    other = [*held, {"role": "user", "content": "Why?"}]
    raced = await client.chat.completions.create(model="any", messages=other)
    retried = await client.chat.completions.create(model="any", messages=other)
    await playing
    assert (raced.id, raced.choices[0].message.content) == (retried.id, retried.choices[0].message.content), retried
    assert raced.id.endswith("-2") and (await playing).id.endswith("-1"), raced
    return 1.0


KILLED_AGENT = """
import os, signal, openai
client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY (its endpoint's secret) are set for it
client.chat.completions.create(model="any", messages=[{"role": "user", "content": "What is 2+3?"}])
os.kill(os.getpid(), signal.SIGKILL)
"""


class AnswersTheTool(ScriptedEngine):
    """Calls the tool until the prompt holds its output, then answers: right for each of several conversations
    played at once, whatever order their turns come in."""

    def reply(self, prompt: list[int]) -> str:
        return "It is 5." if "<tool_response>" in self.tokenizer.decode(prompt) else TOOL_CALL


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart.infra.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-chat", chat=True)


@contextlib.asynccontextmanager
async def workers(
    client: Client,
    prefix: str,
    engine: Engine,
    store: Store,
    model: Path,
    more: Callable[[AgentActivities], list[Worker]] = lambda agents: [],
) -> AsyncIterator[None]:
    """The workers an agent trajectory needs: workflows, run_agent (cpu), generate (h800), reward (serverless),
    and `more` of the caller's, given the agent activities (whose endpoint they may share)."""
    gen = GenerateActivities(engine, store, "scripted", model, queue="")
    agents = AgentActivities(client)
    rewards = RewardActivities()
    ours = [
        Worker(
            client,
            task_queue=queue_name("control", prefix),
            workflows=[TrajectoryWorkflow, GroupRolloutWorkflow],
            workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
        ),
        Worker(client, task_queue=queue_name("cpu", prefix), activities=[agents.run_agent]),
        Worker(client, task_queue=queue_name("h800", prefix), activities=[gen.generate]),
        Worker(client, task_queue=queue_name("serverless", prefix), activities=[rewards.reward]),
    ]
    async with contextlib.AsyncExitStack() as running:
        for worker in [*ours, *more(agents)]:
            await running.enter_async_context(worker)
        try:
            yield
        finally:
            await agents.shutdown()


def agent_task(env_args: dict, **overrides: object) -> TaskSpec:
    base = {
        "name": "calc-agent",
        "env": "agent",
        "env_args": env_args,
        "reward": "env_return",
        "tool_parser": "hermes",
        "max_turns": 2,
        "sampling": {"max_tokens": 64},
    }
    return TaskSpec.model_validate({**base, **overrides})


UPDATES: dict[str, list[ChatInput]] = {}
"""Each trajectory's chat updates as its history holds them, by workflow id (what `run` read)."""


async def run(
    env: WorkflowEnvironment,
    task: TaskSpec,
    prefix: str,
    engine: Engine,
    store: Store,
    model: Path,
    refused_in_handler: int = 0,
) -> TrajectoryResult:
    """One agent trajectory of seed 3, to its end; its history must replay (the turns came as updates), hold one
    accepted update per turn (and `refused_in_handler` more that failed), and the trajectory loader must find each
    turn in it."""
    workflow_id = f"agent-{uuid.uuid4().hex[:8]}"
    async with workers(env.client, prefix, engine, store, model):
        result = await env.client.execute_workflow(
            "TrajectoryWorkflow",
            TrajectoryInput(task=task, seed=3, job_id="agent-test", queue_prefix=prefix),
            id=workflow_id,
            task_queue=queue_name("control", prefix),
            result_type=TrajectoryResult,
        )
    history = await env.client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(
        workflows=[TrajectoryWorkflow],
        data_converter=env.client.data_converter,
        workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
    )
    await replayer.replay_workflow(history)
    played = {
        e.workflow_execution_update_completed_event_attributes.meta.update_id
        for e in history.events
        if e.HasField("workflow_execution_update_completed_event_attributes")
        and e.workflow_execution_update_completed_event_attributes.outcome.HasField("success")
    }
    accepted = [
        e.workflow_execution_update_accepted_event_attributes
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    turns = [a for a in accepted if a.accepted_request.meta.update_id in played]
    assert len(turns) == result.turns  # one update per turn: a request retried, or refused, played none more
    assert len(accepted) - len(turns) == refused_in_handler  # one past max_turns left nothing in the history
    UPDATES[result.trajectory_id] = [
        (await env.client.data_converter.decode(a.accepted_request.input.args.payloads, [ChatInput]))[0] for a in turns
    ]
    view = await load_trajectory(env.client, workflow_id, store)  # `rollart trajectories show` sees its turns
    assert [t.data_key for t in view.turns] == result.turn_keys and all(t.prompt_tokens for t in view.turns)
    return result


async def test_an_openai_agent_with_a_tool_call_plays_its_turns_token_by_token(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    engine = ScriptedEngine(tokenizer, [TOOL_CALL, "It is 5."])
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task({"entry": "tests.test_agent_program:calculator_agent"})
    result = await run(bare_env, task, queue_prefix, engine, store, chat_model)

    assert result.status == "completed" and result.reward == 1.0 and result.success, result
    assert result.turns == 2 and len(result.turn_keys) == 2 and result.completion_tokens > 0
    first, second = (StoredTurn.from_bytes(store.get(k)) for k in result.turn_keys)
    assert first.prefix_key is None and second.prefix_key == result.turn_keys[0] and second.format == 2
    assert first.completions[0].token_ids and second.completions[0].text == "It is 5."
    # the second prompt is the first, the ids sampled then, and only the tool output's tokens
    one, two = engine.prompts
    assert two[: len(one)] == one
    assert two[len(one) : len(one) + len(first.completions[0].token_ids)] == first.completions[0].token_ids
    assert tokenizer.decode(second.prompt_ids).count("<tool_response>5</tool_response>") == 1
    assert "What is 2+3" not in tokenizer.decode(second.prompt_ids)
    # the endpoint sent the second request as its one new message after the two the workflow held
    updates = UPDATES[result.trajectory_id]
    assert [(u.history_len, len(u.messages)) for u in updates] == [(0, 1), (2, 1)]
    assert updates[1].messages[0].role == "tool" and updates[1].history_digest


async def test_an_agent_that_returns_none_is_scored_by_the_tasks_reward(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    engine = ScriptedEngine(AutoTokenizer.from_pretrained(chat_model), ["hello"])
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task({"entry": "tests.test_agent_program:silent_agent"})
    result = await run(bare_env, task, queue_prefix, engine, store, chat_model)
    assert result.status == "completed" and result.reward == 0.0 and result.turns == 1, result


async def test_an_agent_that_rewrites_its_history_starts_a_new_segment(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    engine = ScriptedEngine(AutoTokenizer.from_pretrained(chat_model), ["5"])
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task({"entry": "tests.test_agent_program:rewriting_agent"})
    result = await run(bare_env, task, queue_prefix, engine, store, chat_model)
    assert result.status == "completed" and result.turns == 2, result
    second = StoredTurn.from_bytes(store.get(result.turn_keys[1]))
    assert second.prefix_key is None and second.format == 1 and "Summary" in second.prompt
    assert engine.prompts[1][: len(engine.prompts[0])] != engine.prompts[0]


async def test_a_retried_request_is_played_once_and_answered_alike(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    """A retry with the same Idempotency-Key, a client that timed out and retried, and the same request sent twice
    with no key: three turns in the history, three generations, each retry answered with its first call's reply."""
    from transformers import AutoTokenizer

    engine = SlowOn(AutoTokenizer.from_pretrained(chat_model), ["one", "two", "three"], slow=(1,), delay_s=1.0)
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task({"entry": "tests.test_agent_program:retrying_agent"}, max_turns=3)
    result = await run(bare_env, task, queue_prefix, engine, store, chat_model)
    assert result.status == "completed" and result.reward == 1.0 and result.turns == 3, result
    assert len(engine.prompts) == 3


async def test_a_request_refused_by_the_turns_handler_is_played_whole_once(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    """The update refused in its handler (kept by Temporal under its id) is in the history; the request is then
    played whole, once, and its retry is answered with that turn."""
    from transformers import AutoTokenizer

    engine = SlowOn(AutoTokenizer.from_pretrained(chat_model), ["one", "two", "three"], slow=(1,), delay_s=1.5)
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task({"entry": "tests.test_agent_program:racing_agent"}, max_turns=3)
    result = await run(bare_env, task, queue_prefix, engine, store, chat_model, refused_in_handler=1)
    assert result.status == "completed" and result.reward == 1.0 and result.turns == 3, result
    whole = UPDATES[result.trajectory_id][2]
    assert whole.history_len == 0 and [m.content for m in whole.messages][-1] == "Why?"


@pytest.mark.parametrize(
    ("env_args", "why"),
    [
        ({"command": [sys.executable, "-c", KILLED_AGENT]}, "killed by signal 9"),
        ({"entry": "tests.test_agent_program:raising_agent"}, "raised RuntimeError: the agent's own bug"),
        ({"entry": "tests.test_agent_program:hanging_agent", "timeout_s": 2}, "ran past its timeout_s (2 s)"),
    ],
    ids=["killed", "raised", "timed-out"],
)
async def test_a_crashed_or_hung_agent_fails_its_trajectory_unscored(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path, env_args: dict, why: str
) -> None:
    from transformers import AutoTokenizer

    engine = ScriptedEngine(AutoTokenizer.from_pretrained(chat_model), ["4"])
    store = open_store(StoreConfig(path=tmp_path / "store"))
    result = await run(bare_env, agent_task(env_args), queue_prefix, engine, store, chat_model)
    assert result.status == "failed" and result.reward is None and result.success is None, result
    assert "AgentFailed" in (result.error or "") and why in (result.error or ""), result.error
    assert result.turns == 1 and len(engine.prompts) == 1  # its one turn was played (and is not trained on)


async def test_a_groups_agent_programs_play_free_inside_one_workflow_each_at_its_own_url(
    bare_env: WorkflowEnvironment, queue_prefix: str, chat_model: Path, tmp_path: Path
) -> None:
    """`rollout_unit: group` with `group_play: free`: the members' programs run at once, each at a base URL naming
    its member, and each one's requests are its own trajectory's turns, token by token, in the group's one
    workflow (no child workflow each); the history replays."""
    from transformers import AutoTokenizer

    engine = AnswersTheTool(AutoTokenizer.from_pretrained(chat_model), [])
    store = open_store(StoreConfig(path=tmp_path / "store"))
    task = agent_task(
        {"entry": "tests.test_agent_program:calculator_agent"}, group_size=3, rollout_unit="group", group_play="free"
    )
    workflow_id = f"agent-group-{uuid.uuid4().hex[:8]}"
    group = GroupSeed(group_id=f"{workflow_id}-g0", seed=3)
    inp = GroupRolloutInput(task=task, groups=[group], job_id="agent-test", queue_prefix=queue_prefix)
    async with workers(bare_env.client, queue_prefix, engine, store, chat_model):
        results = await play_group(bare_env.client, inp, workflow_id)

    assert len(results) == 3 and len({r.trajectory_id for r in results}) == 3
    assert all(r.status == "completed" and r.reward == 1.0 and r.turns == 2 for r in results), results
    for r in results:  # each member's second turn continues its own first, token by token
        first, second = (StoredTurn.from_bytes(store.get(k)) for k in r.turn_keys)
        assert first.prefix_key is None and second.prefix_key == r.turn_keys[0] and second.format == 2
    history = await bare_env.client.get_workflow_handle(workflow_id).fetch_history()
    accepted = [
        e.workflow_execution_update_accepted_event_attributes
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    requests = [
        (await bare_env.client.data_converter.decode(a.accepted_request.input.args.payloads, [ChatInput]))[0]
        for a in accepted
    ]
    assert sorted(u.trajectory for u in requests) == sorted(r.trajectory_id for r in results for _ in range(2))
    replayer = Replayer(
        workflows=[GroupRolloutWorkflow],
        data_converter=bare_env.client.data_converter,
        workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
    )
    await replayer.replay_workflow(history)
