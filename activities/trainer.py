"""The `train_step` activity: one GRPO/PPO update of a job's policy, then publish the new version.

The trainer worker keeps each job's model and optimizer in memory between
steps. A step is idempotent: its result is recorded in `run_dir/steps/` and a
repeated call returns the record without touching the weights, so Temporal
may retry freely. Workflow code must never import this module (it imports
torch); workflows call the activity by name with `TrainStepInput`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from rollart.activities.errors import bad_input
from rollart.activities.heartbeat import heartbeating
from rollart.activities.rl.advantages import groups_with_signal, grpo_advantages
from rollart.activities.rl.batch import InvalidSample, load_sequences, micro_batches
from rollart.activities.rl.losses import policy_loss, token_logprobs, token_logprobs_and_entropy
from rollart.activities.rl.weights_io import load_blob_into, load_checkpoint, save_checkpoint, state_dict_blob
from rollart.activities.types import TrainStepInput, TrainStepResult
from rollart.infra.config import TrainerConfig
from rollart.infra.store import Store, StoreKeyError
from rollart.infra.weights import publish
from temporalio import activity
from temporalio.exceptions import ApplicationError

__all__ = ["HEARTBEAT_EVERY_S", "TrainerActivities", "checkpoint_dir", "step_record_path"]

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 5.0
"""How often the activity heartbeats while the torch work runs in its thread."""

_T = TypeVar("_T")


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run's trainer checkpoints live."""
    return Path(run_dir) / "checkpoints"


def step_record_path(run_dir: str | Path, step: int) -> Path:
    """Where the result of train step `step` is recorded (the idempotency record)."""
    return Path(run_dir) / "steps" / f"{step:06d}.json"


def _read_record(run_dir: str | Path, step: int) -> TrainStepResult | None:
    path = step_record_path(run_dir, step)
    try:
        return TrainStepResult.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None


