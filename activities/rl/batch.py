"""Turn records in the store → padded training tensors, split into micro-batches.

Every turn of a trajectory becomes one sequence, `prompt_ids + token_ids` of
the sample's completion, with loss only on the completion tokens and the
trajectory's advantage on all of them. Padding is on the right (positions of
real tokens are unchanged) and masked out of attention and loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import ValidationError

from rollart.contracts.activities import SampleRef
from rollart.contracts.store import StoredTurn
from rollart.infra.store.payload import Store, StoreKeyError

__all__ = [
    "InvalidSample",
    "MicroBatch",
    "TrainSequence",
    "collate",
    "load_sequences",
    "micro_batches",
]


class InvalidSample(ValueError):
    """A sample that cannot be trained on (missing turn record, malformed record); no retry can fix it."""


@dataclass(frozen=True)
class TrainSequence:
    """One training sequence: prompt then completion tokens, the completion's behaviour logprobs, its advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    advantage: float
    prox_logprobs: list[float] | None = None  # the proximal policy's, when a step makes several updates
    task: str = ""  # the sample's task: whose env reads its tokens as actions (`entropy_over: actions`)
    bonus: float = 1.0  # the entropy bonus's weight on its tokens (0: `bonus_on: unsolved` and its group succeeded)

    @property
    def length(self) -> int:
        """Total tokens (prompt + completion)."""
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass(frozen=True)
class MicroBatch:
    """Padded `[B, T]` tensors of a few sequences (`advantages` is `[B]`)."""

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    completion_mask: torch.Tensor  # float, 1 on completion tokens (the loss tokens)
    behav_logprobs: torch.Tensor  # float, the engine's logprob at completion positions, 0 elsewhere
    advantages: torch.Tensor  # float [B]
    prox_logprobs: torch.Tensor | None = None  # float, like behav_logprobs: the proximal policy's (several updates)
    tasks: tuple[str, ...] = ()  # each row's task
    bonus: torch.Tensor | None = None  # float [B]: the entropy bonus's weight per row (None: 1 everywhere)

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
        )


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


def _completion(record: StoredTurn, key: str, index: int) -> tuple[list[int], list[int], list[float]]:
    """(prompt_ids, token_ids, logprobs) of completion `index` of a turn record, checked trainable."""
    if not 0 <= index < len(record.completions):
        raise InvalidSample(f"turn record {key!r} has no completion #{index} (it has {len(record.completions)})")
    if not record.prompt_ids:
        raise InvalidSample(f"turn record {key!r} has an empty prompt; a sequence needs a prompt token to predict from")
    completion = record.completions[index]
    return record.prompt_ids, completion.token_ids, completion.logprobs


def load_sequences(
    store: Store, samples: Sequence[SampleRef], advantages: Sequence[float], bonus: Sequence[float] | None = None
) -> list[TrainSequence]:
    """One `TrainSequence` per turn of every sample, each with its sample's advantage.

    `bonus` is each sample's entropy-bonus weight (default 1). Turns that sampled no tokens (an aborted
    generation) have nothing to learn from and are skipped. Records are read once even when several samples of
    an n > 1 group share them. Raises `InvalidSample` naming the key when a
    record is missing or malformed.
    """
    if len(samples) != len(advantages):
        raise ValueError(f"got {len(samples)} samples but {len(advantages)} advantages")
    records: dict[str, StoredTurn] = {}
    out: list[TrainSequence] = []
    weights = [1.0] * len(samples) if bonus is None else list(bonus)
    for sample, adv, weight in zip(samples, advantages, weights):
        for key in sample.turn_keys:
            if key not in records:
                records[key] = _read_turn(store, key, sample)
            prompt_ids, ids, lps = _completion(records[key], key, sample.completion_index)
            if ids:
                out.append(
                    TrainSequence(
                        list(prompt_ids), list(ids), list(lps), float(adv), task=sample.task, bonus=float(weight)
                    )
                )
    return out


def collate(seqs: Sequence[TrainSequence], pad_id: int = 0) -> MicroBatch:
    """Right-padded tensors of `seqs`; padding is masked, so `pad_id` only has to be a valid token id."""
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
        completion[i, p : p + c] = 1.0
        behav[i, p : p + c] = torch.tensor(s.behav_logprobs, dtype=torch.float32)
        if prox is not None:
            prox[i, p : p + c] = torch.tensor(s.prox_logprobs, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    bonus = torch.tensor([s.bonus for s in seqs], dtype=torch.float32)
    return MicroBatch(input_ids, attention, completion, behav, advantages, prox, tuple(s.task for s in seqs), bonus)


def micro_batches(seqs: Sequence[TrainSequence], size: int, pad_id: int = 0) -> list[MicroBatch]:
    """Split into micro-batches of at most `size` sequences, grouped by length to waste little padding.

    The order does not matter for the result: the loss is a token-sum
    normalised by the whole batch's token count.
    """
    if size < 1:
        raise ValueError(f"micro-batch size must be ≥ 1, got {size}")
    ordered = sorted(seqs, key=lambda s: s.length)
    return [collate(ordered[i : i + size], pad_id) for i in range(0, len(ordered), size)]
