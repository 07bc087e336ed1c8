"""Temporal-native agents (`env: agent` with `env_args.workflow`) on a real Temporal server with in-process workers:
the unmodified example agent (examples/temporal_agent: a triage agent that hands off to a weather agent with an
activity tool and a function tool) on a worker with Temporal's OpenAI Agents SDK plugin, its model calls through the
real endpoint, the `chat` update and `generate` with the tiny-chat model's tokenizer and template. The engine is
scripted (a random tiny model never hands off): it plays the agents' part by what the prompt holds so far, and
keeps each prompt it was given and the ids it sampled, so the test compares them with what would be trained on.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from rollart.activities.agent_program import AgentActivities
from rollart.activities.engines.base import Engine
from rollart.contracts.agent_workflow import agent_queue, agent_workflow_id
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from rollart.contracts.store import StoredTurn, whole_prompt
from rollart.infra.store.payload import Store, open_store
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import StoreConfig, TaskSpec, WorkerTuning
from rollart.spec.pools import queue_name
from rollart.workers.agent_worker import agent_worker, agents_plugins
from rollart.workflows.trajectory import TrajectoryWorkflow
from tests.support.scripted import SlowOn, play_group
from tests.test_agent_program import workers as program_workers

pytestmark = pytest.mark.integration

pytest.importorskip("temporalio.openai_agents", reason="the `agents` extra (make setup installs it)")

WORKFLOW = "examples.temporal_agent.workflows:TriageWorkflow"
ACTIVITY = "examples.temporal_agent.activities:get_weather"


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


HANDOFF = call("transfer_to_weather_agent", "{}")
LOOK_UP = call("get_weather", '{"city": "Paris"}')
CONVERT = call("to_fahrenheit", '{"celsius": 18}')
ANSWER = "It is 18.0 C (64.4 F) and cloudy in Paris."


@dataclass
class Agentic(SlowOn):
    """Plays the agents' part by the tool outputs the prompt holds: hand off, look the weather up, convert it,
    answer (`loop`: look it up forever). Slow on no call unless told (`slow`)."""

    slow: tuple[int, ...] = ()
    loop: bool = False

    def reply(self, prompt: list[int]) -> str:
        answered = self.tokenizer.decode(prompt).count("<tool_response>")
        return [HANDOFF, LOOK_UP][min(answered, 1)] if self.loop else [HANDOFF, LOOK_UP, CONVERT, ANSWER][answered]


def workers(
    client: Client, prefix: str, engine: Engine, store: Store, model: Path, call_timeout_s: float = 60
) -> contextlib.AbstractAsyncContextManager[None]:
    """An agent trajectory's workers, and the agent worker with the plugin on the cpu pool's agent queue, sharing
    the agent activities' endpoint."""
    timeout = timedelta(seconds=call_timeout_s)
    agent_queue_ = agent_queue(queue_name("cpu", prefix))
    return program_workers(
        client,
        prefix,
        engine,
        store,
        model,
        more=lambda agents: [agent_worker(client, agent_queue_, [WORKFLOW], [ACTIVITY], agents.endpoint, timeout)],
    )


def task(**overrides: object) -> TaskSpec:
    base = {
        "name": "weather-triage",
        "env": "agent",
        "env_args": {"workflow": WORKFLOW, "activities": [ACTIVITY], "inputs": ["What is the weather like in Paris?"]},
        "reward": "examples.temporal_agent.rewards:weather_answer",
        "tool_parser": "hermes",
        "max_turns": 8,
        "sampling": {"max_tokens": 64},
    }
    return TaskSpec.model_validate({**base, **overrides})


AGENT_HISTORIES: dict[str, WorkflowHistory] = {}
"""Each trajectory's agent workflow's history, by trajectory id (what `run` read)."""


async def run(
    env: WorkflowEnvironment, prefix: str, engine: Engine, store: Store, model: Path, **kw: float
) -> TrajectoryResult:
    """One trajectory to its end; both its history and its agent workflow's must replay."""
    workflow_id = f"tagent-{uuid.uuid4().hex[:8]}"
    async with workers(env.client, prefix, engine, store, model, **kw):
        result = await env.client.execute_workflow(
            "TrajectoryWorkflow",
            TrajectoryInput(task=task(), seed=0, job_id="tagent-test", queue_prefix=prefix),
            id=workflow_id,
            task_queue=queue_name("control", prefix),
            result_type=TrajectoryResult,
        )
    own = await env.client.get_workflow_handle(workflow_id).fetch_history()
    await Replayer(
        workflows=[TrajectoryWorkflow],
        data_converter=env.client.data_converter,
        workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
    ).replay_workflow(own)
    agent_history = await env.client.get_workflow_handle(agent_workflow_id(workflow_id)).fetch_history()
    from examples.temporal_agent.workflows import TriageWorkflow

    await Replayer(
        workflows=[TriageWorkflow], plugins=agents_plugins(AgentActivities(env.client).endpoint)
    ).replay_workflow(agent_history)
    AGENT_HISTORIES[result.trajectory_id] = agent_history
    return result


def trained_on(store: Store, result: TrajectoryResult) -> list[tuple[list[int], list[int]]]:
    """Each turn's whole prompt ids and sampled ids, as the trainer reads them from the store."""
    records = [StoredTurn.from_bytes(store.get(k)) for k in result.turn_keys]
    by_key = dict(zip(result.turn_keys, records, strict=True))
    return [(whole_prompt(by_key.__getitem__, r), r.completions[0].token_ids) for r in records]


