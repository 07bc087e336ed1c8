"""One GRPO/PPO train step, the same code for every backend and rank layout.

The leader rank reads the batch (turn records from the payload store), computes GRPO advantages
and broadcasts the sequences; each data-parallel rank takes its share (balanced by tokens); every
rank accumulates the loss of its micro-batches — each token's loss divided by the token count of the
*whole* batch, so shares add up to the batch's token mean on any split — then the policy syncs
gradients and steps (or, with `trainer.mini_batches`/`ppo_epochs`, makes several PPO updates:
`updates.py`). Every rank streams the HF tensors it holds into the store and the leader commits the new
version (`publish.py`; with `trainer.lora` only the adapter goes, `infra/store/adapters.py`), then writes
the step's record last (the commit point: `train_step` is idempotent because of it).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from temporalio.exceptions import ApplicationError

from rollart.activities.errors import bad_input
from rollart.activities.rl.action_entropy import ActionTerm, load_action_spaces
from rollart.activities.rl.advantages import groups_with_signal, grpo_advantages, in_unsolved_group
from rollart.activities.rl.batch import InvalidSample, TrainSequence, load_sequences
from rollart.activities.training.lr_schedule import scheduled
from rollart.activities.training.policy import Policy, StepOutcome
from rollart.activities.training.publish import Publisher, publish_version
from rollart.activities.training.ranks import Ranks
from rollart.activities.training.records import (
    checkpoint_dir,
    last_recorded_step,
    read_record,
    step_record_path,
    write_record,
)
from rollart.activities.training.updates import updates
from rollart.contracts.activities import TrainStepInput, TrainStepResult
from rollart.contracts.errors import ErrorType
from rollart.infra.memory import PeakRss
from rollart.infra.store.adapters import is_adapter_key, publish_adapter
from rollart.infra.store.payload import Store
from rollart.infra.store.weight_stream import read_all
from rollart.infra.store.weights import read_manifest
from rollart.spec.config import TrainerConfig

__all__ = ["TrainerState", "resume", "state_mismatch", "train_step"]

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """A job's policy on this rank and the last step whose update it holds (-1: none)."""

    policy: Policy
    last_completed: int
    publisher: Publisher = field(default_factory=Publisher)


def resume(policy: Policy, ranks: Ranks, store: Store, job_id: str, run_dir: str) -> int:
    """Bring a freshly built policy to the job's last completed step; return that step (-1: none).

    First the newest checkpoint (model and optimizer), then — if later steps were recorded (their
    weights published, generators already using them) — the weights the last of them published,
    with the checkpoint's optimizer moments. The leader decides; every rank loads its own share.
    """
    ckpt_step = policy.load_checkpoint(checkpoint_dir(run_dir))
    last = -1 if ckpt_step is None else ckpt_step
    plan = None
    if ranks.is_leader:
        recorded = last_recorded_step(run_dir, last)
        record = read_record(run_dir, recorded) if recorded > last else None
        if record is not None:
            if store.exists(record.weights_key):
                plan = (recorded, record.weights_key)
            else:
                log.warning(
                    "job %s: steps up to %d are recorded but their weights %s are gone; resuming at step %d",
                    job_id,
                    recorded,
                    record.weights_key,
                    last,
                )
    plan = ranks.broadcast(plan)
    if plan is not None:
        recorded, key = plan
        if is_adapter_key(key):  # a LoRA job's versions are its adapter
            policy.load_adapter_blob(store.get(key))
        else:
            policy.load_hf_tensors(read_all(store, read_manifest(store, key)))
        if ranks.is_leader:
            log.warning(
                "job %s: resumed at step %d from published weights %s (optimizer state of step %d)",
                job_id,
                recorded,
                key,
                last,
            )
        last = recorded
    return last


def state_mismatch(job_id: str, run_dir: str, have: int, asked: int) -> ApplicationError:
    """The trainer cannot run `asked`: it is not the next step after the last one it completed."""
    expected = have + 1
    have_text = f"has completed steps up to {have}" if have >= 0 else "has completed no step"
    if asked > expected:
        fix = (
            f"Resume the training loop from step {expected}, or restore the checkpoints/ and steps/ "
            f"of the run dir that reached step {asked - 1}."
        )
    else:
        fix = (
            f"Step {asked} is done but its record {step_record_path(run_dir, asked)} is missing; "
            "restore the run dir's steps/, or start a new run dir."
        )
    return ErrorType.TRAINER_STATE_MISMATCH.error(
        f"trainer for job {job_id!r} {have_text} (run dir {run_dir}), so the next step it can run is {expected}, "
        f"but was asked for step {asked}. {fix}"
    )


