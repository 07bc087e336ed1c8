"""Entropy over an env's actions instead of over the vocabulary (`trainer.loss.entropy_over: actions`).

Every token id is decoded on its own and read by the task's env (`Env.action_of`); the tokens that read as
the same action form one class, the rest (no action) a class of their own that is left out. At each position
the classes' probabilities P_c = Σ_{v ∈ c} p_v are renormalised over the tokens that are actions,
q_c = P_c / Σ P, and the entropy is H = −Σ q_c log q_c: it is log(#actions) when every move is equally
likely and 0 when one move has all the mass, however that mass is spread over the tokens spelling it.

Why: a tiny policy that settles on one route through FrozenLake gets every member of its groups the same
reward, so no advantage is left to make it try the move it never makes. A bonus on the vocabulary's entropy
pushes towards all 386 tokens, most of which are no action or spell the same move, and stalls learning
before it helps; a bonus on this entropy pushes only towards trying the other moves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F

from rollart.activities.rl.packing import Packed
from rollart.spec.config import TaskEnv
from rollart.spec.env import Env, declares_actions
from rollart.spec.registry import lookup_env

__all__ = [
    "ActionSpace",
    "ActionTerm",
    "UnknownActions",
    "action_entropy",
    "action_space",
    "class_sums",
    "entropy_by_task",
    "load_action_spaces",
    "packed_by_task",
    "token_action_entropy",
]


class UnknownActions(ValueError):
    """A task whose env does not declare its actions, or whose actions the model cannot spell in one token."""


@dataclass(frozen=True)
class ActionSpace:
    """One task's actions in token space: the action of every token id, by index into `names`.

    `token_class[v]` is the index of the action token `v` reads as, or `len(names)` for a token that is
    no action (and for ids past the tokenizer's, such as a padded vocabulary's).
    """

    names: tuple[str, ...]
    token_class: torch.Tensor  # long [V]

    def classes_for(self, start: int, count: int, device: torch.device) -> torch.Tensor:
        """The classes of token ids `start .. start+count` (a vocabulary slice), ids past the table as no action."""
        table = self.token_class
        none = len(self.names)
        out = torch.full((count,), none, dtype=torch.long)
        stop = min(start + count, table.numel())
        if stop > start:
            out[: stop - start] = table[start:stop]
        return out.to(device)


def action_space(env: Env, decode: Callable[[int], str], vocab_size: int, where: str) -> ActionSpace:
    """Read every token id `0 .. vocab_size` with `env.action_of`; `where` names the task in errors."""
    actions = [env.action_of(decode(token)) for token in range(vocab_size)]
    names = tuple(dict.fromkeys(a for a in actions if a is not None))
    if len(names) < 2:
        raise UnknownActions(
            f"{where}: the env reads {len(names)} action(s) in the model's single tokens; "
            "entropy over actions needs at least 2 (use entropy_over: tokens)"
        )
    index = {name: i for i, name in enumerate(names)}
    token_class = torch.tensor([len(names) if a is None else index[a] for a in actions], dtype=torch.long)
    return ActionSpace(names, token_class)


@dataclass(frozen=True)
class ActionTerm:
    """The loss's entropy term with `entropy_over: actions`: each task's action space and the term's form.

    `entropy`: H(q). `coverage`: (1/C) Σ_c log q_c + log C = −KL(uniform ‖ q), 0 when every action is equally
    likely. The entropy's pull on an action vanishes as its probability goes to 0 (q log q → 0); coverage's
    does not (d/dz_c → 1/C), so under a coverage bonus no action's probability can fall to 0 unless
    advantages keep pushing it down."""

    spaces: Mapping[str, ActionSpace]
    form: Literal["entropy", "coverage"] = "entropy"

    @property
    def metric(self) -> str:
        """The step metric the term is reported as."""
        return "action_entropy" if self.form == "entropy" else "action_coverage"


def action_entropy(probs_by_class: torch.Tensor, form: str = "entropy") -> torch.Tensor:
    """The entropy (or coverage, see `ActionTerm`) of `[..., C]` action probabilities (unnormalised sums P_c),
    renormalised over the actions."""
    total = probs_by_class.sum(-1, keepdim=True).clamp_min(1e-30)
    log_q = (probs_by_class / total).clamp_min(1e-30).log()
    if form == "coverage":
        return log_q.mean(-1) + math.log(probs_by_class.shape[-1])
    return -(log_q.exp() * log_q).sum(-1)


def class_sums(weights: torch.Tensor, token_class: torch.Tensor, n_actions: int) -> torch.Tensor:
    """Σ of `weights [..., V]` per action class: `[..., n_actions]` (the no-action class dropped)."""
    shape = (*weights.shape[:-1], n_actions + 1)
    summed = torch.zeros(shape, dtype=weights.dtype, device=weights.device).index_add(-1, token_class, weights)
    return summed[..., :n_actions]


def entropy_by_task(
    tasks: Sequence[str],
    spaces: Mapping[str, ActionSpace],
    rows_entropy: Callable[[torch.Tensor, ActionSpace], torch.Tensor],
) -> torch.Tensor:
    """Each row's action entropy `[B, T]`, computed per task by `rows_entropy(row_indices, space)`.

    A micro-batch may mix tasks, and each reads tokens as its own actions."""
    parts: dict[int, torch.Tensor] = {}
    for task in dict.fromkeys(tasks):
        if task not in spaces:
            raise UnknownActions(f"task {task!r} has no action space; the trainer knows {sorted(spaces)}")
        rows = [i for i, t in enumerate(tasks) if t == task]
        values = rows_entropy(torch.tensor(rows, dtype=torch.long), spaces[task])
        parts.update(zip(rows, values.unbind(0)))
    return torch.stack([parts[i] for i in range(len(tasks))])


def packed_by_task(packed: Packed, tasks: Sequence[str], row_of_task: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """The `[1, N]` action entropy of a packed row whose sequences have `tasks`: each token's value from
    `row_of_task(its sequence's task)`, the whole row read with that task's action space (one pass per task
    the micro-batch holds: usually one). Each sequence's first position reads across a boundary; the unpacking
    zeroes it."""
    if len(tasks) != packed.num_sequences:
        raise ValueError(f"{len(tasks)} tasks for a packed row of {packed.num_sequences} sequences")
    token_task = packed.segment_ids()
    names = list(dict.fromkeys(tasks))
    of_segment = torch.tensor([names.index(t) for t in tasks], dtype=torch.long, device=token_task.device)
    token_task = of_segment[token_task]
    out = row_of_task(names[0])
    for k, task in enumerate(names[1:], start=1):
        out = torch.where((token_task == k).to(out.device)[None], row_of_task(task), out)
    return out


def token_action_entropy(logits: torch.Tensor, tasks: Sequence[str], term: ActionTerm) -> torch.Tensor:
    """The action entropy (or coverage) of the distribution at t−1 that sampled token t, `[B, T]` aligned like
    `rl.losses.token_logprobs` (position 0 is 0), from full `[B, T, V]` logits."""

    def rows(idx: torch.Tensor, space: ActionSpace) -> torch.Tensor:
        probs = torch.softmax(logits[idx.to(logits.device), :-1].float(), dim=-1)
        classes = space.classes_for(0, probs.shape[-1], probs.device)
        return F.pad(action_entropy(class_sums(probs, classes, len(space.names)), term.form), (1, 0))

    return entropy_by_task(tasks, term.spaces, rows)


@lru_cache(maxsize=8)
def _cached(model_dir: str, task_envs_json: str) -> dict[str, ActionSpace]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    spaces = {}
    for task, spec in json.loads(task_envs_json).items():
        entry = lookup_env(spec["env"])
        if not declares_actions(entry.cls):
            raise UnknownActions(
                f"task {task!r}: env {spec['env']!r} does not declare its actions (Env.action_of), "
                "so trainer.loss.entropy_over: actions cannot be used with it"
            )
        env = entry.cls(**spec["env_args"])
        try:
            spaces[task] = action_space(env, lambda t: tokenizer.decode([t]), len(tokenizer), f"task {task!r}")
        finally:
            env.close()
    return spaces


def load_action_spaces(model_dir: str, task_envs: Mapping[str, TaskEnv]) -> dict[str, ActionSpace]:
    """Every task's action space for the model in `model_dir` (its tokenizer), built once per process.

    Token ids past the tokenizer's (a padded vocabulary) are no action."""
    if not task_envs:
        raise UnknownActions(
            "trainer.loss.entropy_over: actions, but the trainer got no task envs (trainer."
            "task_envs is filled by the training plan: start the job with `rollart train`)"
        )
    as_json = json.dumps({k: v.model_dump(mode="json") for k, v in task_envs.items()}, sort_keys=True)
    return _cached(model_dir, as_json)