async def test_the_example_agent_hands_off_and_uses_both_tools_and_every_call_is_the_turn_trained_on(
    bare_env: WorkflowEnvironment, queue_prefix: str, tiny_chat_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    engine = Agentic(AutoTokenizer.from_pretrained(tiny_chat_model))
    store = open_store(StoreConfig(path=tmp_path / "store"))
    result = await run(bare_env, queue_prefix, engine, store, tiny_chat_model)

    assert result.status == "completed" and result.reward == 1.0 and result.success, result
    assert result.turns == 4 == len(engine.prompts)  # handoff, activity tool, function tool, answer
    assert trained_on(store, result) == list(zip(engine.prompts, engine.sampled, strict=True))
    records = [StoredTurn.from_bytes(store.get(k)) for k in result.turn_keys]
    # the handoff gave the conversation the weather agent's instructions: a new segment; the tools' outputs then
    # continued it token by token
    assert [r.prefix_key for r in records] == [None, None, result.turn_keys[1], result.turn_keys[2]]
    prompts = [AutoTokenizer.from_pretrained(tiny_chat_model).decode(p) for p in engine.prompts]
    assert "transfer_to_weather_agent" in prompts[0] and "get_weather" not in prompts[0]
    assert "get_weather" in prompts[1] and "'conditions': 'cloudy'" in prompts[2]
    assert "64.4" in prompts[3]  # the function tool ran in the agent workflow


async def test_a_model_call_past_its_timeout_is_retried_and_is_still_one_turn(
    bare_env: WorkflowEnvironment, queue_prefix: str, tiny_chat_model: Path, tmp_path: Path
) -> None:
    """The second model call's generation outlasts the model activity's timeout once: the activity is retried with
    the same idempotency key, which is the same update, so the trajectory plays and records that turn once."""
    from transformers import AutoTokenizer

    engine = Agentic(AutoTokenizer.from_pretrained(tiny_chat_model), slow=(1,), delay_s=3.0)
    store = open_store(StoreConfig(path=tmp_path / "store"))
    result = await run(bare_env, queue_prefix, engine, store, tiny_chat_model, call_timeout_s=1.5)

    assert result.status == "completed" and result.reward == 1.0, result
    assert result.turns == 4 == len(engine.prompts) == len(result.turn_keys)
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in AGENT_HISTORIES[result.trajectory_id].events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert sorted(attempts)[-1] == 2 and len(attempts) == 5, attempts  # the second call's retry, 4 model calls
    assert trained_on(store, result) == list(zip(engine.prompts, engine.sampled, strict=True))


async def test_an_agent_past_its_max_turns_ends_scored_at_once(
    bare_env: WorkflowEnvironment, queue_prefix: str, tiny_chat_model: Path, tmp_path: Path
) -> None:
    """The weather agent looks the weather up forever: the Agents SDK's MaxTurnsExceeded (the workflow's
    `max_turns=6`) fails the agent workflow at once, not its workflow task over and over, and the episode is
    the policy's doing: scored (0 here, no answer), never masked."""
    from transformers import AutoTokenizer

    engine = Agentic(AutoTokenizer.from_pretrained(tiny_chat_model), loop=True)
    store = open_store(StoreConfig(path=tmp_path / "store"))
    began = time.monotonic()
    result = await run(bare_env, queue_prefix, engine, store, tiny_chat_model)

    assert result.status == "completed" and result.reward is not None and not result.success, result
    assert result.turns == 6 == len(engine.prompts) and time.monotonic() - began < 30
    assert trained_on(store, result) == list(zip(engine.prompts, engine.sampled, strict=True))


async def test_a_groups_members_each_start_their_own_agent_workflow_inside_one_group_workflow(
    bare_env: WorkflowEnvironment, queue_prefix: str, tiny_chat_model: Path, tmp_path: Path
) -> None:
    """`rollout_unit: group`, `group_play: free`: each member starts its own agent workflow, whose id names the
    member, and each one's model calls are that member's turns in the group's one workflow."""
    from transformers import AutoTokenizer

    engine = Agentic(AutoTokenizer.from_pretrained(tiny_chat_model))
    store = open_store(StoreConfig(path=tmp_path / "store"))
    workflow_id = f"tagent-group-{uuid.uuid4().hex[:8]}"
    inp = GroupRolloutInput(
        task=task(group_size=2, rollout_unit="group", group_play="free"),
        groups=[GroupSeed(group_id=f"{workflow_id}-g0", seed=0)],
        job_id="tagent-test",
        queue_prefix=queue_prefix,
    )
    async with workers(bare_env.client, queue_prefix, engine, store, tiny_chat_model):
        results = await play_group(bare_env.client, inp, workflow_id)

    assert len({r.trajectory_id for r in results}) == 2, results
    assert all(r.status == "completed" and r.reward == 1.0 and r.turns == 4 for r in results), results
    played = sorted(pair for r in results for pair in trained_on(store, r))
    assert played == sorted(zip(engine.prompts, engine.sampled, strict=True))
    for r in results:
        agent = await bare_env.client.get_workflow_handle(agent_workflow_id(workflow_id, r.trajectory_id)).describe()
        assert agent.status is not None and agent.status.name == "COMPLETED"
