"""Turn records in the store → padded training tensors, split into micro-batches.

`trainer.sequence: turn` (the default): every turn of a trajectory becomes one sequence, the turn's whole
prompt then the sample's completion, with loss only on the completion tokens and the trajectory's advantage on
all of them. A chat turn's record (format 2) holds only the tokens its turn added, so its whole prompt is
resolved along the trajectory, each turn's from the one before it (each record read once).

`trainer.sequence: trajectory`: a chat trajectory (its turns' records chain, each naming the one before it) is
ONE sequence: the first turn's prompt, then every turn's sampled ids (loss tokens) each followed by the next
turn's new ids (the env's messages and the template's tokens: in the sequence, out of the loss). Each sampled
token sees exactly the prefix the engine gave it, so the loss is the per-turn one at a fraction of the
tokens. A trajectory whose turns do not chain (a text env's: every turn a whole prompt) is trained per turn.

Padding is on the right (positions of real tokens are unchanged) and masked out of attention and loss.
With `trainer.packing` (`pack`) the model's input is packed instead (`rl.packing`): one `[1, N]` row of whole
sequences, the loss tensors still these padded ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from pydantic import ValidationError

from rollart.activities.rl.packing import Packed, pack_indices, packed_inputs
from rollart.contracts.activities import SampleRef
from rollart.contracts.store import StoredTurn
from rollart.infra.store.payload import Store, StoreKeyError
from rollart.spec.config import SequenceMode

__all__ = [
    "InvalidSample",
    "MicroBatch",
    "TrainSequence",
    "collate",
    "load_sequences",
    "micro_batch",
    "micro_batch_indices",
    "micro_batches",
    "pack",
]


class InvalidSample(ValueError):
    """A sample that cannot be trained on (missing turn record, malformed record); no retry can fix it."""


@dataclass(frozen=True)
class TrainSequence:
    """One training sequence: prompt then completion tokens, the completion's behaviour logprobs, its advantage.

    `loss_mask` (one 0/1 per completion token; None: all 1) leaves tokens the policy did not sample out of the
    loss: in a whole-trajectory sequence, the env's messages between turns. Every per-completion list
    (`behav_logprobs`, `prox_logprobs`, the mask) is as long as `completion_ids`, 0 where the mask is.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    advantage: float
    prox_logprobs: list[float] | None = None  # the proximal policy's, when a step makes several updates
    task: str = ""  # the sample's task: whose env reads its tokens as actions (`entropy_over: actions`)
    bonus: float = 1.0  # the entropy bonus's weight on its tokens (0: `bonus_on: unsolved` and its group succeeded)
    loss_mask: list[int] | None = None  # 1 on loss tokens of the completion (None: every completion token)

    def __post_init__(self) -> None:
        if len(self.behav_logprobs) != len(self.completion_ids):
            raise ValueError(f"{len(self.completion_ids)} completion tokens but {len(self.behav_logprobs)} logprobs")
        if self.loss_mask is not None and len(self.loss_mask) != len(self.completion_ids):
            raise ValueError(f"{len(self.completion_ids)} completion tokens but a loss mask of {len(self.loss_mask)}")

    @property
    def length(self) -> int:
        """Total tokens (prompt + completion)."""
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def loss_tokens(self) -> int:
        """Tokens the loss is taken on (the batch's normaliser counts these, not the env's tokens in between)."""
        return len(self.completion_ids) if self.loss_mask is None else sum(self.loss_mask)


