"""Chat envs and native tool calls: the tiny-chat model's template, incremental rendering, vLLM's tool parser, the
`tool_calls` env through the env activities, format 2 turn records, and the job checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.engines.conversation import ChatTokens, ConversationError
from rollart.activities.engines.tool_parsing import ToolParsing, UnknownToolParser
from rollart.activities.env import EnvActivities
from rollart.activities.envs.tool_calls import CALC_TOOL, ToolCalls
from rollart.contracts.activities import GroupResetInput, ResetInput, RestoreInput, StepInput
from rollart.contracts.store import StoredCompletion, StoredTurn, whole_prompt
from rollart.spec.chat import ChatMessage, ToolCall, ToolFunction
from rollart.spec.checks import JobCheckError, check_job_components
from rollart.spec.config import JobSpec
from rollart.spec.env import StepOutcome

ENV = ActivityEnvironment()


@pytest.fixture(scope="module")
def chat(tiny_chat_model: Path) -> ChatTokens:
    return ChatTokens(tiny_chat_model)


def _call(expression: str, call_id: str = "c0") -> ChatMessage:
    arguments = f'{{"expression": "{expression}"}}'
    return ChatMessage(
        role="assistant", tool_calls=[ToolCall(id=call_id, function=ToolFunction(name="calc", arguments=arguments))]
    )


def test_the_tiny_chat_model_renders_tools_calls_and_outputs_in_qwens_format(chat: ChatTokens) -> None:
    messages = [ChatMessage(role="user", content="Compute 2+3."), _call("2+3"), ChatMessage(role="tool", content="5")]
    text = chat.render_all(messages, [CALC_TOOL])
    assert text.startswith('<|im_start|>system\n<tools>{"type": "function", "function": {"name": "calc"')
    assert '<|im_start|>assistant\n<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>' in text
    assert text.endswith("<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n")
    tok = chat.tokenizer
    assert tok.eos_token == "<|im_end|>"
    for marker in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert len(chat.ids(marker)) == 1, marker  # single tokens, as in Qwen's vocabulary


def test_a_turn_continues_after_the_reply_with_or_without_its_end_of_turn(chat: ChatTokens) -> None:
    tool = [ChatMessage(role="tool", content="5")]
    after_eos = chat.tokenizer.decode(chat.continuation(tool, after_end_of_turn=True))
    cut = chat.tokenizer.decode(chat.continuation(tool, after_end_of_turn=False))
    assert after_eos == "\n<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert cut == "<|im_end|>" + after_eos  # a reply cut at max_tokens is closed first


def test_growing_a_conversation_token_by_token_equals_rendering_it_whole(chat: ChatTokens) -> None:
    """When each reply's ids are its canonical rendering, the incremental ids are the full render's ids."""
    user = ChatMessage(role="user", content="Compute 47+85. Use the calc tool.")
    tool, thanks = ChatMessage(role="tool", content="132"), ChatMessage(role="user", content="Thanks.")
    turns = [(_call("47+85"), [tool]), (ChatMessage(role="assistant", content="132"), [thanks])]
    messages, ids = [user], chat.opening([user], [CALC_TOOL])
    for reply, outputs in turns:
        before = chat.render_all(messages, [CALC_TOOL])
        rendered = chat._template([m.template_dict() for m in [*messages, reply]], [CALC_TOOL], False)
        sampled = chat.ids(rendered[len(before) :].removesuffix("\n"))  # the reply as a model writes it
        assert sampled[-1] == chat.tokenizer.eos_token_id
        messages += [reply, *outputs]
        ids += sampled + chat.continuation(outputs, after_end_of_turn=True)
    assert ids == chat.ids(chat.render_all(messages, [CALC_TOOL]))


def test_a_model_without_a_chat_template_is_refused_with_the_fix(tiny_model: Path) -> None:
    with pytest.raises(ConversationError, match=r"no chat template.*init-model --chat"):
        ChatTokens(tiny_model).opening([ChatMessage(role="user", content="hi")])


@pytest.mark.integration  # importing vLLM starts a process
def test_vllms_hermes_parser_reads_calls_and_a_broken_call_is_an_invalid_action(chat: ChatTokens) -> None:
    parsing = ToolParsing("hermes", chat.tokenizer)
    good = parsing.message('<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>', "t0")
    assert good.tool_calls[0].function.name == "calc"
    assert good.tool_calls[0].function.parsed_arguments() == {"expression": "2+3"}
    assert good.tool_calls[0].id == "t0-0" and good.tool_error is None
    broken = parsing.message('<tool_call>{"name": calc</tool_call>')
    assert broken.tool_calls == [] and "does not parse" in (broken.tool_error or "")
    assert broken.content == '<tool_call>{"name": calc</tool_call>'  # the env sees what was written
    plain = parsing.message("The answer is 5")
    assert plain.tool_calls == [] and plain.tool_error is None and plain.content == "The answer is 5"
    with pytest.raises(UnknownToolParser, match=r"no vLLM tool parser named 'hermez'.*hermes"):
        ToolParsing("hermez", chat.tokenizer).message("x")


@pytest.mark.integration  # each calc call runs in a sandboxed child process
def test_tool_calls_env_answers_calls_and_judges_the_final_number() -> None:
    env = ToolCalls()
    [opening] = env.reset(3)
    assert opening.role == "user" and opening.content.startswith("Compute ")
    expression = opening.content.split()[1].rstrip(".")
    step = env.step(_call(expression, "a1"))
    assert not step.done and step.info["tool"] == "calc" and step.info["valid"]
    [output] = step.observation
    assert output.role == "tool" and output.tool_call_id == "a1" and output.content == str(eval(expression))
    assert env.step(ChatMessage(role="assistant", content=f"It is {output.content}.")).info["success"]


def test_tool_calls_env_treats_unparsed_and_unknown_calls_as_invalid_actions() -> None:
    env = ToolCalls(invalid_action="end")
    env.reset(0)
    step = env.step(ChatMessage(role="assistant", content="<tool_call>{", tool_error="does not parse"))
    assert step.done and not step.info["valid"] and "does not parse" in step.observation[0].content
    env = ToolCalls()
    env.reset(0)
    unknown = ChatMessage(role="assistant", tool_calls=[ToolCall(function=ToolFunction(name="python"))])
    step = env.step(unknown)
    assert not step.done and not step.info["valid"] and "no tool named 'python'" in step.observation[0].content


def test_step_outcome_takes_openai_shaped_messages_and_refuses_others() -> None:
    out = StepOutcome(observation=[{"role": "tool", "content": "5"}], reward=0.0, done=False, info={})
    assert out.observation == [ChatMessage(role="tool", content="5")]
    with pytest.raises(TypeError, match=r"StepOutcome.observation\[0\] is not a chat message"):
        StepOutcome(observation=[{"role": "robot"}], reward=0.0, done=False, info={})


@pytest.mark.integration  # calc calls run in a sandboxed child process
async def test_a_chat_env_session_speaks_messages_through_the_env_activities() -> None:
    acts = EnvActivities("w1", queue="cpu@w1")
    handle = await ENV.run(acts.reset, ResetInput(env="tool_calls", seed=3, trajectory_id="t1"))
    assert handle.messages and handle.messages[0].role == "user" and handle.tools == [CALC_TOOL]
    assert handle.observation == "user: " + handle.messages[0].content
    expression = handle.messages[0].content.split()[1].rstrip(".")
    step = await ENV.run(acts.step, StepInput(session_id=handle.session_id, action="x", message=_call(expression)))
    assert step.messages and step.messages[0].role == "tool" and not step.done
    with pytest.raises(ApplicationError, match="chat env, which needs a message"):
        await ENV.run(acts.step, StepInput(session_id=handle.session_id, action="132"))
    # the session moves to another worker: the messages are replayed and it ends where the episode saw it end
    other = EnvActivities("w2", queue="cpu@w2")
    restored = await ENV.run(
        other.restore,
        RestoreInput(
            env="tool_calls",
            seed=3,
            owner_id="t1",
            actions=[["x"]],
            observations=[step.observation],
            messages=[[_call(expression)]],
        ),
    )
    done = await ENV.run(
        other.step,
        StepInput(
            session_id=restored.session_id,
            action="",
            message=ChatMessage(role="assistant", content=step.messages[0].content),
        ),
    )
    assert done.done and done.info["success"]
    with pytest.raises(ApplicationError, match="chat env, which runs one trajectory per member"):
        await ENV.run(acts.reset_group, GroupResetInput(env="tool_calls", seed=0, size=2, group_id="g"))


def _templated(model_dir: Path) -> Path:
    """A model dir as the job check reads it: a tokenizer config and a chat template (no weights)."""
    model_dir.mkdir(exist_ok=True)
    (model_dir / "tokenizer_config.json").write_text("{}")
    (model_dir / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return model_dir


def test_a_chat_task_plays_its_episodes_as_trajectories_or_free_members(tmp_path: Path) -> None:
    task = {"name": "tc", "env": "tool_calls", "reward": "success", "tool_parser": "hermes"}
    in_groups = task | {"rollout_unit": "group"}
    model = {"model_dir": _templated(tmp_path)}
    with pytest.raises(JobCheckError, match=r"tasks.0 \(tc\): env 'tool_calls' is a chat env.*set group_play: free"):
        check_job_components(JobSpec(tasks=[in_groups], **model))
    with pytest.raises(JobCheckError, match="max_turns above 1"):
        check_job_components(JobSpec(tasks=[task | {"max_turns": 1}], **model))
    check_job_components(JobSpec(tasks=[task], **model))
    check_job_components(JobSpec(tasks=[in_groups | {"group_play": "free"}], **model))
    with pytest.raises(JobCheckError, match="batch mode plays groups in lockstep"):
        batch = {"rollout_mode": "batch", "async_bound": 0}
        check_job_components(JobSpec(tasks=[in_groups | {"group_play": "free"}], training=batch, **model))


def test_a_chat_job_holds_4000_episodes_in_flight_as_free_groups_not_as_trajectories(tmp_path: Path) -> None:
    """4,000 episodes in flight as a child workflow each pass the server's 2,000 pending children, and the job
    says so at load; as free groups they are a few hundred group workflows."""
    task = {"name": "tc", "env": "tool_calls", "reward": "success", "tool_parser": "hermes", "group_size": 8}
    training = {"batch_size": 2000, "async_bound": 1}
    with pytest.raises(ValueError, match=r"4,000 episodes of tc in flight.*max_pending_children is 2,000"):
        JobSpec(tasks=[task], training=training)
    free = task | {"rollout_unit": "group", "group_play": "free"}
    job = JobSpec(tasks=[free], training=training, model_dir=_templated(tmp_path))
    check_job_components(job)
    assert job.training.in_flight_limit == 4_000


def test_format_2_records_hold_only_their_turn_and_resolve_to_the_whole_prompt() -> None:
    def turn(prompt: list[int], sampled: list[int], prefix: str | None) -> StoredTurn:
        completion = StoredCompletion(token_ids=sampled, logprobs=[-1.0] * len(sampled))
        return StoredTurn(prompt_ids=prompt, completions=[completion], prefix_key=prefix, format=2 if prefix else 1)

    records = {"t0": turn([1, 2], [3, 4], None), "t1": turn([5], [6], "t0"), "t2": turn([7, 8], [9], "t1")}
    assert whole_prompt(records.__getitem__, records["t2"]) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert StoredTurn.from_bytes(records["t2"].to_bytes()) == records["t2"]
    assert b"prefix_key" not in records["t0"].to_bytes()  # format 1 bytes as earlier versions wrote them
    records["t0"] = turn([1], [2], "t2")  # a loop
    with pytest.raises(ValueError, match="loops"):
        whole_prompt(records.__getitem__, records["t2"])
    with pytest.raises(ValueError, match="format 2 record"):
        StoredTurn(prompt_ids=[1], completions=[], format=2)