@dataclass(frozen=True)
class _Batch:
    """What the leader broadcasts: every sequence of the step, and the batch's totals."""

    seqs: list[TrainSequence]
    advantages: list[float]
    total_tokens: int
    total_sequences: int  # those with loss tokens: the unit of `aggregation: seq_mean` and `constant`


def _load_batch(store: Store, inp: TrainStepInput) -> _Batch | str:
    """The step's sequences with their GRPO advantages, or the reason they cannot be trained on."""
    if not inp.samples:
        return f"train step {inp.step} of job {inp.job_id!r} got no samples; the workflow must send a non-empty batch"
    advantages = grpo_advantages(
        [s.reward for s in inp.samples],
        [s.group_id for s in inp.samples],
        normalize_std=inp.trainer.loss.normalize_advantage_std,
        std_floor=inp.trainer.loss.advantage_std_floor,
    )
    bonus = None
    if inp.trainer.loss.bonus_on == "unsolved":
        unsolved = in_unsolved_group([s.success for s in inp.samples], [s.group_id for s in inp.samples])
        bonus = [1.0 if u else 0.0 for u in unsolved]
    try:
        seqs = load_sequences(store, inp.samples, advantages, bonus, mode=inp.trainer.sequence)
    except InvalidSample as e:
        return f"train step {inp.step} of job {inp.job_id!r}: {e}"
    total = sum(s.loss_tokens for s in seqs)
    if total == 0:
        return f"train step {inp.step} of job {inp.job_id!r}: the samples hold no completion tokens"
    return _Batch(seqs, advantages, total, sum(1 for s in seqs if s.loss_tokens))


def train_step(
    state: TrainerState, ranks: Ranks, store: Store, inp: TrainStepInput, keep_weight_versions: int
) -> TrainStepResult | None:
    """Run step `inp.step` on this rank; the leader returns the (recorded) result, the others None.

    Raises a non-retryable `ApplicationError` on every rank alike for a batch no retry can fix or a
    step that is not the next one. Any other error leaves the policy in an unknown state: the caller
    must drop it and build a new one (which resumes from the checkpoint and records).
    """
    t0 = time.perf_counter()
    cfg = scheduled(inp.trainer, inp.step)
    # The broadcast comes first: every rank takes part in it before any of them may give up on the step.
    batch = ranks.broadcast(_load_batch(store, inp) if ranks.is_leader else None)
    if inp.step != state.last_completed + 1:
        raise state_mismatch(inp.job_id, inp.run_dir, state.last_completed, inp.step)
    if isinstance(batch, str):
        raise bad_input(batch)
    actions = _action_term(inp, cfg)
    metrics, outcomes = updates(state.policy, ranks, batch.seqs, batch.total_sequences, cfg, inp.step, actions)
    if actions is not None:
        metrics[actions.metric] = metrics.pop("entropy")
    metrics["lr"] = cfg.lr  # the schedule's rate for this step
    if cfg.loss.entropy_coef > 0 or cfg.loss.entropy_target is not None:
        metrics["entropy_coef"] = cfg.loss.entropy_coef  # the bonus's weight (adaptive: the workflow's choice)
        metrics["bonus_share"] = sum(s.bonus > 0 for s in batch.seqs) / len(batch.seqs)  # sequences it acts on
    skipped = sum(1 for o in outcomes if not math.isfinite(o.grad_norm))
    if skipped:
        log.warning(
            "job %s step %d: non-finite gradient norm; %d of %d updates skipped",
            inp.job_id,
            inp.step,
            skipped,
            len(outcomes),
        )
    t_pub = time.perf_counter()
    key = ""
    if cfg.lora is not None:  # only the adapter: the base, which every engine holds, never changes
        files = state.policy.adapter_files()  # with fsdp a collective: the leader gathers the adapter
        if ranks.is_leader:
            key = publish_adapter(store, inp.job_id, inp.step + 1, files, keep_weight_versions).key
            metrics["publish_s"] = time.perf_counter() - t_pub
    else:
        # a collective: every rank streams the tensors it assembles into buckets, the leader commits the manifest
        weights = inp.weights.resolved("float32")
        with PeakRss() as peak:
            ref = publish_version(
                state.policy.hf_tensors(),
                ranks,
                store,
                inp.job_id,
                inp.step + 1,
                weights,
                keep_weight_versions,
                state.publisher,
            )
        if ranks.is_leader:
            if ref is None:
                raise RuntimeError(f"publishing weights v{inp.step + 1} gave the leader rank no manifest")
            key = ref.key
            metrics["publish_s"] = time.perf_counter() - t_pub  # gather + convert + cast + store
            metrics["publish_peak_mb"] = peak.extra_bytes / 1e6  # the leader's memory above its own before it
    result = None
    if (inp.step + 1) % cfg.checkpoint_every == 0:
        state.policy.save_checkpoint(checkpoint_dir(inp.run_dir), inp.step)
    if ranks.is_leader:
        result = TrainStepResult(
            step=inp.step,
            version=inp.step + 1,
            weights_key=key,
            metrics=_step_metrics(inp, batch, metrics, outcomes, t0),
        )
        write_record(inp.run_dir, result)
        log.info(
            "job %s step %d: loss %.4f, reward %.3f, %.2f s",
            inp.job_id,
            inp.step,
            metrics["loss"],
            result.metrics["reward_mean"],
            result.metrics["train_s"],
        )
    state.last_completed = inp.step
    return result