@dataclass(frozen=True)
class MicroBatch:
    """Padded `[B, T]` tensors of a few sequences (`advantages` is `[B]`).

    With `packed` (`trainer.packing`) the model reads `packed.input_ids` (`[1, N]`, the same sequences end to
    end) instead of `input_ids`, and the backend `unpack`s its per-token values to these `[B, T]` rows."""

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    completion_mask: torch.Tensor  # float, 1 on completion tokens (the loss tokens)
    behav_logprobs: torch.Tensor  # float, the engine's logprob at completion positions, 0 elsewhere
    advantages: torch.Tensor  # float [B]
    prox_logprobs: torch.Tensor | None = None  # float, like behav_logprobs: the proximal policy's (several updates)
    tasks: tuple[str, ...] = ()  # each row's task
    bonus: torch.Tensor | None = None  # float [B]: the entropy bonus's weight per row (None: 1 everywhere)
    packed: Packed | None = None  # the model's packed input (None: it reads the padded `input_ids`)

    @property
    def num_tokens(self) -> int:
        """Loss tokens in this micro-batch."""
        return int(self.completion_mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch on `device` (itself when it is already there)."""
        if self.input_ids.device == device:
            return self
        prox = None if self.prox_logprobs is None else self.prox_logprobs.to(device)
        return MicroBatch(
            *(
                t.to(device)
                for t in (
                    self.input_ids,
                    self.attention_mask,
                    self.completion_mask,
                    self.behav_logprobs,
                    self.advantages,
                )
            ),
            prox,
            self.tasks,
            None if self.bonus is None else self.bonus.to(device),
            None if self.packed is None else self.packed.to(device),
        )

    @property
    def model_ids(self) -> torch.Tensor:
        """The ids the model reads: the packed `[1, N]` row, else the padded `[B, T]` rows."""
        return self.input_ids if self.packed is None else self.packed.input_ids

    def unpacked(self, values: torch.Tensor) -> torch.Tensor:
        """A backend's per-token values of the model's input as `[B, T]` rows: `values` itself when the input
        is padded, else `packed.unpack` (0 at each sequence's first position and past its end)."""
        if self.packed is None:
            return values
        return self.packed.unpack(values, self.input_ids.shape[1])


def _read_turn(store: Store, key: str, sample: SampleRef) -> StoredTurn:
    """The turn record under `key`, or `InvalidSample` naming the key when it is missing or malformed."""
    try:
        return StoredTurn.from_bytes(store.get(key))
    except StoreKeyError as e:
        raise InvalidSample(
            f"turn record {key!r} of trajectory {sample.trajectory_id!r} is not in the store ({e}); "
            "drop that sample or regenerate it"
        ) from e
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'record'}: {err['msg']}" for err in e.errors())
        raise InvalidSample(
            f"turn record {key!r} is malformed ({problems}); it must be a StoredTurn, what generate writes"
        ) from e


def _empty_prompt(key: str) -> InvalidSample:
    return InvalidSample(f"turn record {key!r} has an empty prompt; a sequence needs a prompt token to predict from")


Reader = Callable[[str], StoredTurn]
"""A turn record by key (raising `InvalidSample` naming the key), cached for the whole batch."""


def _completion(record: StoredTurn, key: str, index: int) -> tuple[list[int], list[float]]:
    """(token_ids, logprobs) of completion `index` of a turn record."""
    if not 0 <= index < len(record.completions):
        raise InvalidSample(f"turn record {key!r} has no completion #{index} (it has {len(record.completions)})")
    completion = record.completions[index]
    return completion.token_ids, completion.logprobs


def _continued(read: Reader, key: str) -> list[int]:
    """The ids a later turn's prompt continues from turn `key` with: its first completion's (what the engine kept)."""
    record = read(key)
    if not record.completions:
        raise InvalidSample(f"turn record {key!r} is the prefix of a later turn but has no completion to continue")
    return record.completions[0].token_ids


def _whole_prompt(read: Reader, key: str, prompts: dict[str, list[int]], limit: int = 100_000) -> list[int]:
    """Turn `key`'s whole prompt: a format 1 record's own ids, a format 2 record's resolved through its chain.

    Why a cache (`prompts`, key → whole prompt, filled here): turn k's prompt is turn k−1's plus two short
    parts, so resolving the turns of a trajectory in order costs one step each, never a walk back to the start
    (and a record is read once, whatever number of later turns name it). The walk stops at the first turn
    already resolved; a chain longer than `limit` turns, or one that loops, is an `InvalidSample`.
    """
    pending: list[tuple[str, StoredTurn]] = []
    seen: set[str] = set()
    at = key
    while at not in prompts:
        record = read(at)
        if record.prefix_key is None:
            prompts[at] = list(record.prompt_ids)
            break
        seen.add(at)
        pending.append((at, record))
        if record.prefix_key in seen or len(pending) > limit:
            raise InvalidSample(f"turn record chain through {record.prefix_key!r} loops or passes {limit} turns")
        at = record.prefix_key
    for k, record in reversed(pending):
        assert record.prefix_key is not None
        prompts[k] = prompts[record.prefix_key] + _continued(read, record.prefix_key) + list(record.prompt_ids)
    return prompts[key]


def _chains(records: Sequence[StoredTurn], keys: Sequence[str]) -> bool:
    """Whether a trajectory's turns are one growing token sequence: the first holds the whole opening prompt
    and each later one names the turn before it (a chat trajectory's records; a text env's do not)."""
    return records[0].prefix_key is None and all(r.prefix_key == keys[i - 1] for i, r in enumerate(records) if i > 0)


def _turn_sequences(
    read: Reader, sample: SampleRef, prompts: dict[str, list[int]]
) -> list[tuple[list[int], list[int], list[float], list[int] | None]]:
    """One (prompt, completion, behaviour logprobs, mask) per turn that sampled tokens (aborted ones skipped)."""
    out: list[tuple[list[int], list[int], list[float], list[int] | None]] = []
    for key in sample.turn_keys:
        ids, lps = _completion(read(key), key, sample.completion_index)
        if not ids:
            continue
        prompt = _whole_prompt(read, key, prompts)  # shared with the cache and never changed: not copied
        if not prompt:
            raise _empty_prompt(key)
        out.append((prompt, list(ids), list(lps), None))
    return out


def _trajectory_sequence(read: Reader, sample: SampleRef) -> tuple[list[int], list[int], list[float], list[int] | None]:
    """A chained trajectory as one sequence: the opening prompt, then each turn's sampled ids (mask 1, the
    engine's logprobs) followed by the next turn's new ids (the env's messages and template tokens: mask 0,
    logprob 0). A turn cut at `max_tokens` needs nothing extra: the next turn's new ids begin with the end of
    turn the template writes."""
    keys = sample.turn_keys
    first = read(keys[0])
    if not first.prompt_ids:
        raise _empty_prompt(keys[0])
    ids: list[int] = []
    lps: list[float] = []
    mask: list[int] = []
    for i, key in enumerate(keys):
        if i > 0:
            new = read(key).prompt_ids
            ids += new
            lps += [0.0] * len(new)
            mask += [0] * len(new)
        sampled, logprobs = _completion(read(key), key, sample.completion_index)
        ids += sampled
        lps += logprobs
        mask += [1] * len(sampled)
    return list(first.prompt_ids), ids, lps, mask


def load_sequences(
    store: Store,
    samples: Sequence[SampleRef],
    advantages: Sequence[float],
    bonus: Sequence[float] | None = None,
    *,
    mode: SequenceMode = "turn",
) -> list[TrainSequence]:
    """The `TrainSequence`s of every sample (per `mode`, see the module), each with its sample's advantage.

    `bonus` is each sample's entropy-bonus weight (default 1). Turns that sampled no tokens (an aborted
    generation) have nothing to learn from and are skipped. Records are read once even when several samples of
    an n > 1 group share them, or later turns name them as their prefix. With `mode: trajectory` a sample
    whose turns do not chain (a text env's), or that is not each turn's first completion (an n > 1 group's
    other members: the conversation continued the first), is trained per turn. Raises `InvalidSample` naming
    the key when a record is missing or malformed.
    """
    if len(samples) != len(advantages):
        raise ValueError(f"got {len(samples)} samples but {len(advantages)} advantages")
    records: dict[str, StoredTurn] = {}
    prompts: dict[str, list[int]] = {}
    out: list[TrainSequence] = []
    weights = [1.0] * len(samples) if bonus is None else list(bonus)
    for sample, adv, weight in zip(samples, advantages, weights):

        def read(key: str, sample: SampleRef = sample) -> StoredTurn:
            if key not in records:
                records[key] = _read_turn(store, key, sample)
            return records[key]

        whole = (
            mode == "trajectory"
            and sample.completion_index == 0
            and len(sample.turn_keys) > 1
            and _chains([read(k) for k in sample.turn_keys], sample.turn_keys)
        )
        parts = [_trajectory_sequence(read, sample)] if whole else _turn_sequences(read, sample, prompts)
        for prompt, ids, lps, mask in parts:
            if mask is None or any(mask):
                out.append(
                    TrainSequence(prompt, ids, lps, float(adv), task=sample.task, bonus=float(weight), loss_mask=mask)
                )
    return out


def collate(seqs: Sequence[TrainSequence], pad_id: int = 0) -> MicroBatch:
    """Right-padded tensors of `seqs`; padding is masked, so `pad_id` only has to be a valid token id. The
    completion mask is each sequence's `loss_mask` over its completion (1s without one)."""
    if not seqs:
        raise ValueError("cannot collate an empty list of sequences")
    width = max(s.length for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    completion = torch.zeros((n, width), dtype=torch.float32)
    behav = torch.zeros((n, width), dtype=torch.float32)
    with_prox = all(s.prox_logprobs is not None for s in seqs)
    prox = torch.zeros((n, width), dtype=torch.float32) if with_prox else None
    for i, s in enumerate(seqs):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        input_ids[i, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
        attention[i, : p + c] = 1
        mask = torch.ones(c) if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float32)
        completion[i, p : p + c] = mask
        behav[i, p : p + c] = torch.tensor(s.behav_logprobs, dtype=torch.float32) * mask
        if prox is not None:
            prox[i, p : p + c] = torch.tensor(s.prox_logprobs, dtype=torch.float32) * mask
    advantages = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    bonus = torch.tensor([s.bonus for s in seqs], dtype=torch.float32)
    return MicroBatch(input_ids, attention, completion, behav, advantages, prox, tuple(s.task for s in seqs), bonus)


def micro_batch_indices(seqs: Sequence[TrainSequence], size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Which sequences (indices into `seqs`) each micro-batch holds: at most `size` of them grouped by length
    (little padding), or with `max_tokens` (`trainer.packing`) bins of at most that many tokens (`pack_indices`).

    The order does not matter for the result: the loss is a token-sum normalised by the whole batch's token
    count (or per sequence, which is kept whole)."""
    if max_tokens is not None:
        return pack_indices([s.length for s in seqs], max_tokens)
    if size < 1:
        raise ValueError(f"micro-batch size must be ≥ 1, got {size}")
    ordered = sorted(range(len(seqs)), key=lambda i: seqs[i].length)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def pack(seqs: Sequence[TrainSequence], pad_id: int = 0) -> MicroBatch:
    """`collate(seqs)` whose model input is packed: one `[1, N]` row of the sequences end to end."""
    return replace(collate(seqs, pad_id), packed=packed_inputs([s.prompt_ids + s.completion_ids for s in seqs]))


def micro_batch(seqs: Sequence[TrainSequence], pad_id: int = 0, *, packed: bool = False) -> MicroBatch:
    """One micro-batch of `seqs`: padded (`collate`), or packed (`pack`, `trainer.packing`)."""
    return (pack if packed else collate)(seqs, pad_id)


def micro_batches(
    seqs: Sequence[TrainSequence], size: int, pad_id: int = 0, max_tokens: int | None = None
) -> list[MicroBatch]:
    """The micro-batches of `micro_batch_indices`: padded, or packed with `max_tokens`."""
    packed = max_tokens is not None
    return [
        micro_batch([seqs[i] for i in idx], pad_id, packed=packed)
        for idx in micro_batch_indices(seqs, size, max_tokens)
    ]
