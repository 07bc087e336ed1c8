"""Observations reach an instruct model through its chat template, and the tiny model as raw text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.engines.chat import PromptFormatError, PromptRenderer
from rollart.activities.engines.factory import create_engine
from rollart.activities.generate import GenerateActivities
from rollart.contracts.generation import GenerateBatchInput, GenerateInput
from rollart.infra.store.payload import LocalStore
from rollart.spec.config import EngineConfig, PromptFormat, SamplingParams, TaskSpec

OBS = "AFFF\nFHFH\nFFFH\nHFFG\nmove:"
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
ENV = ActivityEnvironment()


def with_template(src: Path, dst: Path, *, bos_first: bool = False) -> Path:
    """A copy of the tiny model whose tokenizer has `TEMPLATE` (BOS = <|endoftext|>); `bos_first`: the
    tokenizer also puts BOS before every text it encodes, as Llama's do."""
    shutil.copytree(src, dst)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(chat_template=TEMPLATE, bos_token="<|endoftext|>")
    cfg_path.write_text(json.dumps(cfg))
    if bos_first:
        from tokenizers import Tokenizer
        from tokenizers.processors import TemplateProcessing

        tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
        bos_id = tok.token_to_id("<|endoftext|>")
        tok.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos_id)])
        tok.save(str(dst / "tokenizer.json"))
    return dst


@pytest.fixture(scope="module")
def chat_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_template(tiny_model, tmp_path_factory.mktemp("chat") / "model")


def test_the_tiny_model_keeps_raw_text_and_refuses_always(tiny_model: Path) -> None:
    renderer = PromptRenderer(tiny_model)
    assert not renderer.has_template
    assert renderer.render(OBS, PromptFormat()) == OBS  # auto: no template, raw
    assert renderer.render(OBS, None) == OBS
    with pytest.raises(PromptFormatError, match="no chat template"):
        renderer.render(OBS, PromptFormat(chat="always"))


def test_a_model_with_a_template_gets_a_conversation(chat_model: Path) -> None:
    renderer = PromptRenderer(chat_model)
    assert renderer.render(OBS, PromptFormat()) == f"<|endoftext|><user>{OBS}</user>\n<assistant>"
    with_system = renderer.render(OBS, PromptFormat(chat="always", system="You walk on ice."))
    assert with_system == f"<|endoftext|><system>You walk on ice.</system>\n<user>{OBS}</user>\n<assistant>"
    assert renderer.render(OBS, PromptFormat(chat="never")) == OBS


def test_a_bos_the_tokenizer_adds_itself_is_not_doubled(tiny_model: Path, tmp_path: Path) -> None:
    model = with_template(tiny_model, tmp_path / "bos", bos_first=True)
    text = PromptRenderer(model).render(OBS, PromptFormat())
    assert text == f"<user>{OBS}</user>\n<assistant>"  # the engine's tokenization puts the one BOS back
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model)(text).input_ids
    assert ids.count(ids[0]) == 1 and AutoTokenizer.from_pretrained(model).decode(ids[:1]) == "<|endoftext|>"


def test_system_needs_the_template_and_tasks_default_to_auto() -> None:
    with pytest.raises(ValidationError, match="chat: never"):
        PromptFormat(chat="never", system="hi")
    task = TaskSpec(name="t", env="frozenlake", reward="success")
    assert task.prompt == PromptFormat(chat="auto", system=None)


async def test_generation_prompts_and_stores_the_rendered_text(chat_model: Path, tmp_path: Path) -> None:
    """A real engine: the prompt ids it returns (and the store keeps for training) are the rendered text's."""
    from transformers import AutoTokenizer

    engine = create_engine(chat_model, EngineConfig(kind="hf", max_model_len=128))
    await engine.start()
    try:
        store = LocalStore(tmp_path / "store")
        acts = GenerateActivities(engine, store, "w", chat_model)
        sampling = SamplingParams(max_tokens=2)
        await ENV.run(
            acts.generate,
            GenerateInput(prompt=OBS, sampling=sampling, data_key="t/one", prompt_format=PromptFormat(system="S")),
        )
        await ENV.run(
            acts.generate_batch,
            GenerateBatchInput(
                prompts=[OBS, OBS], sampling=sampling, data_keys=["t/a", "t/b"], prompt_format=PromptFormat()
            ),
        )
        await ENV.run(acts.generate, GenerateInput(prompt=OBS, sampling=sampling, data_key="t/raw"))
    finally:
        await engine.shutdown()
    tok = AutoTokenizer.from_pretrained(chat_model)
    one = store.get_json("t/one")
    assert one["prompt"] == f"<|endoftext|><system>S</system>\n<user>{OBS}</user>\n<assistant>"
    assert one["prompt_ids"] == tok(one["prompt"]).input_ids
    assert (
        store.get_json("t/a")["prompt"]
        == store.get_json("t/b")["prompt"]
        == f"<|endoftext|><user>{OBS}</user>\n<assistant>"
    )
    assert store.get_json("t/raw")["prompt"] == OBS  # no format: raw, as inputs recorded before templates read


async def test_always_on_a_model_without_a_template_is_a_bad_input_not_retried(
    tiny_model: Path, tmp_path: Path
) -> None:
    acts = GenerateActivities(
        create_engine(tiny_model, EngineConfig(kind="hf", max_model_len=128)),
        LocalStore(tmp_path),
        "w",
        tiny_model,
    )
    with pytest.raises(ApplicationError, match="no chat template") as err:
        await ENV.run(
            acts.generate,
            GenerateInput(
                prompt=OBS, sampling=SamplingParams(), data_key="t/x", prompt_format=PromptFormat(chat="always")
            ),
        )
    assert err.value.type == "InvalidInput" and err.value.non_retryable
