"""The job's `trainer` section: backend, parallel layout, optimizer, learning-rate schedule, and the loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollart.spec.config.base import Section
from rollart.spec.config.task import TaskEnv, TaskSpec

__all__ = [
    "FsdpConfig",
    "LRScheduleConfig",
    "LoraConfig",
    "LossConfig",
    "PackingConfig",
    "ParallelConfig",
    "SequenceMode",
    "TrainerConfig",
]

SequenceMode = Literal["turn", "trajectory"]
"""`trainer.sequence`: what one training sequence is, a turn or a whole (chat) trajectory."""


class LossConfig(Section):
    """The policy loss: GRPO advantages with PPO-clip, corrected for stale (off-policy) data.

    `decoupled` (AReaL): the clip is taken against the trainer's own proximal policy π_prox (its
    weights before this step), and tokens are weighted by π_prox/π_behav, where π_behav is the
    engine's logprob when it sampled. `tis_cap` truncates that weight (token-level truncated
    importance sampling); without `decoupled` the ratio is taken against π_behav directly.
    """

    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    clip_eps_high: float | None = Field(None, gt=0.0)
    """The clip's upper side, 1 + `clip_eps_high` (DAPO's clip-higher, e.g. 0.28); None: symmetric, 1 + `clip_eps`.
    A wider upper side lets a rare token that earned a positive advantage gain more per update, which slows the
    collapse of entropy onto the first route that pays."""
    tis_cap: float | None = Field(2.0, gt=1.0)
    decoupled: bool = True
    kl_coef: float = Field(0.0, ge=0.0)
    entropy_coef: float = Field(0.0, ge=0.0)
    """The entropy bonus's weight; with `entropy_target`, its starting value."""
    entropy_target: float | None = Field(None, gt=0.0)
    """Adaptive entropy control (Skywork-OR1): after each step whose mean token entropy was below this, the
    bonus's weight rises by `entropy_coef_step` (up to `entropy_coef_max`); after one above, it falls by as much
    (down to 0). The policy may still sharpen, but a collapse onto a wrong deterministic answer, where every
    group scores alike and so no advantage is left to correct it, meets a growing push back. The weight is part
    of the job's state (workflows/entropy_control.py): a retried or resumed step uses the same."""
    entropy_coef_step: float = Field(0.001, gt=0.0)
    entropy_coef_max: float = Field(0.01, gt=0.0)
    entropy_over: Literal["tokens", "actions"] = "tokens"
    """What the entropy bonus (and `entropy_target`) measures at each generated token. `tokens`: the entropy of
    the next-token distribution over the whole vocabulary. `actions`: the entropy of the *env's action* that
    token would be: tokens are grouped by what the task's env reads in them (`Env.action_of`, e.g. FrozenLake's
    L/D/R/U) and the distribution over those groups, among the tokens that are actions, is what is measured. A
    bonus on it keeps a policy trying other moves once it settles on a route, without the push a vocabulary-wide
    bonus gives towards the many tokens that are no action. It fits envs whose action is a single token
    (`max_tokens: 1`); each step then reports `action_entropy` (or `action_coverage`, see `action_bonus`) in place
    of `entropy`. Every task's env must declare its actions."""
    action_bonus: Literal["entropy", "coverage"] = "entropy"
    """With `entropy_over: actions`, the bonus's form. `entropy`: H(q) over the actions. `coverage`: the mean log
    probability of the actions plus log(#actions), −KL(uniform ‖ q): its pull on an action does not fade as the
    action's probability goes to 0 (the entropy's does, as q log q → 0), so every move keeps a share of about
    `entropy_coef` / (#actions × |its advantage|) that advantages alone cannot take away. Reported as
    `action_coverage` (0 when all actions are equally likely, negative otherwise)."""
    bonus_on: Literal["all", "unsolved"] = "all"
    """Which sequences the entropy bonus acts on. `all`: every one. `unsolved`: only those of groups in which no
    member succeeded: exploration where a task is not solved yet, while a group that succeeds is left to its
    advantages. With `all`, a solved policy whose groups all succeed (so every advantage is 0) is pushed back
    towards uniform by the bonus alone until it breaks (FrozenLake at 0.97 success fell to 0 within 3 steps:
    docs/learning.md). Each step reports the share of sequences under the bonus as `bonus_share`."""
    aggregation: Literal["token_mean", "seq_mean", "constant"] = "token_mean"
    """How per-token terms become the batch's loss. `token_mean` (DAPO): every completion token of the batch
    weighs the same, so long answers weigh more. `seq_mean`: every sequence weighs the same, shared by its
    tokens. `constant` (Dr. GRPO): token sums divided by sequences × `constant_tokens`, so a token's weight
    depends on neither its sequence's length nor the batch's. Metrics other than the losses stay token means."""
    constant_tokens: int = Field(1024, ge=1)
    """`aggregation: constant`'s per-sequence normaliser (Dr. GRPO uses the generation's max tokens)."""
    normalize_advantage_std: bool = True
    """GRPO advantages divided by their group's reward std (GRPO); False keeps the raw difference from the
    group mean (Dr. GRPO), which does not up-weight groups whose rewards barely differ."""
    advantage_std_floor: float = Field(0.0, ge=0.0)
    """With `normalize_advantage_std`, the group std is taken as at least this: a group whose rewards differ by
    less (one member straying a little from a route all the others follow) gets advantages in proportion, not
    blown up to ±1 std. E.g. 0.1 for rewards on a 0–1 scale; 0: plain GRPO."""

    @model_validator(mode="after")
    def _coverage_is_over_actions(self) -> LossConfig:
        if self.action_bonus == "coverage" and self.entropy_over != "actions":
            raise ValueError("action_bonus: coverage is a bonus over the env's actions: set entropy_over: actions")
        if self.action_bonus == "coverage" and self.entropy_target is not None:
            raise ValueError(
                "entropy_target controls an entropy: use it with action_bonus: entropy, or set a "
                "fixed entropy_coef for coverage"
            )
        return self

    @model_validator(mode="after")
    def _entropy_start_within_its_cap(self) -> LossConfig:
        if self.entropy_target is not None and self.entropy_coef > self.entropy_coef_max:
            raise ValueError(
                f"entropy_coef ({self.entropy_coef}) is the adaptive weight's start: it must not exceed "
                f"entropy_coef_max ({self.entropy_coef_max})"
            )
        return self