def _write_record(run_dir: str | Path, result: TrainStepResult) -> None:
    """Atomically write the step's record (temp file + rename): it is the commit point of the step."""
    path = step_record_path(run_dir, result.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(result.model_dump_json().encode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mismatch(job_id: str, run_dir: str, have: int, asked: int) -> ApplicationError:
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
    return ApplicationError(
        f"trainer for job {job_id!r} {have_text} (run dir {run_dir}), so the next step it can run is {expected}, "
        f"but was asked for step {asked}. {fix}",
        type="TrainerStateMismatch",
        non_retryable=True,
    )


@dataclass
class _JobState:
    """One job's trainer state, kept in memory between steps."""

    model: Any  # transformers PreTrainedModel
    optimizer: torch.optim.Optimizer
    last_completed: int  # the last train step whose update the model holds (-1: none)
    pad_id: int
    ref_model: Any | None = None


class TrainerActivities:
    """Binds `train_step` to the payload store; models are loaded per job on first use.

    `torch_threads`: intra-op threads for torch (process-wide), applied when
    the first job loads; None leaves torch's default. Default 1: on 2 cores, a
    step of 64 sequences × ~20 tokens of the tiny model took ~0.075 s with one
    thread and ~0.095 s with two (thread sync costs more than it saves on
    such small matrices), and one thread leaves a core for the event loop.
    """

    def __init__(self, store: Store, *, torch_threads: int | None = 1, keep_weight_versions: int = 2) -> None:
        self.store = store
        self.keep_weight_versions = keep_weight_versions
        self.torch_threads = torch_threads
        self._jobs: dict[str, _JobState] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        """Run train step `inp.step` (policy v`step` → v`step+1`), or return its recorded result if already run."""
        if not inp.samples:
            raise bad_input(
                f"train step {inp.step} of job {inp.job_id!r} got no samples; the workflow must send a non-empty batch"
            )
        recorded = await asyncio.to_thread(_read_record, inp.run_dir, inp.step)
        if recorded is not None:
            return recorded.model_copy(update={"replayed": True})
        lock = self._locks.setdefault(inp.job_id, asyncio.Lock())
        async with lock:
            # A previous attempt of this very step may have finished while we waited for the lock.
            recorded = await asyncio.to_thread(_read_record, inp.run_dir, inp.step)
            if recorded is not None:
                return recorded.model_copy(update={"replayed": True})
            async with heartbeating(HEARTBEAT_EVERY_S, first_now=True):
                return await _in_thread(lambda: self._step_sync(inp))

    # ---- torch work (runs in a worker thread) -------------------------------------------------

    def _state(self, inp: TrainStepInput) -> _JobState:
        state = self._jobs.get(inp.job_id)
        if state is None:
            state = self._load_state(inp)
            self._jobs[inp.job_id] = state
        return state

    def _load_state(self, inp: TrainStepInput) -> _JobState:
        """Model + AdamW for a job: the newest checkpoint if any, then the published weights of later recorded steps.

        Why the second part: steps after the last checkpoint were published and
        recorded before a restart, and generators already use their weights;
        continuing from them (with the checkpoint's optimizer moments) keeps
        the step numbering and the weights consistent instead of failing.
        """
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        cfg = inp.trainer
        torch.manual_seed(cfg.seed)
        model = _load_model(inp.model_dir)
        model.train()
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
        )
        ckpt_step = load_checkpoint(checkpoint_dir(inp.run_dir), model, optimizer)
        last = -1 if ckpt_step is None else ckpt_step
        recorded = last
        while step_record_path(inp.run_dir, recorded + 1).is_file():
            recorded += 1
        record = _read_record(inp.run_dir, recorded) if recorded > last else None
        if record is not None:
            try:
                load_blob_into(model, self.store.get(record.weights_key))
            except StoreKeyError:
                log.warning(
                    "job %s: steps up to %d are recorded but their weights %s are gone; resuming at step %d",
                    inp.job_id, recorded, record.weights_key, last,
                )  # fmt: skip
            else:
                log.warning(
                    "job %s: resumed at step %d from published weights %s (optimizer state of step %d)",
                    inp.job_id, recorded, record.weights_key, last,
                )  # fmt: skip
                last = recorded
        pad_id = next((i for i in (model.config.pad_token_id, model.config.eos_token_id) if isinstance(i, int)), 0)
        log.info("job %s: trainer ready at step %d (model %s)", inp.job_id, last, inp.model_dir)
        return _JobState(model=model, optimizer=optimizer, last_completed=last, pad_id=pad_id)

    def _ref_model(self, state: _JobState, model_dir: str) -> Any:
        """The frozen reference policy (the job's initial model), loaded only when the KL term is on."""
        if state.ref_model is None:
            ref = _load_model(model_dir).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            state.ref_model = ref
        return state.ref_model

    def _step_sync(self, inp: TrainStepInput) -> TrainStepResult:
        t0 = time.perf_counter()
        cfg = inp.trainer
        state = self._state(inp)
        if inp.step != state.last_completed + 1:
            raise _mismatch(inp.job_id, inp.run_dir, state.last_completed, inp.step)

        rewards = [s.reward for s in inp.samples]
        groups = [s.group_id for s in inp.samples]
        advantages = grpo_advantages(rewards, groups)
        try:
            seqs = load_sequences(self.store, inp.samples, advantages)
        except InvalidSample as e:
            raise bad_input(f"train step {inp.step} of job {inp.job_id!r}: {e}") from e
        total_tokens = sum(len(s.completion_ids) for s in seqs)
        if total_tokens == 0:
            raise bad_input(f"train step {inp.step} of job {inp.job_id!r}: the samples hold no completion tokens")

        metrics = self._accumulate_gradients(state, seqs, total_tokens, cfg, inp.model_dir)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(state.model.parameters(), cfg.grad_clip))
        try:
            if math.isfinite(grad_norm):
                for group in state.optimizer.param_groups:  # the config may change between steps (schedules)
                    group.update(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
                state.optimizer.step()
            else:
                log.warning("job %s step %d: non-finite gradient norm; update skipped", inp.job_id, inp.step)
            state.optimizer.zero_grad(set_to_none=True)
            t_pub = time.perf_counter()
            ref = publish(self.store, inp.job_id, inp.step + 1, state_dict_blob(state.model), self.keep_weight_versions)
            publish_s = time.perf_counter() - t_pub
            if (inp.step + 1) % cfg.checkpoint_every == 0:
                save_checkpoint(checkpoint_dir(inp.run_dir), state.model, state.optimizer, inp.step)
            staleness = [inp.step - s.policy_version_min for s in inp.samples]
            metrics.update(
                grad_norm=grad_norm,
                update_skipped=0.0 if math.isfinite(grad_norm) else 1.0,
                samples=float(len(inp.samples)),
                sequences=float(len(seqs)),
                tokens=float(total_tokens),
                reward_mean=sum(rewards) / len(rewards),
                success_rate=sum(1.0 for s in inp.samples if s.success) / len(inp.samples),
                adv_abs_mean=sum(abs(a) for a in advantages) / len(advantages),
                groups_with_signal=groups_with_signal(advantages, groups),
                staleness_mean=sum(staleness) / len(staleness),
                staleness_max=float(max(staleness)),
                train_s=time.perf_counter() - t0,
                publish_s=publish_s,
            )
            result = TrainStepResult(step=inp.step, version=inp.step + 1, weights_key=ref.key, metrics=metrics)
            _write_record(inp.run_dir, result)
        except BaseException:
            # The in-memory weights may be ahead of what is recorded: forget them, reload on the next call.
            self._jobs.pop(inp.job_id, None)
            raise
        state.last_completed = inp.step
        log.info(
            "job %s step %d: loss %.4f, reward %.3f, %.2f s",
            inp.job_id, inp.step, metrics["loss"], metrics["reward_mean"], metrics["train_s"],
        )  # fmt: skip
        return result

    def _accumulate_gradients(
        self, state: _JobState, seqs: list, total_tokens: int, cfg: TrainerConfig, model_dir: str
    ) -> dict[str, float]:
        """Forward/backward every micro-batch, summing gradients; returns the batch's loss metrics."""
        loss_cfg = cfg.loss
        model = state.model
        ref_model = self._ref_model(state, model_dir) if loss_cfg.kl_coef > 0 else None
        state.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {"kl": 0.0}
        for mb in micro_batches(seqs, cfg.micro_batch_size, state.pad_id):
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            logp, entropy = token_logprobs_and_entropy(logits, mb.input_ids)
            if loss_cfg.entropy_coef == 0:
                entropy = entropy.detach()
            logp_ref = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_logits = ref_model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
                    logp_ref = token_logprobs(ref_logits, mb.input_ids)
            terms = policy_loss(
                logp,
                mb.behav_logprobs,
                mb.advantages,
                mb.completion_mask,
                loss_cfg,
                total_tokens=total_tokens,
                logp_ref=logp_ref,
                entropy=entropy,
            )
            terms.loss.backward()
            for k, v in terms.metrics.items():
                totals[k] = totals.get(k, 0.0) + v
        return totals


def _load_model(model_dir: str) -> Any:
    """The job's initial policy in float32, or a non-retryable error saying what is missing."""
    from transformers import AutoModelForCausalLM

    if not (Path(model_dir) / "config.json").is_file():
        raise bad_input(
            f"no model at {model_dir} (config.json missing); build one with `rollart init-model --out {model_dir}` "
            "or fix the job's model_dir"
        )
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


async def _in_thread(fn: Callable[[], _T]) -> _T:
    """Run `fn` in a thread; if the caller is cancelled, still wait for the thread before re-raising.

    Why: the thread cannot be interrupted, and the job's lock must stay held
    until it is done, or a retry would train on the same model concurrently.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise
