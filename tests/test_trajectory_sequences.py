"""`trainer.sequence: turn | trajectory`: what the trainer trains on is what the engine sampled, plus the env's tokens.

Records → sequences on hand-made records (chains, the per-turn fallback, missing records, masks, n > 1 groups,
reads), then the issue's key check for real: the tiny chat model on an `HfEngine` plays 8 chat turns through
`GenerateActivities._sample_chat` into a `LocalStore`, and in both modes the ids `load_sequences` gives the
trainer are exactly those the engine was given and sampled, the behaviour logprobs the engine's; the torch
policy's log-probs of the loss tokens (and the step's loss) agree between the modes; and the megatron backend
(one rank) takes a trajectory-mode batch to the same log-probs and loss.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rollart.activities.engines.base import EngineOutput
from rollart.activities.rl.batch import InvalidSample, TrainSequence, collate, load_sequences
from rollart.activities.rl.losses import policy_loss
from rollart.contracts.activities import SampleRef, turn_key
from rollart.contracts.generation import GenerateInput
from rollart.contracts.store import StoredCompletion, StoredTurn
from rollart.infra.store.payload import LocalStore, Store
from rollart.spec.chat import ChatMessage
from rollart.spec.config import LossConfig, SamplingParams, TrainerConfig

JOB = "job"

# --- records → sequences, by hand ----------------------------------------------------------------------------


def record(prompt: list[int], *completions: list[int], prefix: str | None = None) -> bytes:
    """A turn record: `prompt` (a format 2 record's new ids when `prefix` is given), completions with logprobs
    −(token id)/100 so every token's logprob says which token it belongs to."""
    return StoredTurn(
        prompt_ids=prompt,
        completions=[StoredCompletion(token_ids=c, logprobs=[-t / 100 for t in c]) for c in completions],
        prefix_key=prefix,
        format=2 if prefix else 1,
    ).to_bytes()


def sample(keys: list[str], index: int = 0, reward: float = 1.0, tid: str = "t") -> SampleRef:
    return SampleRef(
        trajectory_id=tid,
        task="chat",
        group_id="g",
        reward=reward,
        success=reward > 0,
        turn_keys=keys,
        policy_version_min=0,
        policy_version_max=0,
        completion_index=index,
    )


class CountingStore(LocalStore):
    """A local store that counts reads per key (each record must be read once per batch)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: dict[str, int] = {}

    def get(self, key: str) -> bytes:
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().get(key)


def chain(store: Store, tid: str, turns: int) -> list[str]:
    """A chat trajectory of `turns` turns: opening [1, 2, 3]; turn k samples [10k+1, 10k+2], the env adds [500+k]."""
    keys = [turn_key(JOB, tid, k) for k in range(turns)]
    for k, key in enumerate(keys):
        sampled = [10 * k + 1, 10 * k + 2]
        store.put(key, record([1, 2, 3], sampled) if k == 0 else record([500 + k], sampled, prefix=keys[k - 1]))
    return keys


def test_a_chain_is_one_sequence_in_trajectory_mode_and_its_turns_resolved_in_turn_mode(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    keys = chain(store, "a", 3)
    (whole,) = load_sequences(store, [sample(keys)], [0.5], mode="trajectory")
    assert whole.prompt_ids == [1, 2, 3]
    assert whole.completion_ids == [1, 2, 501, 11, 12, 502, 21, 22]
    assert whole.loss_mask == [1, 1, 0, 1, 1, 0, 1, 1]
    assert whole.behav_logprobs == [-0.01, -0.02, 0.0, -0.11, -0.12, 0.0, -0.21, -0.22]
    assert whole.loss_tokens == 6 and whole.advantage == 0.5
    turns = load_sequences(store, [sample(keys)], [0.5], mode="turn")
    assert [(s.prompt_ids, s.completion_ids, s.loss_mask) for s in turns] == [
        ([1, 2, 3], [1, 2], None),
        ([1, 2, 3, 1, 2, 501], [11, 12], None),
        ([1, 2, 3, 1, 2, 501, 11, 12, 502], [21, 22], None),
    ]
    assert load_sequences(store, [sample(keys)], [0.5]) == turns  # turn is the default


def test_collate_masks_the_envs_tokens_out_of_the_loss_and_keeps_logprobs_aligned(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    keys = chain(store, "a", 3)
    (whole,) = load_sequences(store, [sample(keys)], [1.0], mode="trajectory")
    short = TrainSequence([7], [8, 9], [-0.5, -0.6], 1.0)  # a text turn alongside: no mask, all ones
    prox = [0.1 * (i + 1) for i in range(len(whole.completion_ids))]
    mb = collate([replace(whole, prox_logprobs=prox), short])
    assert mb.completion_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 1, 1, 0, 1, 1]
    assert mb.behav_logprobs[0, 3:].tolist() == pytest.approx([-0.01, -0.02, 0, -0.11, -0.12, 0, -0.21, -0.22])
    assert mb.completion_mask[1].tolist() == [0, 1, 1] + [0] * 8
    assert mb.num_tokens == 8
    assert mb.prox_logprobs is None  # only one of them carries proximal logprobs
    mb = collate([replace(whole, prox_logprobs=prox)])
    assert mb.prox_logprobs is not None
    assert mb.prox_logprobs[0, 3:].tolist() == pytest.approx([0.1, 0.2, 0, 0.4, 0.5, 0, 0.7, 0.8])


def test_a_sequences_lists_must_match_its_completion() -> None:
    with pytest.raises(ValueError, match="2 completion tokens but 1 logprobs"):
        TrainSequence([1], [2, 3], [0.0], 1.0)
    with pytest.raises(ValueError, match="but a loss mask of 1"):
        TrainSequence([1], [2, 3], [0.0, 0.0], 1.0, loss_mask=[1])


def test_turns_that_do_not_chain_fall_back_to_one_sequence_per_turn(tmp_path: Path) -> None:
    """A text env's turns (each a whole prompt, format 1), and an n > 1 group's members, train per turn."""
    store = LocalStore(tmp_path)
    text = [turn_key(JOB, "text", k) for k in range(3)]
    for k, key in enumerate(text):
        store.put(key, record([1, 2, k], [10 + k, 11 + k], [20 + k]))
    group = [sample(text, index=i, tid=f"text-{i}") for i in range(2)]
    for mode in ("turn", "trajectory"):
        seqs = load_sequences(store, group, [1.0, -1.0], mode=mode)
        assert [(s.prompt_ids, s.completion_ids, s.advantage) for s in seqs] == [
            ([1, 2, 0], [10, 11], 1.0),
            ([1, 2, 1], [11, 12], 1.0),
            ([1, 2, 2], [12, 13], 1.0),
            ([1, 2, 0], [20], -1.0),
            ([1, 2, 1], [21], -1.0),
            ([1, 2, 2], [22], -1.0),
        ]
        assert all(s.loss_mask is None for s in seqs)
    keys = chain(store, "b", 3)  # a chain whose sample lists only its last turns does not start the conversation
    assert len(load_sequences(store, [sample(keys[1:])], [1.0], mode="trajectory")) == 2


def test_each_record_is_read_once_and_each_whole_prompt_resolved_from_the_one_before(tmp_path: Path) -> None:
    """Resolving turn k's prompt must not re-read the chain: 40 turns in turn mode read 40 records, not 40²/2."""
    store = CountingStore(tmp_path)
    keys = chain(store, "long", 40)
    for mode in ("turn", "trajectory"):
        store.reads.clear()
        seqs = load_sequences(store, [sample(keys), sample(keys, reward=0.0)], [1.0, -1.0], mode=mode)
        assert store.reads == dict.fromkeys(keys, 1)
        assert len(seqs) == (80 if mode == "turn" else 2)
    last = load_sequences(store, [sample(keys)], [1.0])[-1]
    assert len(last.prompt_ids) == 3 + 39 * 3  # the opening, then each earlier turn's 2 sampled + 1 env token


def test_a_missing_record_is_named_in_both_modes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    keys = chain(store, "a", 3)
    store.delete(keys[1])
    for mode in ("turn", "trajectory"):
        with pytest.raises(InvalidSample, match=f"turn record {keys[1]!r} of trajectory 't' is not in the store"):
            load_sequences(store, [sample(keys)], [1.0], mode=mode)
    # a prefix the sample does not list is read (and named) all the same
    with pytest.raises(InvalidSample, match=f"{keys[1]!r}"):
        load_sequences(store, [sample(keys[2:])], [1.0])


def test_a_chain_that_loops_is_an_invalid_sample_not_a_hang(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, b = turn_key(JOB, "loop", 0), turn_key(JOB, "loop", 1)
    store.put(a, record([1], [2], prefix=b))
    store.put(b, record([3], [4], prefix=a))
    with pytest.raises(InvalidSample, match="loops"):
        load_sequences(store, [sample([a, b])], [1.0], mode="trajectory")


def test_a_turn_that_sampled_nothing_is_skipped_in_both_modes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    keys = chain(store, "a", 2)
    last = turn_key(JOB, "a", 2)
    store.put(last, record([502], [], prefix=keys[1]))
    (whole,) = load_sequences(store, [sample([*keys, last])], [1.0], mode="trajectory")
    assert whole.completion_ids == [1, 2, 501, 11, 12, 502] and whole.loss_mask == [1, 1, 0, 1, 1, 0]
    assert len(load_sequences(store, [sample([*keys, last])], [1.0], mode="turn")) == 2


def test_the_config_takes_turn_or_trajectory() -> None:
    assert TrainerConfig().sequence == "turn"
    assert TrainerConfig(sequence="trajectory", backend="megatron").sequence == "trajectory"
    assert TrainerConfig(sequence="trajectory", loss=LossConfig(entropy_over="actions")).sequence == "trajectory"
    with pytest.raises(ValidationError, match="sequence\n  Input should be 'turn' or 'trajectory'"):
        TrainerConfig(sequence="episode")


# --- 8 real chat turns -----------------------------------------------------------------------------------------

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
TURNS = 8
END_BIAS = 4.5
"""Added to the end-of-turn logit of the engine's (random) model, so that some of 8-token turns end by eos."""


def new_messages(k: int) -> list[ChatMessage]:
    """What turn k sends the model: the opening, then alternately a tool's output and a user's reply."""
    if k == 0:
        return [ChatMessage(role="system", content="You add."), ChatMessage(role="user", content="What is 2+3?")]
    if k % 2:
        return [ChatMessage(role="tool", content=str(k), tool_call_id=f"call-{k}", name="calc")]
    return [ChatMessage(role="user", content=f"and {k}+{k}?")]


@dataclass
class Conversation:
    """What the engine was given and returned at each turn of one trajectory, and its sample."""

    keys: list[str]
    given: list[list[int]] = field(default_factory=list)  # the whole prompt of each turn, as the engine got it
    outputs: list[EngineOutput] = field(default_factory=list)

    @property
    def sampled(self) -> list[list[int]]:
        return [o.completions[0].token_ids for o in self.outputs]

    @property
    def logprobs(self) -> list[list[float]]:
        return [o.completions[0].logprobs for o in self.outputs]


@dataclass
class Played:
    model: Path
    store: LocalStore
    conversations: list[Conversation]
    continuations: list[list[list[int]]]  # per conversation, turn k ≥ 1's new ids as rendered independently
    eos_id: int

    def samples(self) -> list[SampleRef]:
        """One sample per conversation, in one group: rewards 1 and 0."""
        return [sample(c.keys, reward=1.0 - i, tid=f"t{i}") for i, c in enumerate(self.conversations)]


async def play(model: Path, store: LocalStore, turns: list[int]) -> tuple[list[Conversation], int]:
    """Play conversations of `turns[i]` turns through `GenerateActivities._sample_chat` on a real HF engine."""
    from rollart.activities.engines.hf_engine import HfEngine
    from rollart.activities.generate import GenerateActivities

    engine = HfEngine(model, max_model_len=1024, seed=0)
    await engine.start()
    eos = engine._tok.eos_token_id
    bias = torch.zeros(len(engine._tok))
    bias[eos] = END_BIAS
    engine._model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias)
    acts = GenerateActivities(engine, store, "w", model)
    conversations: list[Conversation] = []
    current: list[Conversation] = []
    real = engine.generate

    async def recording(
        prompt: str | list[int], sampling: SamplingParams, request_id: str, priority: int = 0
    ) -> EngineOutput:
        out = await real(prompt, sampling, request_id, priority)
        assert isinstance(prompt, list)
        current[0].given.append(list(prompt))
        current[0].outputs.append(out)
        return out

    engine.generate = recording  # type: ignore[method-assign]
    try:
        for i, n in enumerate(turns):
            conv = Conversation([turn_key(JOB, f"t{i}", k) for k in range(n)])
            current[:] = [conv]
            for k in range(n):
                inp = GenerateInput(
                    prompt="",
                    sampling=SamplingParams(max_tokens=8, temperature=1.0),
                    data_key=conv.keys[k],
                    messages=new_messages(k),
                    tools=[CALC] if k == 0 else None,
                    prefix_key=conv.keys[k - 1] if k else None,
                )
                await acts._sample_chat(inp, f"r-{i}-{k}")
            conversations.append(conv)
    finally:
        await engine.shutdown()
    return conversations, eos


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    from rollart.activities.engines.conversation import ChatTokens
    from rollart.infra.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("trajectory")
    model = build_tiny_model(root / "chat-model", chat=True)
    store = LocalStore(root / "store")
    conversations, eos = asyncio.run(play(model, store, [TURNS, 3]))
    chat = ChatTokens(model)  # the env's tokens rendered here, apart from the generation worker
    continuations = [
        [[], *(chat.continuation(new_messages(k), c.sampled[k - 1][-1:] == [eos]) for k in range(1, len(c.keys)))]
        for c in conversations
    ]
    return Played(model, store, conversations, continuations, eos)


def test_the_engine_got_one_growing_sequence_and_turns_ended_both_ways(played: Played) -> None:
    conv, cont = played.conversations[0], played.continuations[0]
    for k in range(1, TURNS):
        assert conv.given[k] == conv.given[k - 1] + conv.sampled[k - 1] + cont[k]
    ends = [s[-1] == played.eos_id for s in conv.sampled]
    assert any(ends) and not all(ends), f"turns ending by eos: {ends}"  # the cut ones got the template's close
    assert all(len(s) == 8 for s, eos in zip(conv.sampled, ends, strict=True) if not eos)  # cut at max_tokens


def test_across_8_turns_the_trainer_trains_on_what_the_engine_sampled_plus_the_envs_tokens(played: Played) -> None:
    """The issue's check, in both `trainer.sequence` modes."""
    conv, cont = played.conversations[0], played.continuations[0]
    one = sample(conv.keys)
    (whole,) = load_sequences(played.store, [one], [1.0], mode="trajectory")
    expected = list(conv.given[0])
    mask: list[int] = []
    behav: list[float] = []
    for k in range(TURNS):
        if k:
            expected += cont[k]
            mask += [0] * len(cont[k])
            behav += [0.0] * len(cont[k])
        expected += conv.sampled[k]
        mask += [1] * len(conv.sampled[k])
        behav += conv.logprobs[k]
    assert whole.prompt_ids == conv.given[0]
    assert whole.prompt_ids + whole.completion_ids == expected == conv.given[-1] + conv.sampled[-1]
    assert whole.loss_mask == mask
    trained = [t for t, m in zip(whole.completion_ids, whole.loss_mask, strict=True) if m]
    assert trained == [t for s in conv.sampled for t in s]
    assert whole.behav_logprobs == behav  # the engine's, exactly, and 0 on the env's tokens

    turns = load_sequences(played.store, [one], [1.0], mode="turn")
    assert [s.prompt_ids for s in turns] == conv.given  # the exact prefix the engine was given
    assert [s.completion_ids for s in turns] == conv.sampled
    assert [s.behav_logprobs for s in turns] == conv.logprobs


def loss_token_logprobs(policy, seqs: list[TrainSequence]) -> torch.Tensor:
    """The policy's log-probs of every loss token of `seqs`, in order."""
    mb = collate(seqs, policy.pad_id)
    with torch.no_grad():
        logp, _ = policy.logprobs(mb, entropy_grad=False)
    return logp[mb.completion_mask.bool()]


def token_mean_loss(policy, seqs: list[TrainSequence]) -> float:
    mb = collate(seqs, policy.pad_id)
    with torch.no_grad():
        logp, _ = policy.logprobs(mb, entropy_grad=False)
    total = sum(s.loss_tokens for s in seqs)
    terms = policy_loss(logp, mb.behav_logprobs, mb.advantages, mb.completion_mask, LossConfig(), total_tokens=total)
    return terms.metrics["loss"]


def test_trajectory_and_turn_sequences_give_the_same_loss_token_logprobs(played: Played) -> None:
    from rollart.activities.training.torch_policy import TorchPolicy

    policy = TorchPolicy(played.model, TrainerConfig(), torch.device("cpu"))
    policy.model.eval()
    samples = played.samples()
    per_trajectory = load_sequences(played.store, samples, [1.0, -1.0], mode="trajectory")
    per_turn = load_sequences(played.store, samples, [1.0, -1.0], mode="turn")
    assert len(per_trajectory) == 2 and len(per_turn) == TURNS + 3
    a, b = loss_token_logprobs(policy, per_trajectory), loss_token_logprobs(policy, per_turn)
    assert a.shape == b.shape == (sum(len(s) for c in played.conversations for s in c.sampled),)
    diff = float((a - b).abs().max())
    assert diff < 1e-5, diff
    assert token_mean_loss(policy, per_trajectory) == pytest.approx(token_mean_loss(policy, per_turn), abs=1e-6)


def test_entropy_over_actions_reads_the_same_tokens_in_either_mode(played: Played) -> None:
    """Why `entropy_over: actions` needs no refusal with `sequence: trajectory`: the action entropy is taken at
    every position and the loss mask picks the sampled tokens, so the env's tokens in between count for nothing."""
    from rollart.activities.rl.action_entropy import ActionSpace, ActionTerm
    from rollart.activities.training.torch_policy import TorchPolicy

    policy = TorchPolicy(played.model, TrainerConfig(), torch.device("cpu"))
    policy.model.eval()
    term = ActionTerm({"chat": ActionSpace(("a", "b", "c"), torch.arange(policy.model.config.vocab_size) % 4)})

    def entropies(mode: str) -> torch.Tensor:
        mb = collate(load_sequences(played.store, played.samples(), [1.0, -1.0], mode=mode), policy.pad_id)
        with torch.no_grad():
            _, entropy = policy.logprobs(mb, entropy_grad=False, actions=term)
        return entropy[mb.completion_mask.bool()]

    a, b = entropies("trajectory"), entropies("turn")
    assert a.shape == b.shape and float((a - b).abs().max()) < 1e-5


async def test_a_train_step_in_either_mode_makes_the_same_update(played: Played, tmp_path: Path) -> None:
    """`trainer.sequence` reaches `load_sequences` through the step: the same loss tokens, loss and gradient
    from 2 sequences as from 11."""
    from temporalio.testing import ActivityEnvironment

    from rollart.activities.trainer import TrainerActivities
    from rollart.contracts.activities import TrainStepInput

    metrics = {}
    for mode in ("turn", "trajectory"):
        inp = TrainStepInput(
            job_id=f"{JOB}-{mode}",
            step=0,
            samples=played.samples(),
            model_dir=str(played.model),
            run_dir=str(tmp_path / mode),
            trainer=TrainerConfig(sequence=mode, micro_batch_size=4),
        )
        metrics[mode] = (await ActivityEnvironment().run(TrainerActivities(played.store).train_step, inp)).metrics
    turn, whole = metrics["turn"], metrics["trajectory"]
    tokens = sum(len(s) for c in played.conversations for s in c.sampled)
    assert (whole["sequences"], turn["sequences"]) == (2, TURNS + 3)
    assert whole["tokens"] == turn["tokens"] == tokens
    assert whole["loss"] == pytest.approx(turn["loss"], abs=1e-6)
    assert whole["grad_norm"] == pytest.approx(turn["grad_norm"], rel=1e-5)


def test_proximal_logprobs_of_a_trajectory_sequence_are_its_turns(played: Played) -> None:
    """Several updates per step: the proximal log-probs, over the whole completion, line up with the mask."""
    from rollart.activities.training.torch_policy import TorchPolicy
    from rollart.activities.training.updates import with_proximal_logprobs

    policy = TorchPolicy(played.model, TrainerConfig(), torch.device("cpu"))
    policy.model.eval()
    samples = played.samples()
    whole = with_proximal_logprobs(policy, load_sequences(played.store, samples, [1.0, -1.0], mode="trajectory"), 4)
    turns = with_proximal_logprobs(policy, load_sequences(played.store, samples, [1.0, -1.0]), 4)
    a = [p for s in whole for p, m in zip(s.prox_logprobs or [], s.loss_mask or [], strict=True) if m]
    b = [p for s in turns for p in s.prox_logprobs or []]
    assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    mb = collate(whole)
    assert mb.prox_logprobs is not None and bool((mb.prox_logprobs[mb.completion_mask == 0] == 0).all())


def megatron_against_torch(model_dir: str, whole: list[TrainSequence], turns: list[TrainSequence]) -> dict:
    """On a rank: the megatron backend's loss-token log-probs and loss on the trajectory-mode batch, against the
    torch backend's on the turn-mode batch (same weights)."""
    from rollart.activities.training.megatron.policy import MegatronPolicy
    from rollart.activities.training.torch_policy import TorchPolicy
    from rollart.activities.training.updates import accumulate_gradients

    cpu = torch.device("cpu")
    cfg = TrainerConfig(backend="megatron", micro_batch_size=4, sequence="trajectory")
    meg, ref = (
        MegatronPolicy(model_dir, cfg, cpu),
        TorchPolicy(model_dir, cfg.model_copy(update={"backend": "torch"}), cpu),
    )
    total = sum(s.loss_tokens for s in whole)
    loss_m = accumulate_gradients(meg, whole, total, cfg, len(whole))["loss"]
    loss_t = accumulate_gradients(ref, turns, total, cfg, len(turns))["loss"]
    return {
        "logprob": float((loss_token_logprobs(meg, whole) - loss_token_logprobs(ref, turns)).abs().max()),
        "loss": abs(loss_m - loss_t),
    }


@pytest.mark.integration
def test_the_megatron_backend_trains_a_trajectory_mode_batch(played: Played) -> None:
    from tests.support.gloo import run_on_ranks

    samples = played.samples()
    whole = load_sequences(played.store, samples, [1.0, -1.0], mode="trajectory")
    turns = load_sequences(played.store, samples, [1.0, -1.0], mode="turn")
    (diffs,) = run_on_ranks(megatron_against_torch, 1, 1, str(played.model), whole, turns)
    assert diffs["logprob"] < 1e-4 and diffs["loss"] < 1e-5, diffs
