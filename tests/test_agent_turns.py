"""The agent endpoint's pure parts: when a request continues the conversation, requests and replies in OpenAI's
shapes, what a program's return value means, and the `agent` task's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.activities.agent_endpoint import EndpointConfig, chat_input, completion_body, stream_chunks
from rollart.activities.agent_program import _last_line_result, as_result
from rollart.contracts.agent import ChatReply, RunAgentResult
from rollart.contracts.conversation import canonical, history_digest, plan_turn
from rollart.spec.chat import ChatMessage, ToolCall, ToolFunction
from rollart.spec.config import TaskSpec
from rollart.spec.config.agent import AgentArgs
from rollart.spec.routing import Unit, unit_of

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def msg(role: str, content: str | None = "", **kw: object) -> ChatMessage:
    return ChatMessage(role=role, content=content, **kw)  # type: ignore[arg-type]


def call(args: str, id_: str = "c1") -> ToolCall:
    return ToolCall(id=id_, function=ToolFunction(name="calc", arguments=args))


def test_a_request_that_repeats_the_history_and_adds_continues_with_the_new_messages() -> None:
    history = [msg("user", "2+3?"), msg("assistant", None, tool_calls=[call('{"expr": "2+3"}')])]
    echoed = [  # the agent's echo: other ids, arguments re-serialised, content "" instead of None, whitespace
        msg("user", " 2+3? "),
        msg("assistant", "", tool_calls=[call('{"expr":"2+3"}', id_="other")]),
        msg("tool", "5", tool_call_id="other"),
    ]
    plan = plan_turn(history, TOOLS, echoed, TOOLS)
    assert plan.continues and plan.messages == [echoed[2]]


@pytest.mark.parametrize(
    ("request_messages", "tools"),
    [
        ([msg("user", "2+4?"), msg("assistant", "5"), msg("user", "sure?")], TOOLS),  # an edited message
        ([msg("user", "2+3?"), msg("assistant", "6"), msg("user", "sure?")], TOOLS),  # an edited reply
        ([msg("user", "2+3?"), msg("assistant", "5"), msg("user", "sure?")], None),  # other tools
        ([msg("user", "2+3?"), msg("assistant", "5")], TOOLS),  # nothing new
        ([msg("user", "sure?")], TOOLS),  # a summarised history
    ],
)
def test_a_request_that_rewrote_history_starts_a_new_segment(
    request_messages: list[ChatMessage], tools: list | None
) -> None:
    history = [msg("user", "2+3?"), msg("assistant", "5")]
    plan = plan_turn(history, TOOLS, request_messages, tools)
    assert not plan.continues and plan.messages == request_messages


def test_the_first_request_starts_a_segment() -> None:
    plan = plan_turn([], None, [msg("user", "hi")], None)
    assert not plan.continues and plan.messages == [msg("user", "hi")]


def test_a_history_digest_is_that_of_the_conversation_as_compared() -> None:
    history = [msg("user", "2+3?"), msg("assistant", None, tool_calls=[call('{"expr": "2+3"}')])]
    echoed = [msg("user", "2+3? "), msg("assistant", "", tool_calls=[call('{"expr":"2+3"}', id_="x")])]
    assert history_digest(history, TOOLS) == history_digest(echoed, TOOLS)
    assert history_digest(history, TOOLS) != history_digest(history, None)
    assert history_digest(history, TOOLS) != history_digest([*history, msg("tool", "5")], TOOLS)
    assert history_digest(history, TOOLS) != history_digest(history[::-1], TOOLS)


def test_tool_call_arguments_compare_as_json_values() -> None:
    a = msg("assistant", None, tool_calls=[call('{"a": 1, "b": [1, 2]}')])
    b = msg("assistant", "", tool_calls=[call('{"b":[1,2],"a":1}', id_="x")])
    assert canonical(a) == canonical(b)
    assert canonical(a) != canonical(msg("assistant", None, tool_calls=[call('{"a": 2, "b": [1, 2]}')]))


def test_openai_requests_become_chat_inputs() -> None:
    inp = chat_input(
        {
            "model": "m",
            "temperature": 0.2,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "3?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "5"},
            ],
            "tools": TOOLS,
        }
    )
    assert [m.role for m in inp.messages] == ["system", "user", "assistant", "tool"]
    assert inp.messages[1].content == "2+3?" and inp.messages[2].tool_calls[0].function.name == "calc"
    assert inp.tools == TOOLS
    for bad in [{}, {"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]}, {"messages": ["x"]}]:
        with pytest.raises(ValueError):
            chat_input(bad)


def test_replies_in_openai_shapes() -> None:
    reply = ChatReply(
        content=None,
        tool_calls=[call('{"expr": "2+3"}')],
        finish_reason="tool_calls",
        prompt_tokens=7,
        completion_tokens=3,
        policy_version=2,
        turn=1,
    )
    body = completion_body(reply, "m", "id")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "calc"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert body["system_fingerprint"] == "rollart-v2"
    [chunk] = stream_chunks(reply, "m", "id")
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["delta"]["tool_calls"][0]["index"] == 0


def test_what_a_program_returns() -> None:
    class Result:
        value, success = 0.5, True

    assert as_result(None) == RunAgentResult()
    assert as_result(1) == RunAgentResult(reward=1.0)
    assert as_result({"value": 0.0, "success": False}) == RunAgentResult(reward=0.0, success=False)
    assert as_result({"reward": 2}) == RunAgentResult(reward=2.0)
    assert as_result(Result()) == RunAgentResult(reward=0.5, success=True)
    for bad in ["1", True, [1], {"success": True}]:
        with pytest.raises(Exception, match="returns its reward"):
            as_result(bad)
    assert _last_line_result("log\n1.0\n\n") == RunAgentResult(reward=1.0)
    assert _last_line_result("log\ndone\n") == RunAgentResult()


def test_agent_tasks_and_their_args() -> None:
    task = TaskSpec(name="a", env="agent", reward="success", env_args={"entry": "m:run"})
    assert task.is_agent and unit_of(task) is Unit.TRAJECTORY and unit_of(task, "batch") is Unit.TRAJECTORY
    assert unit_of(task.model_copy(update={"max_turns": 1})) is Unit.TRAJECTORY
    with pytest.raises(ValueError, match="cannot play in lockstep: set group_play: free"):
        TaskSpec(name="a", env="agent", reward="success", rollout_unit="group")
    free = TaskSpec(name="a", env="agent", reward="success", rollout_unit="group", group_play="free")
    assert unit_of(free) is Unit.GROUP and unit_of(free, "batch") is Unit.GROUP  # never in lockstep
    with pytest.raises(ValueError, match="exactly one of"):
        AgentArgs()
    with pytest.raises(ValueError, match="exactly one of"):
        AgentArgs(entry="m:run", command=["x"])
    with pytest.raises(ValueError, match="module:function"):
        AgentArgs(entry="m.run")
    assert AgentArgs(command=["python", "a.py"]).timeout_s == 300


def test_endpoint_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLART_AGENT_HOST", "0.0.0.0")
    monkeypatch.setenv("ROLLART_AGENT_PORT", "8765")
    monkeypatch.setenv("ROLLART_AGENT_ADVERTISE", "node-3")
    assert EndpointConfig.from_env() == EndpointConfig(host="0.0.0.0", port=8765, advertise="node-3")


def test_eval_refuses_an_agent_task_saying_what_plays_it() -> None:
    import asyncio

    from rollart.client.evaluate import evaluate
    from rollart.spec.config import load_job
    from tests.support.paths import REPO

    job = load_job(REPO / "examples" / "agent_program.yaml")
    with pytest.raises(ValueError, match="rollart rollout"):
        asyncio.run(evaluate(job, job.tasks[0], None, None, 1))


def test_a_job_checks_an_agent_tasks_args_as_such(tmp_path: Path) -> None:
    from rollart.spec.checks import JobCheckError, check_job_components
    from rollart.spec.config import JobSpec

    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")  # an agent program's model needs one

    def job(env_args: dict) -> JobSpec:
        task = TaskSpec(name="a", env="agent", reward="success", env_args=env_args)
        return JobSpec(name="j", tasks=[task], model_dir=tmp_path)

    check_job_components(job({"command": ["python", "agent.py"]}))  # no env class is looked up
    with pytest.raises(JobCheckError, match=r"tasks.0 \(a\): env_args: .*exactly one of"):
        check_job_components(job({"entry": "m:run", "command": ["x"]}))
