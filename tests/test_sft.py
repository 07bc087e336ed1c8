"""SFT warm start: transcripts as token sequences (loss on replies only), bad lines, a tiny run, the generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart.activities.engines.conversation import ChatTokens
from rollart.activities.envs.tool_calls import CALC_TOOL, question
from rollart.activities.training.sft import batch_indices
from rollart.activities.training.sft_data import (
    Transcript,
    TranscriptError,
    read_transcripts,
    tokenize_transcript,
)
from rollart.activities.training.sft_synthetic import tool_calls_transcripts, transcript_seed
from rollart.contracts.ids import EVAL_SEED_BASE, SFT_SEED_BASE
from rollart.spec.chat import ChatMessage
from rollart.spec.config import JobSpec, TaskSpec, TrainerConfig
from tests.support.cli import rollart


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart.infra.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("sft") / "tiny-chat", chat=True)


@pytest.fixture(scope="module")
def chat(chat_model: Path) -> ChatTokens:
    return ChatTokens(chat_model)


def _call(i: int, expression: str) -> dict:
    args = json.dumps({"expression": expression})
    return {"id": f"c{i}", "type": "function", "function": {"name": "calc", "arguments": args}}


TWO_CALLS = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": question("12+34+5")},
        {"role": "assistant", "content": "", "tool_calls": [_call(0, "12+34")]},
        {"role": "tool", "tool_call_id": "c0", "content": "46"},
        {"role": "assistant", "content": "Then", "tool_calls": [_call(1, "46+5")]},
        {"role": "tool", "tool_call_id": "c1", "content": "51"},
        {"role": "assistant", "content": "51"},
        {"role": "user", "content": "thanks"},  # after the last reply: no loss, left out
    ],
    "tools": [CALC_TOOL],
}


def test_a_transcript_is_the_sequence_generation_builds_with_loss_on_the_replies_only(chat: ChatTokens) -> None:
    t = Transcript.model_validate(TWO_CALLS)
    m = t.messages
    seq = tokenize_transcript(chat, t)
    replies = [chat.reply(m[2]), chat.reply(m[4]), chat.reply(m[6])]
    parts = [
        (chat.opening(m[:2], t.tools), 0),
        (replies[0], 1),
        (chat.continuation([m[3]], after_end_of_turn=True), 0),
        (replies[1], 1),
        (chat.continuation([m[5]], after_end_of_turn=True), 0),
        (replies[2], 1),
    ]
    assert seq.ids == [i for ids, _ in parts for i in ids]
    assert seq.mask == [flag for ids, flag in parts for _ in ids]
    eos = chat.tokenizer.eos_token_id
    assert all(r[-1] == eos and eos not in r[:-1] for r in replies)  # each reply ends with its one <|im_end|>
    tok = chat.tokenizer
    trained = tok.decode([i for i, k in zip(seq.ids, seq.mask, strict=True) if k])
    assert trained == (
        '<tool_call>{"name": "calc", "arguments": {"expression": "12+34"}}</tool_call><|im_end|>'
        'Then\n<tool_call>{"name": "calc", "arguments": {"expression": "46+5"}}</tool_call><|im_end|>'
        "51<|im_end|>"
    )
    # the same text as the template renders the whole conversation (up to the last reply's end-of-turn token)
    whole = tok.apply_chat_template([x.template_dict() for x in m[:7]], tools=t.tools, tokenize=False)
    assert tok.decode(seq.ids) == whole.removesuffix("\n")
    assert "<|im_start|>assistant\n" not in trained and "<tool_response>" not in trained


def test_a_reply_refuses_a_message_that_is_not_the_assistants(chat: ChatTokens) -> None:
    with pytest.raises(ValueError, match="only an assistant message"):
        chat.reply(ChatMessage(role="user", content="hi"))


def _lines(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps(TWO_CALLS)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", r"data.jsonl:2: not JSON"),
        ("[1, 2]", r"data.jsonl:2: expected an object with 'messages', got list"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', r"data.jsonl:2: messages\.0\.role: Input should be"),
        ('{"messages": [{"role": "user", "content": "x"}]}', r"data.jsonl:2: has no assistant message"),
        ('{"messages": [{"role": "assistant", "content": "x"}]}', r"data.jsonl:2: starts with an assistant message"),
        ('{"messages": [{"role": "user", "content": "x"}], "tool": []}', r"data.jsonl:2: tool: Extra inputs"),
        (
            '{"messages": [{"role": "user"}, {"role": "assistant", "tool_calls": [{"function": {"name": "calc", '
            '"arguments": "{1"}}]}]}',
            r"data.jsonl:2: messages\[1\]: tool call 'calc' has arguments that are not JSON text",
        ),
    ],
)
def test_a_bad_line_is_an_error_naming_its_number_and_problem(tmp_path: Path, line: str, says: str) -> None:
    path = _lines(tmp_path, GOOD, line)
    with pytest.raises(TranscriptError, match=says):
        list(read_transcripts(path))


def test_blank_lines_are_skipped_and_an_empty_file_is_an_error(tmp_path: Path) -> None:
    assert len(list(read_transcripts(_lines(tmp_path, "", GOOD, "  ", GOOD)))) == 2
    with pytest.raises(TranscriptError, match="holds no transcripts"):
        list(read_transcripts(_lines(tmp_path, "", "")))
    with pytest.raises(TranscriptError, match="cannot read transcripts"):
        list(read_transcripts(tmp_path / "missing.jsonl"))


def test_batches_cover_each_epoch_once_and_are_a_function_of_the_step() -> None:
    epoch = [i for step in range(5) for i in batch_indices(10, 2, 7, step)]
    assert sorted(epoch) == list(range(10))
    assert batch_indices(10, 4, 7, 2) == batch_indices(10, 4, 7, 2)  # epochs 0 and 1 straddled, same both times
    assert batch_indices(10, 4, 7, 2)[:2] == [epoch[8], epoch[9]]


def test_the_generator_is_deterministic_valid_and_off_the_training_and_eval_seeds(chat: ChatTokens) -> None:
    first = list(tool_calls_transcripts(20, seed=3))
    assert first == list(tool_calls_transcripts(20, seed=3))
    assert first != list(tool_calls_transcripts(20, seed=4))
    for t in first:
        transcript = Transcript.model_validate(t)
        roles = [m.role for m in transcript.messages]
        assert roles == ["user", "assistant", "tool", "assistant"]
        call = transcript.messages[1].tool_calls[0].function
        expression = call.parsed_arguments()["expression"]
        assert transcript.messages[0].content == question(expression)
        assert transcript.messages[2].content == transcript.messages[3].content == str(eval(expression))
        assert sum(tokenize_transcript(chat, transcript).mask) > 0
    assert transcript_seed(0, 0) >= SFT_SEED_BASE and transcript_seed(998, 10**6) < EVAL_SEED_BASE


def _job(chat_model: Path, **trainer: object) -> JobSpec:
    return JobSpec(
        name="sftjob",
        model_dir=chat_model,
        tasks=[TaskSpec(name="tool_calls", env="tool_calls", reward="success")],
        trainer=TrainerConfig(device="cpu", **trainer),
    )


def test_a_short_run_lowers_the_loss_and_writes_a_model_transformers_loads(chat_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollart.client.sft import plan_sft, run_sft
    from rollart.infra.tiny_model import CHAT_TEMPLATE

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in tool_calls_transcripts(8)))
    job = _job(chat_model, lr=3e-3)
    plan = plan_sft(job, data, steps=6, batch_size=4, checkpoint_every=3)
    assert plan.options.steps == 6 and len(plan.sequences) == 8
    done = run_sft(job, plan, tmp_path / "out", tmp_path / "run")
    r = done.result
    assert r.steps_run == 6 and r.resumed_at == 0
    assert r.last_loss is not None and r.first_loss is not None and r.last_loss < r.first_loss * 0.8
    tok = AutoTokenizer.from_pretrained(done.out)
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<|im_end|>"
    assert (done.out / "generation_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(done.out)
    before = load_file(str(chat_model / "model.safetensors"))
    after = load_file(str(done.out / "model.safetensors"))
    assert before.keys() == after.keys()
    assert any(not before[k].equal(after[k]) for k in before)
    assert model.config.vocab_size == len(tok)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000002", "step-000005"]
    # a longer run in the same run dir resumes from its newest checkpoint
    again = run_sft(job, plan_sft(job, data, steps=8, batch_size=4), tmp_path / "out2", tmp_path / "run")
    assert again.result.resumed_at == 6 and again.result.steps_run == 2


def test_the_commands_refuse_bad_input_with_what_to_fix(
    chat_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: j\nmodel_dir: {chat_model}\ntasks: [{{name: t, env: tool_calls, reward: success}}]\n")
    bad = _lines(tmp_path, GOOD, '{"messages": []}')
    ran = rollart(capsys, "sft", str(spec), "--data", str(bad), "--out", str(tmp_path / "o"))
    assert ran.returncode == 2 and "data.jsonl:2:" in ran.stderr
    mega = tmp_path / "mega.yaml"
    mega.write_text(spec.read_text() + "trainer: {backend: megatron, parallel: {tensor: 2}}\n")
    ran = rollart(capsys, "sft", str(mega), "--data", str(_lines(tmp_path, GOOD)), "--out", str(tmp_path / "o"))
    assert ran.returncode == 2 and "megatron backend on one rank" in ran.stderr
    ran = rollart(capsys, "sft-data", "tool_calls", "-n", "0", "--out", str(tmp_path / "d.jsonl"))
    assert ran.returncode == 2 and "-n must be at least 1" in ran.stderr
    ran = rollart(capsys, "sft-data", "tool_calls", "--operators", "/", "--out", str(tmp_path / "d.jsonl"))
    assert ran.returncode == 2 and "operators" in ran.stderr


def test_sft_data_writes_the_same_file_for_the_same_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        assert rollart(capsys, "sft-data", "tool_calls", "-n", "5", "--seed", "2", "--out", str(out)).returncode == 0
    assert a.read_bytes() == b.read_bytes() and len(list(read_transcripts(a))) == 5


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    ran = rollart(capsys, "sft", "--help")
    for flag in (
        "--data",
        "--out",
        "--run-dir",
        "--steps",
        "--epochs",
        "--batch-size",
        "--lr",
        "--seed",
        "--log-every",
        "--checkpoint-every",
    ):
        assert flag in ran.stdout
    assert "-n NUM" in rollart(capsys, "sft-data", "--help").stdout


def test_a_lora_job_writes_its_adapter_merged_into_a_plain_model(chat_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from rollart.client.sft import plan_sft, run_sft, write_synthetic
    from rollart.spec.config import LoraConfig

    data = tmp_path / "data.jsonl"
    write_synthetic("tool_calls", 4, 0, data, {})
    job = _job(chat_model, lr=5e-3, lora=LoraConfig(rank=4, alpha=8))
    done = run_sft(job, plan_sft(job, data, steps=2, batch_size=4), tmp_path / "out", tmp_path / "run")
    assert not (done.out / "adapter_config.json").exists()
    before = load_file(str(chat_model / "model.safetensors"))
    after = load_file(str(done.out / "model.safetensors"))
    assert before.keys() == after.keys() and any(not before[k].equal(after[k]) for k in before)


def test_megatron_on_one_rank_trains_as_the_torch_backend_does(chat_model: Path, tmp_path: Path) -> None:
    import torch.distributed as dist
    from safetensors.torch import load_file

    from rollart.client.sft import plan_sft, run_sft, write_synthetic

    data = tmp_path / "data.jsonl"
    write_synthetic("tool_calls", 4, 0, data, {})
    runs = {}
    for backend in ("torch", "megatron"):
        job = _job(chat_model, lr=3e-3, backend=backend)
        plan = plan_sft(job, data, steps=2, batch_size=4)
        runs[backend] = run_sft(job, plan, tmp_path / backend, tmp_path / f"run-{backend}")
    assert not dist.is_initialized()  # the one-rank group is torn down after the run
    assert runs["megatron"].result.last_loss == pytest.approx(runs["torch"].result.last_loss, rel=1e-4)
    torch_w, mega_w = (load_file(str(runs[b].out / "model.safetensors")) for b in ("torch", "megatron"))
    assert torch_w.keys() == mega_w.keys()
    assert max(float((torch_w[k] - mega_w[k]).abs().max()) for k in torch_w) < 1e-3
