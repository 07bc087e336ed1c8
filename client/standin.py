"""The trainer without the system: an example's learning dynamics in one process, many seeds in minutes.

The trainer's own code (`TorchPolicy`, the GRPO advantages, the loss, the PPO mini-batches, the lr schedule, the
coverage bonus over the moves) trains the FrozenLake example while sampling from the model directly (no vLLM, no
Temporal). The async bound is played as the system's steady state on a machine whose rollout keeps up with the
trainer: step k trains on groups sampled with the weights of step max(0, k − bound). Each seed is also the
sampling seed, so a run repeats exactly. For ranking recipes (`python -m bench learning_standin`) and telling a
recipe's sensitivity to staleness from a fault of the system; it is not the measurement of the product.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rollart.activities.envs.frozenlake import FrozenLake
from rollart.activities.rewards.rule_based import progress
from rollart.activities.rl.action_entropy import ActionTerm, load_action_spaces
from rollart.activities.rl.advantages import grpo_advantages, in_unsolved_group
from rollart.activities.rl.batch import TrainSequence
from rollart.activities.training.lr_schedule import scheduled
from rollart.activities.training.ranks import OneProcess
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.activities.training.updates import updates
from rollart.contracts.activities import Transcript, TurnRecord
from rollart.spec.config import JobSpec, TrainerConfig

__all__ = ["TRACED", "Episode", "SharedPromptPolicy", "run_one", "sample_groups", "sequences", "train"]

TRACED = ("logprob_diff_behav", "entropy", "clip_frac", "is_truncated_frac", "logprob_change", "shrinks")
"""The loss metrics kept per step (`entropy` is the coverage of the moves with `action_bonus: coverage`)."""


@dataclass
class Episode:
    """One member's turns: the prompt ids, the sampled token and its behaviour log-prob per turn."""

    prompts: list[list[int]]
    tokens: list[int]
    logprobs: list[float]
    reward: float
    success: bool


def sample_groups(model, tok, spec: JobSpec, groups: int, gen: torch.Generator, seed0: int) -> list[list[Episode]]:
    """`groups` GRPO groups of the example's task, every member stepped in one batched forward per turn."""
    task = spec.tasks[0]
    n = groups * task.group_size
    envs = [FrozenLake(**task.env_args) for _ in range(n)]
    obs = [env.reset(seed0 + i // task.group_size) for i, env in enumerate(envs)]
    turns: list[list[TurnRecord]] = [[] for _ in range(n)]
    eps = [Episode([], [], [], 0.0, False) for _ in range(n)]
    live = list(range(n))
    dists: dict[str, tuple[list[int], torch.Tensor]] = {}  # observation → its ids and log-probs (the policy is fixed)
    for _ in range(task.max_turns):
        if not live:
            break
        _next_token_logprobs(model, tok, [obs[i] for i in live if obs[i] not in dists], dists)
        rows = torch.stack([dists[obs[i]][1] for i in live])
        picked = torch.multinomial(rows.exp(), 1, generator=gen).squeeze(-1)
        still = []
        for row, i in enumerate(live):
            t = int(picked[row])
            text = tok.decode([t])
            eps[i].prompts.append(dists[obs[i]][0])
            eps[i].tokens.append(t)
            eps[i].logprobs.append(float(rows[row, t]))
            out = envs[i].step(text)
            turns[i].append(TurnRecord(observation=obs[i], action=text, env_reward=out.reward, info=out.info))
            obs[i] = out.observation
            if not out.done:
                still.append(i)
        live = still
    for i, ep in enumerate(eps):
        r = progress(Transcript(task=task.name, seed=0, turns=turns[i]))
        ep.reward, ep.success = r.value, r.success
    return [eps[g * task.group_size : (g + 1) * task.group_size] for g in range(groups)]


def _next_token_logprobs(model, tok, texts: list[str], into: dict) -> None:
    """The next-token log-probs after each of `texts` (each alone: no padding to get wrong), into `into`."""
    with torch.no_grad():
        for text in dict.fromkeys(texts):
            ids = tok(text)["input_ids"]
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            into[text] = (ids, torch.log_softmax(logits, -1))


def sequences(groups: Sequence[Sequence[Episode]], cfg: TrainerConfig, task: str) -> list[TrainSequence]:
    """The batch as the trainer sees it: one sequence per turn, its episode's advantage and bonus weight."""
    flat = [(g, ep) for g, members in enumerate(groups) for ep in members]
    ids = [g for g, _ in flat]
    adv = grpo_advantages(
        [ep.reward for _, ep in flat],
        ids,
        normalize_std=cfg.loss.normalize_advantage_std,
        std_floor=cfg.loss.advantage_std_floor,
    )
    unsolved = in_unsolved_group([ep.success for _, ep in flat], ids)
    out = []
    for (_, ep), a, u in zip(flat, adv, unsolved):
        bonus = 1.0 if (cfg.loss.bonus_on != "unsolved" or u) else 0.0
        for p, t, lp in zip(ep.prompts, ep.tokens, ep.logprobs):
            out.append(TrainSequence(p, [t], [lp], a, task=task, bonus=bonus))
    return out


class SharedPromptPolicy(TorchPolicy):
    """`TorchPolicy` that runs the model once per distinct prompt of a micro-batch: FrozenLake has 16 states,
    so a batch of ~500 one-token turns holds at most 16 prompts. The completion token is hidden before the
    forward pass; causal attention means no position the loss reads depends on it, so the values are the
    trainer's (the same loss code runs on them), ~30x cheaper."""

    def logprobs(self, mb, *, entropy_grad: bool, actions=None):
        completion = mb.completion_mask.bool()
        hidden = mb.input_ids.masked_fill(completion, self.pad_id)
        keys = [tuple(row) for row in torch.cat([hidden, mb.attention_mask], 1).tolist()]
        first: dict[tuple, int] = {}  # each distinct row → the first row that has it
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        slot = {k: n for n, k in enumerate(first)}
        index = torch.tensor([slot[k] for k in keys])
        rows = torch.tensor(list(first.values()))
        logits = self.model(input_ids=hidden[rows], attention_mask=mb.attention_mask[rows]).logits[index]
        return self.from_logits(logits, mb, entropy_grad=entropy_grad, actions=actions)


def train(policy: TorchPolicy, seqs: list[TrainSequence], cfg: TrainerConfig, step: int, actions) -> dict:
    """One train step's updates as `activities/training/step.py` makes them; its metrics."""
    metrics, outcomes = updates(policy, OneProcess(), seqs, len(seqs), scheduled(cfg, step), step, actions)
    changes = [o.logprob_change for o in outcomes if o.logprob_change is not None]
    return {**metrics, "logprob_change": max(changes, default=None), "shrinks": sum(o.shrinks for o in outcomes)}


def run_one(spec: JobSpec, bound: int, seed: int, steps: int, target: float, window: int) -> dict:
    """One run: the success curve and the step the `window`-step mean first reached `target` (None: never)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    plan_trainer = spec.trainer.over(spec.training.steps).with_task_envs(spec.tasks)
    policy = SharedPromptPolicy(spec.model_dir, plan_trainer, torch.device("cpu"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec.model_dir)
    actions = None
    if plan_trainer.loss.entropy_over == "actions":
        actions = ActionTerm(
            load_action_spaces(str(spec.model_dir), plan_trainer.task_envs), plan_trainer.loss.action_bonus
        )
    behaviour = copy.deepcopy(policy.model).eval()
    history = {0: copy.deepcopy(policy.model.state_dict())}  # the weights of the versions still to sample from
    groups = spec.training.batch_size // spec.tasks[0].group_size
    curve: list[float] = []
    trace: list[dict] = []  # per step: the batch's mean reward and the loss's metrics
    reached = None
    for k in range(steps):
        version = max(0, k - bound)
        behaviour.load_state_dict(history[version])
        batch = sample_groups(behaviour, tok, spec, groups, gen, seed0=seed * 100_000 + k * groups)
        success = sum(ep.success for g in batch for ep in g) / spec.training.batch_size
        curve.append(success)
        m = train(policy, sequences(batch, plan_trainer, spec.tasks[0].name), plan_trainer, k, actions)
        rewards = [ep.reward for g in batch for ep in g]
        trace.append({"reward": sum(rewards) / len(rewards), **{k: m.get(k) for k in TRACED}})
        history[k + 1] = copy.deepcopy(policy.model.state_dict())
        history.pop(k + 1 - bound - 1, None)  # step k + 1 samples with version k + 1 - bound at the oldest
        if reached is None and len(curve) >= window and sum(curve[-window:]) / window >= target:
            reached = k
    return {"bound": bound, "seed": seed, "steps_to_target": reached, "curve": curve, "trace": trace}