class ParallelConfig(Section):
    """How the megatron trainer splits its work over ranks: `tensor` (T) ranks share each layer, `data` (D)
    groups of them train on different sequences of the batch. T × D ranks in all, on one or more nodes.
    `expert` (E, mixture-of-experts models only) splits each MoE layer's experts over E of the D data-parallel
    groups (as megatron does: it adds no ranks), so D must be a multiple of E."""

    tensor: int = Field(1, ge=1, le=64)
    data: int = Field(1, ge=1, le=4096)
    expert: int = Field(1, ge=1, le=4096)
    pipeline: int = Field(1, ge=1, description="not supported yet: must be 1")

    @model_validator(mode="after")
    def _experts_split_data(self) -> ParallelConfig:
        if self.data % self.expert:
            raise ValueError(
                f"parallel.expert {self.expert} must divide parallel.data {self.data}: expert parallelism splits "
                f"the data-parallel ranks (e.g. parallel: {{data: {self.expert * max(1, self.data // self.expert)}, "
                f"expert: {self.expert}}})"
            )
        return self

    @field_validator("pipeline")
    @classmethod
    def _no_pipeline_yet(cls, pipeline: int) -> int:
        if pipeline != 1:
            raise ValueError(
                f"pipeline parallelism is not supported yet (got {pipeline}); use tensor and data parallelism, "
                "e.g. parallel: {tensor: 8, data: 4}"
            )
        return pipeline

    @property
    def world_size(self) -> int:
        """Ranks the trainer runs: tensor × data."""
        return self.tensor * self.data