def _action_term(inp: TrainStepInput, cfg: TrainerConfig) -> ActionTerm | None:
    """Each task's action space with `entropy_over: actions` (built once per process), else None; a task whose
    env cannot say which tokens are actions fails the step on every rank alike, not retried."""
    if cfg.loss.entropy_over != "actions":
        return None
    try:
        return ActionTerm(load_action_spaces(inp.model_dir, cfg.task_envs), cfg.loss.action_bonus)
    except Exception as e:  # an env that does not declare actions, or cannot be built here
        raise bad_input(f"train step {inp.step} of job {inp.job_id!r}: trainer.loss.entropy_over: actions: {e}") from e


def _limit_metrics(outcomes: list[StepOutcome]) -> dict[str, float]:
    """With `trainer.max_logprob_change`: the mean |Δ log π| the step's updates ended at, and how many halvings
    it took to keep them within the limit (nothing without the limit)."""
    changes = [o.logprob_change for o in outcomes if o.logprob_change is not None]
    if not changes:
        return {}
    return {"logprob_change": sum(changes) / len(changes), "update_shrinks": float(sum(o.shrinks for o in outcomes))}


def _step_metrics(
    inp: TrainStepInput, batch: _Batch, loss_metrics: dict[str, float], outcomes: list[StepOutcome], t0: float
) -> dict[str, float]:
    """The step's metrics: the loss terms plus what the batch and the update looked like."""
    rewards = [s.reward for s in inp.samples]
    groups = [s.group_id for s in inp.samples]
    staleness = [inp.step - s.policy_version_min for s in inp.samples]
    return {
        **loss_metrics,
        "grad_norm": sum(o.grad_norm for o in outcomes) / len(outcomes),  # the mean over the step's updates
        "update_skipped": sum(0.0 if math.isfinite(o.grad_norm) else 1.0 for o in outcomes),  # non-finite norm
        "updates_without_signal": sum(1.0 if o.without_signal else 0.0 for o in outcomes),  # zero gradient: not applied
        "updates": float(len(outcomes)),
        **_limit_metrics(outcomes),
        "samples": float(len(inp.samples)),
        "sequences": float(len(batch.seqs)),
        "tokens": float(batch.total_tokens),
        "reward_mean": sum(rewards) / len(rewards),
        "success_rate": sum(1.0 for s in inp.samples if s.success) / len(inp.samples),
        "adv_abs_mean": sum(abs(a) for a in batch.advantages) / len(batch.advantages),
        "groups_with_signal": groups_with_signal(batch.advantages, groups),
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": float(max(staleness)),
        "train_s": time.perf_counter() - t0,
    }
