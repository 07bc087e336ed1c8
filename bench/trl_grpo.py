"""The peer baseline of `python -m bench peer_trl`: TRL's GRPOTrainer on a rollart task, in one process.

The task's own env and reward (from the registry, as rollart's workers resolve them) make TRL's dataset
and reward function, so both systems optimise the same thing: group g's prompt is the env's first
observation for the seed rollart's TrainingWorkflow gives group g, and a completion's reward is the
task's reward of the one-turn transcript the env's `step` produced. TRL generates with transformers
(no vLLM) and trains in the same process; batch, group size, sampling, optimizer and loss settings
come from the job spec. trl is an optional dependency (`pip install -e '.[bench]'`): `ensure_trl`
installs the pinned version into the running venv if it is missing.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from rollart.contracts.activities import RewardResult, Transcript, TurnRecord
from rollart.contracts.ids import derive_seed
from rollart.spec.config import JobSpec, LRScheduleConfig, TaskSpec
from rollart.spec.registry import lookup_env, lookup_reward

__all__ = ["TRL_PIN", "TrlRun", "ensure_trl", "run_trl"]

TRL_PIN = "trl==1.16.0"
"""As pyproject.toml's `bench` extra: checked against torch 2.13 / transformers 5.19 (it changes neither)."""


def ensure_trl() -> None:
    """Install TRL_PIN into the running interpreter's environment when trl is missing, saying so first, then
    start the bench again: transformers, already imported, decided without accelerate (trl's dependency) that
    its Trainer cannot run, so the first run on a fresh machine failed."""
    if importlib.util.find_spec("trl") is not None:
        return
    print(f"peer_trl: trl is not installed; installing {TRL_PIN} into {sys.prefix} (the `bench` extra) ...", flush=True)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", TRL_PIN])
    print("peer_trl: trl installed; starting the bench again in a fresh interpreter", flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "bench", *sys.argv[1:]])


@dataclass
class TrlRun:
    """What one TRL run measured: per optimizer step, seconds since `train()` began and the batch's success."""

    step_end_s: list[float] = field(default_factory=list)
    success: list[float] = field(default_factory=list)
    stopped_because: str = ""


class _TaskReward:
    """TRL's reward function: play each completion as the one step of the env reset from its seed, score the
    transcript with the task's reward, record the batch's success rate.

    The env is reset once per seed and shallow-copied per completion (a reasoning-gym reset costs ~10 ms here;
    16 per step instead of 256): right for single-turn envs whose `step` only rebinds their own fields."""

    def __init__(self, task: TaskSpec, run: TrlRun) -> None:
        self.task, self.run = task, run
        self.env_cls = lookup_env(task.env).cls
        self.reward = lookup_reward(task.reward).fn
        self.__name__ = f"{task.name}:{task.reward}"  # TRL names its reward metrics after the function

    def __call__(self, prompts: list[str], completions: list[str], seed: list[int], **_: Any) -> list[float]:
        values, hits, reset = [], 0, {}
        for completion, s in zip(completions, seed):
            if s not in reset:  # one reset per group: the env is reset from the seed, then copied per sample
                env = self.env_cls(**self.task.env_args)
                reset[s] = (env, env.reset(int(s)))
            env, observation = reset[s]
            outcome = copy.copy(env).step(completion)
            turn = TurnRecord(
                observation=observation,
                action=completion,
                env_reward=outcome.reward,
                done=outcome.done,
                info=outcome.info,
            )
            result = RewardResult.of(
                self.reward(Transcript(task=self.task.name, seed=int(s), turns=[turn])), self.task.reward
            )
            values.append(result.value)
            hits += bool(result.success)
        self.run.success.append(hits / max(len(values), 1))
        return values


def run_trl(job: JobSpec, max_steps: int, max_s: float, target: float, window: int) -> TrlRun:
    """Train the job's single task with GRPOTrainer for at most `max_steps` steps / `max_s` seconds, stopping
    early once the mean success of the last `window` steps reaches `target`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    (task,) = job.tasks
    run = TrlRun()
    clock = _clock_class()
    groups_per_step = job.training.batch_size // task.group_size
    n_groups = groups_per_step * max_steps
    env = lookup_env(task.env).cls(**task.env_args)
    seeds = [derive_seed(job.training.seed, g) for g in range(n_groups)]  # group g's, as training draws it
    rows = [{"prompt": env.reset(s), "seed": s} for s in seeds]
    sampling, trainer_cfg, loss = task.sampling, job.trainer, job.trainer.loss
    with tempfile.TemporaryDirectory(prefix="peer-trl-") as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=10,
            disable_tqdm=True,
            max_steps=max_steps,
            per_device_train_batch_size=job.training.batch_size,
            num_generations=task.group_size,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=sampling.max_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=1.0,
            learning_rate=trainer_cfg.lr,
            adam_beta1=trainer_cfg.betas[0],
            adam_beta2=trainer_cfg.betas[1],
            weight_decay=0.0,
            max_grad_norm=trainer_cfg.grad_clip,
            **_lr_schedule(trainer_cfg.lr_schedule),
            beta=0.0,
            epsilon=loss.clip_eps,
            epsilon_high=loss.clip_eps_high or loss.clip_eps,
            entropy_coef=loss.entropy_coef,
            shuffle_dataset=False,
            seed=job.training.seed,
            dataloader_num_workers=0,
        )
        model = AutoModelForCausalLM.from_pretrained(job.model_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
        tokenizer.padding_side = "left"
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[_TaskReward(task, run)],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[clock(run, max_s, target, window)],
        )
        trainer.remove_callback(PrinterCallback)  # the bench prints its own table, not a dict per log
        clock.t0 = time.monotonic()
        trainer.train()
    if not run.stopped_because:
        run.stopped_because = "max steps"
    return run


def _clock_class():  # TrainerCallback is imported lazily (transformers is heavy)
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        """Stamps every optimizer step's end; stops training at the deadline or once the target success is held."""

        t0 = 0.0

        def __init__(self, run: TrlRun, max_s: float, target: float, window: int) -> None:
            self.run, self.max_s, self.target, self.window = run, max_s, target, window

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            elapsed = time.monotonic() - Clock.t0
            self.run.step_end_s.append(elapsed)
            recent = self.run.success[-self.window :]
            if len(self.run.step_end_s) % 100 == 0:
                print(
                    f"  trl: step {len(self.run.step_end_s)}, {elapsed:.0f} s, success (last {len(recent)}) "
                    f"{sum(recent) / max(len(recent), 1):.2f}",
                    flush=True,
                )
            if len(recent) == self.window and sum(recent) / self.window >= self.target:
                self.run.stopped_because, control.should_training_stop = "target reached", True
            elif elapsed >= self.max_s:
                self.run.stopped_because, control.should_training_stop = "time cap", True
            return control

    return Clock


def _lr_schedule(schedule: LRScheduleConfig) -> dict[str, Any]:
    """rollart's learning-rate schedule as transformers' TrainingArguments: the same warm-up, then constant or cosine
    down to `min_ratio` × lr over the run (transformers' `cosine_with_min_lr`)."""
    if schedule.decay_steps is not None:
        raise ValueError("peer_trl: lr_schedule.decay_steps has no transformers equivalent here; leave it unset")
    if schedule.kind == "constant":
        return {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": schedule.warmup_steps}
    return {
        "lr_scheduler_type": "cosine_with_min_lr",
        "warmup_steps": schedule.warmup_steps,
        "lr_scheduler_kwargs": {"min_lr_rate": schedule.min_ratio},
    }
