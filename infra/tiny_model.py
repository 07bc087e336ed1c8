"""Build the tiny from-scratch Qwen2 policy that the local stack trains, fully offline.

There is no model hub here, so the default policy is made on the spot: a
random-init `Qwen2ForCausalLM` (~0.56M parameters, float32 safetensors) and a
byte-level BPE tokenizer trained with `tokenizers` on a small built-in corpus
of what our tasks show the model (FrozenLake grids, L/D/R/U moves, numbers
0–99, single-digit sums). The corpus makes grid rows like `SFFF` and the
numbers 10–18 single tokens, which is what lets the policy learn by RL within
minutes on CPUs (see LEARNING-NOTES). The shape suits vLLM's CPU attention
backend (head size 64) as well transformers.

Builds are deterministic for a seed (same weight bytes) and atomic: the model
is written into a temporary directory next to the target and renamed into
place, so a reader never sees half a model and racing builders cannot corrupt
it. `ensure_tiny_model` adds a file lock so only one process builds.

`output_scale` sets the final norm's weight (1 by default), which bounds how far apart the logits can
be: with embedding rows of norm ~0.23 and a hidden state normalised to norm √128, no token's logit can
exceed ~2.6, so the most confident policy gives a token ~4 %. Full fine-tuning grows the embeddings past
that; LoRA, which trains neither the norm nor the (tied) output head, cannot, and never learns a task on
the default model. `tiny-lora` (output scale 4, as a pretrained model's wide logit range) is the one it
learns on (docs/learning.md).
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "FIRST_USE_MODELS",
    "TINY_ARCH",
    "VOCAB_SIZE",
    "build_tiny_model",
    "corpus",
    "ensure_tiny_model",
    "first_use_options",
    "first_use_scale",
]

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
"""End-of-sequence token (also used as padding)."""

VOCAB_SIZE = 400
"""Vocabulary: 256 byte symbols + the eos token + BPE merges + the added numbers 10-99."""

TINY_ARCH: dict[str, int | float | bool | str] = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 64,  # vLLM's CPU attention needs a head size in {32, 64, 80, ..., 256}
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "initializer_range": 0.02,
    "hidden_act": "silu",
}
"""The architecture measured in LEARNING-NOTES (learns FrozenLake in ~1 min on 2 cores)."""

FIRST_USE_MODELS: dict[str, float] = {"tiny": 1.0, "tiny-lora": 4.0, "tiny-chat": 1.0, "tiny-moe": 1.0}
"""The tiny models built where a job names them, under the local stack's models dir (`.rollart/models/NAME`):
their output scales. Any other model dir must hold a model."""

_CHAT_VOCAB_SIZE = 512
"""The chat model's vocabulary: room for its markup and merges of chat text."""

_CHAT_MODELS = frozenset({"tiny-chat"})
"""Which of them are built with a chat template (`build_tiny_model(chat=True)`)."""

_MOE_MODELS = frozenset({"tiny-moe"})
"""Which of them are a Qwen3-MoE (`build_tiny_model(moe=True)`)."""

TINY_MOE_ARCH: dict[str, int | float | bool | list[int]] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,  # 4 experts of 128: the dense model's 512, half of it active per token
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.0,
}
"""The MoE model: `TINY_ARCH` with each MLP a router over 4 SwiGLU experts, top 2 (Qwen3-MoE's layout, which
both trainer backends train and vLLM serves)."""

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Qwen's tool markup, single tokens as in Qwen's vocabulary and kept in decoded text (not special), which vLLM's
`hermes` tool parser requires."""

CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n' }}{%- endif %}"
    "{{- '<tools>' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- set call = tool_call.function or tool_call %}"
    '{{- \'\\n<tool_call>{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- (call.arguments | tojson) + '}</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>' + message.content + '</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML with Qwen's tool format (a compact tools preamble, so the tiny model's prompts stay short): tools as JSON
in `<tools>` in the system message, calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, outputs as
`<tool_response>` blocks in a user turn."""

_CHAT_ARCH = {"max_position_embeddings": 8192}
"""The chat model's context is longer: a 128-turn conversation must fit (`bench turns`)."""

_MODELS_HOME = Path(".rollart") / "models"

_STANDARD_MAP = ("SFFF", "FHFH", "FFFH", "HFFG")
_ACTIONS = "LDRU"
_NUMBER_TOKENS = [str(n) for n in range(10, 100)]


def _render(grid: list[str], agent: int) -> list[str]:
    """Grid rows with `A` at the agent's cell (row-major index)."""
    rows = [list(r) for r in grid]
    size = len(grid)
    rows[agent // size][agent % size] = "A"
    return ["".join(r) for r in rows]


def corpus() -> Iterator[str]:
    """The tokenizer's training text: deterministic, and shaped like our task prompts.

    Mostly the standard FrozenLake map with the agent on every cell, so that
    all its rows (with and without `A`) win merges; then moves, numbers and
    single-digit sums (the numbers 10-99 are added tokens on top).
    """
    rng = random.Random(1234)
    for _ in range(8):
        for agent in range(16):
            rows = _render(list(_STANDARD_MAP), agent)
            yield "\n".join(rows) + f"\nmove: {_ACTIONS[rng.randrange(4)]}\n"
    for _ in range(2):
        for n in range(100):
            yield f"{n} "
        for x in range(10):
            for y in range(10):
                yield f"{x}+{y}={x + y}\n"
    yield "L D R U move: action: answer:\n"


def _chat_corpus() -> Iterator[str]:
    """More training text for the chat model: its markup and the tool calls of the tool tasks, so that they
    take few tokens."""
    rng = random.Random(4321)
    for _ in range(40):
        a, b = rng.randrange(100), rng.randrange(100)
        yield (
            f'{IM_START}system\n<tools>{{"type": "function", "function": {{"name": "calc", '
            f'"parameters": {{"expression": "string"}}}}}}</tools>{IM_END}\n'
            f"{IM_START}user\nWhat is {a}+{b}? Use the calc tool, then answer with the number.{IM_END}\n"
            f'{IM_START}assistant\n<tool_call>{{"name": "calc", "arguments": {{"expression": '
            f'"{a}+{b}"}}}}</tool_call>{IM_END}\n{IM_START}user\n<tool_response>{a + b}</tool_response>{IM_END}\n'
            f"{IM_START}assistant\nThe answer is {a + b}.{IM_END}\n"
        )


def _train_tokenizer(chat: bool = False):  # -> PreTrainedTokenizerFast (imported lazily)
    """A byte-level BPE tokenizer wrapped for transformers and vLLM.

    Its pipeline is exactly the one `Qwen2Tokenizer` rebuilds on load (NFC,
    Qwen's split regex, byte-level without regex): transformers and vLLM load
    a `qwen2` model's tokenizer as `Qwen2Tokenizer`, which keeps only the
    vocab and merges, so any other pipeline would tokenize differently at
    training and at inference. Qwen's regex splits digits apart, so the
    numbers 10-99 are added tokens (matched before splitting) to make them
    single tokens. The full 256-byte alphabet is seeded so any input encodes
    (without it the Rust encoder crashes on an unseen byte); byte-level (not
    WordLevel) because vLLM's streaming detokenizer needs it.

    `chat`: ChatML's markers and Qwen's tool tags are single tokens too, the corpus has chat text, the
    vocabulary is `_CHAT_VOCAB_SIZE`, and `<|im_end|>` ends a turn (the eos token).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    extra = [IM_START, IM_END, *_TOOL_TOKENS] if chat else []
    trainer = trainers.BpeTrainer(
        vocab_size=(_CHAT_VOCAB_SIZE if chat else VOCAB_SIZE) - len(_NUMBER_TOKENS) - len(extra),
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = list(corpus()) + (list(_chat_corpus()) if chat else [])
    tok.train_from_iterator(text, trainer=trainer)
    tok.add_tokens([AddedToken(n, normalized=False, special=False) for n in _NUMBER_TOKENS])
    if chat:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in (IM_START, IM_END)])
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in _TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END if chat else EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=int((_CHAT_ARCH if chat else TINY_ARCH)["max_position_embeddings"]),
        **({"chat_template": CHAT_TEMPLATE} if chat else {}),
    )


def first_use_scale(model_dir: Path) -> float | None:
    """The output scale of the tiny model built on first use at `model_dir`; None for a model dir that is not
    one of `FIRST_USE_MODELS` (it must hold a model: a typo must not train a fresh random one)."""
    model_dir = Path(model_dir)
    if model_dir.parent != _MODELS_HOME:
        return None
    return FIRST_USE_MODELS.get(model_dir.name)


def first_use_options(model_dir: Path) -> dict[str, float | bool] | None:
    """`build_tiny_model`'s options for a first-use model dir (see `first_use_scale`), else None."""
    scale = first_use_scale(model_dir)
    if scale is None:
        return None
    name = Path(model_dir).name
    return {"output_scale": scale, "chat": name in _CHAT_MODELS, "moe": name in _MOE_MODELS}


def _write_model(dst: Path, seed: int, output_scale: float = 1.0, chat: bool = False, moe: bool = False) -> None:
    """Write tokenizer + random-init float32 Qwen2 (or Qwen3-MoE) weights into `dst` (an empty dir)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = _train_tokenizer(chat)
    tokenizer.save_pretrained(dst)
    pad_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    eos_id = tokenizer.eos_token_id
    arch = dict(TINY_ARCH) | (_CHAT_ARCH if chat else {}) | (TINY_MOE_ARCH if moe else {})
    rope_theta = arch.pop("rope_theta")
    config_cls, model_cls = (Qwen3MoeConfig, Qwen3MoeForCausalLM) if moe else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        dtype="float32",
        **arch,
    )
    config.architectures = [model_cls.__name__]
    # Seed a private generator-state: fork_rng keeps the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32).eval()
    if output_scale != 1.0:
        with torch.no_grad():
            model.model.norm.weight.fill_(output_scale)
    model.generation_config.do_sample = True
    model.generation_config.top_k = 0  # full vocabulary, like vLLM (HF's default is 50)
    model.generation_config.top_p = 1.0
    model.generation_config.temperature = 1.0
    if chat:  # a turn ends at <|im_end|>; the end of text still ends generation
        model.generation_config.eos_token_id = [eos_id, pad_id]
        model.generation_config.pad_token_id = pad_id
    model.save_pretrained(dst, safe_serialization=True)


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished `src` to `dst` atomically, replacing an existing `dst`."""
    for _ in range(5):
        try:
            os.rename(src, dst)  # atomic; also replaces an empty dst
            return
        except OSError:
            if not dst.exists():
                raise
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(dst, old)
        except FileNotFoundError:
            continue  # someone else moved it; try again
        shutil.rmtree(old, ignore_errors=True)
    raise RuntimeError(f"could not move the built model into {dst}: another process keeps replacing it")


def build_tiny_model(
    out_dir: Path, *, seed: int = 0, output_scale: float = 1.0, chat: bool = False, moe: bool = False
) -> Path:
    """Build the tiny policy into `out_dir` (replacing what is there) and return `out_dir`.

    Why: the local stack needs a policy without any download; this one is
    small enough to train by RL on CPUs in minutes. Same seed → same bytes,
    so runs are reproducible. The write is atomic (temp dir + rename). `chat`: with a ChatML template in
    Qwen's tool format and its markers as tokens (`CHAT_TEMPLATE`), for chat envs and tool calls. `moe`: a
    Qwen3-MoE of the same size (`TINY_MOE_ARCH`).
    """
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_model(tmp, seed, output_scale, chat, moe)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("built tiny model (seed %d) in %s", seed, out_dir)
    return out_dir


def ensure_tiny_model(
    out_dir: Path, *, seed: int = 0, output_scale: float = 1.0, chat: bool = False, moe: bool = False
) -> Path:
    """Return `out_dir`, building the tiny model there first if it has no `config.json`.

    Why: every worker may start at once on a fresh machine; a file lock next
    to the directory makes exactly one of them build while the others wait,
    then all use the same model.
    """
    out_dir = Path(out_dir).absolute()
    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir.parent / f".{out_dir.name}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (out_dir / "config.json").is_file():
                build_tiny_model(out_dir, seed=seed, output_scale=output_scale, chat=chat, moe=moe)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out_dir