class FsdpConfig(Section):
    """The torch backend over several ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters,
    gradients and optimizer state sharded over `ranks` data-parallel processes that the trainer worker starts
    (gloo on CPUs, NCCL on GPUs), each training on its share of the batch's sequences. Any model transformers
    loads whose decoder layers it names (`_no_split_modules`); with `lora` peft wraps it first and the frozen
    base is sharded too. Checkpoints are sharded (torch.distributed.checkpoint) and resume at another `ranks`."""

    ranks: int = Field(2, ge=1, le=4096)
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (gathered again for the backward): less memory,
    one more all-gather per layer (FSDP2's default; ZeRO-3). False keeps them until the backward (ZeRO-2-like)."""


class PackingConfig(Section):
    """Packed sequences: a micro-batch is one flat stream of whole sequences, up to `max_tokens` tokens, with
    attention kept within each sequence, instead of a `[batch, longest]` block of padding (`micro_batch_size`
    is then unused). Sequences are binned first-fit decreasing; position ids restart at 0 per sequence (rotary
    embeddings are each sequence's own). The attention, torch backend: flash-attention's varlen kernel on a GPU
    with it installed and 16-bit weights, else torch's sdpa once per sequence. Megatron: a block-diagonal causal
    mask over the `[N, N]` stream, whose size is why `max_tokens` should stay moderate there. The loss is the
    padded path's, on the same per-sequence rows (docs/training.md)."""

    max_tokens: int = Field(8192, ge=16)
    """Tokens per packed micro-batch (per data-parallel rank); a sequence longer than this is a micro-batch of
    its own."""


class LRScheduleConfig(Section):
    """How the learning rate moves over training steps: a linear warm-up to `trainer.lr` over `warmup_steps`,
    then `constant`, or a `cosine` decay to `min_ratio` × lr over `decay_steps` (default: the rest of
    `training.steps`, filled in by the job's training plan). The rate is a function of the step number alone
    (activities/training/lr_schedule.py), so a resumed trainer or a continued job picks it up where it was."""

    kind: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    decay_steps: int | None = Field(None, ge=1)
    min_ratio: float = Field(0.0, ge=0.0, le=1.0)


class LoraConfig(Section):
    """Low-rank adapters (peft's LoRA) instead of full fine-tuning: only the adapters train and are published.

    Each targeted linear layer W gets W + (alpha / rank) · B·A, A of `rank` rows and B of `rank` columns, B
    starting at zero (so version 0 is the base model). The base weights stay frozen: the optimizer holds only
    the adapters (a small share of the parameters), checkpoints and published versions are the adapter alone, and
    generation engines serve each version as a vLLM LoRA adapter on the base they loaded once. `target_modules`
    are names of linear layers (`q_proj`, `down_proj`, ...; a model that lacks one is refused when it loads,
    naming those it has), or `all-linear`.
    """

    rank: int = Field(8, ge=1, le=512)
    alpha: float = Field(16.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input while training. Above 0 the trainer's log-probs are those of a
    thinned adapter, no longer the engine's (the `logprob_diff_*` metrics show it)."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """The linear layers that get adapters, by the last part of their names; `all-linear` (peft's shorthand):
    every linear layer but the output head."""

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, modules: list[str] | str) -> list[str] | str:
        if isinstance(modules, str):
            return modules
        if not modules:
            raise ValueError("give at least one module name (e.g. [q_proj, v_proj]), or all-linear")
        bad = [m for m in modules if not m.isidentifier()]
        if bad:
            raise ValueError(
                f"{bad} are not module names: give the last part of a linear layer's name (q_proj, not "
                "model.layers.0.self_attn.q_proj)"
            )
        if len(set(modules)) != len(modules):
            raise ValueError(f"module names repeat: {modules}")
        return modules


class TrainerConfig(Section):
    """The trainer: backend, parallel layout, device and precision, optimizer and checkpoints.

    `backend: torch` trains a transformers model in the trainer worker's own process (one device), or with
    `fsdp` sharded over `fsdp.ranks` rank processes. `backend: megatron` builds a megatron-core GPTModel from the
    same HF checkpoint and trains it on `parallel.tensor × parallel.data` rank processes (experts split over
    `parallel.expert` of the data ranks); rank processes are started by the trainer worker (gloo on CPUs,
    NCCL on GPUs); weights are published as HF safetensors either way. `device: auto` is cuda when a
    GPU is visible, else cpu, so one job file serves a laptop and a GPU cluster. `dtype: bfloat16`
    computes in bf16 with float32 master weights and optimizer state. AdamW with gradient
    accumulation over micro-batches of `micro_batch_size` sequences (per data-parallel rank).
    `mini_batches` × `ppo_epochs` optimizer updates per train step (PPO): the batch is cut into
    `mini_batches` parts and passed over `ppo_epochs` times; the clip against the proximal policy (the
    weights before the step's first update) engages from the second update on. `lora` trains low-rank
    adapters instead of every weight (None: full fine-tuning). `max_logprob_change` bounds how far one
    update may move the policy on the tokens it trained on (AdamW's step is normalised per weight, so after a
    run of tiny gradients one ordinary gradient moves every weight by ~lr at once: on a small model that can
    change the log-probs by nats in a single update, and undo what was learned).
    """

    backend: Literal["torch", "megatron"] = "torch"
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16"] = "float32"
    activation_checkpointing: bool = False
    lr: float = Field(1e-3, gt=0.0)
    lr_schedule: LRScheduleConfig = Field(default_factory=LRScheduleConfig)
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    micro_batch_size: int = Field(64, ge=1)
    mini_batches: int = Field(1, ge=1, le=1024, description="optimizer updates per pass over a train batch")
    ppo_epochs: int = Field(1, ge=1, le=64, description="passes over each train batch")
    max_logprob_change: float | None = Field(
        None,
        gt=0.0,
        description="a trust region per optimizer update: the mean |Δ log π| (nats) of the tokens it trained on, "
        "against the policy before the train step, at most; an update past it is halved until within it "
        "(None: off)",
    )
    checkpoint_every: int = Field(50, ge=1)
    seed: int = 0
    loss: LossConfig = Field(default_factory=LossConfig)
    lora: LoraConfig | None = None
    fsdp: FsdpConfig | None = None
    """The torch backend sharded over several ranks (FSDP2); None: one process on one device."""
    packing: PackingConfig | None = None
    """Pack micro-batches by tokens instead of padding them by sequences (None: padded, `micro_batch_size`)."""
    logprob_chunk_tokens: int = Field(1024, ge=1)
    """Log-probs and entropies are taken this many tokens at a time, so the fp32 `[tokens, vocabulary]` block
    of a whole micro-batch is never held at once (with a 150k vocabulary, 8k tokens are ~5 GB; 1024 tokens, ~0.6
    GB, a few of them live at a time). On the torch backend the LM head is applied chunk by chunk too, so the
    logits themselves never exist whole (`rl.chunked_logprobs`). Values do not depend on it; gradients only by
    fp32 rounding (the head's gradient sums over chunks)."""
    sequence: SequenceMode = "turn"
    """What one training sequence is. `turn`: every turn of a trajectory is its own sequence, its whole prompt
    then its sampled ids (a chat trajectory of k turns is k sequences whose prompts repeat the conversation so
    far). `trajectory`: a chat trajectory is ONE sequence, its first prompt then every turn's sampled ids (the
    loss tokens, with the engine's logprobs), each followed by the tokens of the env's next messages (in the
    sequence, masked out of the loss). Every sampled token sees the prefix the engine sampled it after, so both
    train the same log-probabilities; `trajectory` runs each token through the model once instead of once per
    later turn. Text envs' trajectories (each turn a prompt of its own) are trained per turn either way. With
    `loss.aggregation: seq_mean` or `constant` a sequence is the unit, so there the two weigh turns differently."""

    task_envs: dict[str, TaskEnv] = Field(
        default_factory=dict,
        description="filled by the training plan with `loss.entropy_over: actions`: each "
        "task's env, whose actions the trainer groups tokens by",
    )

    def over(self, steps: int) -> TrainerConfig:
        """This config for a run of `steps` training steps: a cosine schedule without `decay_steps` decays
        over the steps left after its warm-up."""
        schedule = self.lr_schedule
        if schedule.kind != "cosine" or schedule.decay_steps is not None:
            return self
        decay = max(1, steps - schedule.warmup_steps)
        return self.model_copy(update={"lr_schedule": schedule.model_copy(update={"decay_steps": decay})})

    def with_task_envs(self, tasks: Sequence[TaskSpec]) -> TrainerConfig:
        """This config with `task_envs` filled when the loss measures entropy over actions (else unchanged, so
        other jobs' histories carry nothing new)."""
        if self.loss.entropy_over != "actions":
            return self
        envs = {t.name: TaskEnv(env=t.env, env_args=t.env_args) for t in tasks}
        return self.model_copy(update={"task_envs": envs})

    @property
    def ranks(self) -> int:
        """Rank processes the trainer runs: tensor × data for megatron, `fsdp.ranks` for FSDP2, else 1."""
        if self.backend == "megatron":
            return self.parallel.world_size
        return self.fsdp.ranks if self.fsdp is not None else 1

    @model_validator(mode="after")
    def _fsdp_is_the_torch_backend(self) -> TrainerConfig:
        if self.fsdp is not None and self.backend != "torch":
            raise ValueError(
                "fsdp shards the torch backend's model; megatron shards its own (parallel: {tensor, data}): "
                "drop fsdp or set backend: torch"
            )
        return self

    @model_validator(mode="after")
    def _parallel_needs_megatron(self) -> TrainerConfig:
        if self.backend == "torch" and (self.parallel.world_size > 1 or self.parallel.expert > 1):
            raise ValueError(
                f"parallel: tensor {self.parallel.tensor} x data {self.parallel.data} needs backend: megatron "
                "(the torch backend shards over ranks with fsdp: {ranks: N} instead)"
            )
        return self

    @model_validator(mode="after")
    def _lora_needs_torch(self) -> TrainerConfig:
        if self.lora is not None and self.backend == "megatron":
            raise ValueError(
                "lora needs backend: torch: the megatron backend's layers are megatron-core's fused, tensor-parallel "
                "linears (linear_qkv, linear_fc1), which peft cannot wrap, and their adapters would have to be split "
                "over the ranks and mapped back to the HF names vLLM loads; train LoRA with backend: torch"
            )
        return self
