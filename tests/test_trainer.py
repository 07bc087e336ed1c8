"""The train_step activity on the tiny model: updates and publishes, replays, resumes, and learns a bandit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from rollart.activities.rl.weights_io import (
    load_checkpoint,
    load_tensors_into,
    save_checkpoint,
    state_dict_blob,
    unique_tensors,
)
from rollart.activities.trainer import TrainerActivities, checkpoint_dir, step_record_path
from rollart.client.local import published_tensors
from rollart.contracts.activities import SampleRef, TrainStepInput, TrainStepResult, turn_key
from rollart.contracts.errors import ErrorType
from rollart.contracts.store import StoredTurn
from rollart.infra.store.payload import LocalStore, StoreUnavailable
from rollart.infra.store.weights import latest_weights, manifest_key
from rollart.spec.config import LossConfig, TrainerConfig
from rollart.workflows import policies
from tests.support.batches import JOB, frozenlake_batch, load_model


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """The same tensors by name, bit for bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


METRICS = {
    "loss",
    "pg_loss",
    "entropy",
    "kl",
    "clip_frac",
    "is_weight_mean",
    "is_truncated_frac",
    "logprob_diff_behav",
    "grad_norm",
    "samples",
    "sequences",
    "tokens",
    "reward_mean",
    "success_rate",
    "adv_abs_mean",
    "groups_with_signal",
    "staleness_mean",
    "staleness_max",
    "lr",
    "train_s",
    "updates",
}


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    return AutoTokenizer.from_pretrained(tiny_model)


def step_input(
    tiny_model: Path, run_dir: Path, step: int, samples: list[SampleRef], **trainer: object
) -> TrainStepInput:
    return TrainStepInput(
        job_id=JOB,
        step=step,
        samples=samples,
        model_dir=str(tiny_model),
        run_dir=str(run_dir),
        trainer=TrainerConfig(**trainer),
    )


async def test_a_step_updates_publishes_and_replays_without_change(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    initial = load_model(tiny_model)
    samples = frozenlake_batch(store, initial, tok)
    acts = TrainerActivities(store)
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    inp = step_input(tiny_model, tmp_path / "run", 0, samples)

    result = await env.run(acts.train_step, inp)
    assert (result.step, result.version, result.weights_key, result.replayed) == (0, 1, manifest_key(JOB, 1), False)
    assert set(result.metrics) >= METRICS
    m = result.metrics
    assert m["logprob_diff_behav"] < 1e-4  # on-policy: the trainer recomputes the engine's logprobs
    assert m["samples"] == 16 and m["sequences"] == 17 and m["tokens"] == 34
    assert m["clip_frac"] == 0.0 and m["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["kl"] == 0.0 and m["staleness_max"] == 0.0 and beats
    assert latest_weights(store, JOB).version == 1
    weights = published_tensors(store, result.weights_key)
    assert "lm_head.weight" not in weights and not same(weights, unique_tensors(initial))  # the weights moved
    published = load_model(tiny_model)
    load_tensors_into(published, weights)  # the tied head is left out, and stays tied
    assert published.lm_head.weight is published.model.embed_tokens.weight
    assert same(unique_tensors(published), weights)

    again = await env.run(acts.train_step, inp)
    assert again.replayed and again.model_copy(update={"replayed": False}) == result
    assert same(unique_tensors(acts._jobs[JOB].policy.model), weights)  # the replay changed nothing
    assert TrainStepResult.model_validate_json(step_record_path(tmp_path / "run", 0).read_bytes()) == result


async def test_bad_calls_fail_with_errors_that_say_what_to_do(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    acts = TrainerActivities(store)
    env = ActivityEnvironment()
    run = tmp_path / "run"

    with pytest.raises(ApplicationError) as err:
        await env.run(acts.train_step, step_input(tiny_model, run, 2, samples))
    assert err.value.type == "TrainerStateMismatch" and err.value.non_retryable
    assert "completed no step" in err.value.message and "next step it can run is 0" in err.value.message

    with pytest.raises(ApplicationError) as err:
        await env.run(acts.train_step, step_input(tiny_model, run, 0, []))
    assert err.value.type == "InvalidInput" and err.value.non_retryable and "no samples" in err.value.message

    lost = samples[0].model_copy(update={"turn_keys": ["trajectories/job/gone/turn-000"]})
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.train_step, step_input(tiny_model, run, 0, [lost, *samples[1:]]))
    assert err.value.type == "InvalidInput" and "trajectories/job/gone/turn-000" in err.value.message

    await env.run(acts.train_step, step_input(tiny_model, run, 0, samples))  # the failures left the state usable
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.train_step, step_input(tiny_model, run, 3, samples))
    assert err.value.type == "TrainerStateMismatch" and "up to 0" in err.value.message


class FlakyStore(LocalStore):
    """A local store whose reads fail `outages` times first: the store briefly unavailable."""

    def __init__(self, root: Path, outages: int) -> None:
        super().__init__(root)
        self.outages = outages

    def get(self, key: str) -> bytes:
        if self.outages > 0:
            self.outages -= 1
            raise StoreUnavailable(f"store down while reading {key}")
        return super().get(key)


async def test_an_error_of_the_step_itself_fails_at_once_and_infra_errors_are_retried(
    tiny_model: Path, tok, tmp_path: Path
) -> None:
    """A deterministic error (here a token id past the vocabulary: an IndexError in the embedding) is not retried;
    a store that is briefly down and a dead rank are."""
    store = FlakyStore(tmp_path / "store", outages=0)
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    record = StoredTurn.from_bytes(store.get(samples[0].turn_keys[0]))
    broken = record.completions[0].model_copy(update={"token_ids": [10**6, 1]})
    store.put("bad/turn-000", record.model_copy(update={"completions": [broken]}).to_bytes())
    bad = samples[0].model_copy(update={"turn_keys": ["bad/turn-000"], "completion_index": 0})
    acts = TrainerActivities(store)
    env = ActivityEnvironment()
    run = tmp_path / "run"

    with pytest.raises(ApplicationError) as err:
        await env.run(acts.train_step, step_input(tiny_model, run, 0, [bad, *samples[1:]]))
    assert err.value.type == "TrainStepFailed" and err.value.non_retryable
    assert "train step 0 of job 'job'" in err.value.message and "IndexError" in err.value.message
    assert "TrainStepFailed" in policies.TRAIN_STEP.retry.non_retryable_error_types
    assert not policies.TRAIN_STEP.retry.maximum_attempts  # a lost trainer (heartbeat timeout) is retried on

    store.outages = 1
    with pytest.raises(StoreUnavailable):  # not an ApplicationError: Temporal retries it
        await env.run(acts.train_step, step_input(tiny_model, run, 0, samples))
    assert (await env.run(acts.train_step, step_input(tiny_model, run, 0, samples))).version == 1

    class DeadRank:
        def run_step(self, inp: TrainStepInput, cancelled: object) -> TrainStepResult:
            raise ApplicationError("trainer rank 1 exited with code -9", type=ErrorType.TRAINER_RANK_FAILED)

    on_ranks = TrainerActivities(store, ranks=DeadRank())
    with pytest.raises(ApplicationError) as err:
        await env.run(on_ranks.train_step, step_input(tiny_model, tmp_path / "run2", 0, samples, backend="megatron"))
    assert err.value.type == "TrainerRankFailed" and not err.value.non_retryable


def test_the_megatron_agent_fails_a_step_its_own_code_fails() -> None:
    """Ranks report an exception of the step's own kind at once; a RuntimeError (a dead peer looks like one) fails
    the step only when fresh ranks fail it again with the same cause."""
    from rollart.workers.rank_messages import RankError
    from rollart.workers.trainer_rank import _step_error_type
    from rollart.workers.trainer_ranks import RankGroup, _rank_failed

    assert _step_error_type(IndexError("index out of range in self")) == "TrainStepFailed"
    assert _step_error_type(RuntimeError("Connection closed by peer")) is None
    assert _step_error_type(ConnectionResetError()) is None and _step_error_type(KeyboardInterrupt()) is None
    group = RankGroup()
    try:
        shape = RankError(
            type="RuntimeError",
            message="trainer rank 1 failed in step 3: RuntimeError: size mismatch",
            cause="RuntimeError: size mismatch",
        )
        first = _rank_failed(group._repeated(shape, "job", 3), 3, "job")
        assert first.type == "TrainerRankFailed" and not first.non_retryable
        again = _rank_failed(group._repeated(shape, "job", 3), 3, "job")
        assert again.type == "TrainStepFailed" and again.non_retryable and "train step 3 of job 'job'" in again.message
        died = RankError(type="TrainerRankDied", message="trainer rank 1 (pid 9, node 0) exited with code -9")
        for _ in range(2):
            assert not _rank_failed(group._repeated(died, "job", 4), 4, "job").non_retryable
        own = RankError(
            type="TrainStepFailed",
            message="trainer rank 0 failed in step 5: IndexError: index out of range in self",
            non_retryable=True,
            cause="IndexError: index out of range in self",
        )
        assert _rank_failed(group._repeated(own, "job", 5), 5, "job").type == "TrainStepFailed"
    finally:
        group.close()


async def test_checkpoints_and_a_fresh_trainer_resumes_at_the_right_step(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    run = tmp_path / "run"
    env = ActivityEnvironment()
    acts = TrainerActivities(store)
    for step in range(2):
        await env.run(acts.train_step, step_input(tiny_model, run, step, samples, checkpoint_every=2))
    assert [p.name for p in checkpoint_dir(run).iterdir()] == ["step-000001"]  # after every 2 steps

    resumed = TrainerActivities(store)
    with pytest.raises(ApplicationError) as err:
        await env.run(resumed.train_step, step_input(tiny_model, run, 5, samples, checkpoint_every=2))
    assert "up to 1" in err.value.message and "next step it can run is 2" in err.value.message
    policy = resumed._jobs[JOB].policy
    assert same(unique_tensors(policy.model), published_tensors(store, manifest_key(JOB, 2)))
    assert policy.optimizer.state_dict()["optimizer"]["state"]  # Adam moments came back too
    r2 = await env.run(resumed.train_step, step_input(tiny_model, run, 2, samples, checkpoint_every=2))
    assert r2.version == 3 and not r2.replayed

    # Step 2 was not checkpointed: a trainer restarted now continues from its published weights.
    third = TrainerActivities(store)
    r3 = await env.run(third.train_step, step_input(tiny_model, run, 3, samples, checkpoint_every=2))
    assert r3.version == 4 and r3.metrics["staleness_max"] == 3.0
    assert sorted(p.name for p in checkpoint_dir(run).iterdir()) == ["step-000001", "step-000003"]


async def test_the_optimizer_steps_at_the_schedules_rate(tiny_model: Path, tok, tmp_path: Path) -> None:
    """Warm-up: step s uses lr × (s + 1) / warmup_steps, in the optimizer itself and in the step's metrics."""
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    env, acts = ActivityEnvironment(), TrainerActivities(store)
    schedule = {"warmup_steps": 4}
    for step, expected in enumerate([2.5e-4, 5e-4]):
        result = await env.run(
            acts.train_step, step_input(tiny_model, tmp_path / "run", step, samples, lr=1e-3, lr_schedule=schedule)
        )
        assert result.metrics["lr"] == pytest.approx(expected)
        assert acts._jobs[JOB].policy.optimizer.optimizer.param_groups[0]["lr"] == pytest.approx(expected)


async def test_dr_grpo_settings_reach_the_step(tiny_model: Path, tok, tmp_path: Path) -> None:
    """`normalize_advantage_std: false` trains on raw group-mean differences; `aggregation` changes the loss only."""
    from rollart.activities.rl.advantages import grpo_advantages

    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    raw = grpo_advantages([s.reward for s in samples], [s.group_id for s in samples], normalize_std=False)
    results = {}
    for name, loss in {
        "token_mean": {},
        "dr_grpo": {"aggregation": "constant", "normalize_advantage_std": False},
    }.items():
        acts = TrainerActivities(store)
        inp = step_input(tiny_model, tmp_path / name, 0, samples, loss=LossConfig(**loss)).model_copy(
            update={"job_id": f"{JOB}-{name}"}
        )
        results[name] = (await ActivityEnvironment().run(acts.train_step, inp)).metrics
    assert results["dr_grpo"]["adv_abs_mean"] == pytest.approx(sum(map(abs, raw)) / len(raw))
    assert results["dr_grpo"]["adv_abs_mean"] != pytest.approx(results["token_mean"]["adv_abs_mean"])
    assert results["dr_grpo"]["pg_loss"] != pytest.approx(results["token_mean"]["pg_loss"])
    assert results["dr_grpo"]["logprob_diff_behav"] == pytest.approx(results["token_mean"]["logprob_diff_behav"])


async def test_ppo_mini_batches_and_epochs_clip_from_the_second_update(tiny_model: Path, tok, tmp_path: Path) -> None:
    """One update per batch never clips (the ratio is 1); 2 mini-batches x 2 epochs at a large rate do, and
    the step's metrics say how many updates it made."""
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    results = {}
    for name, ppo in {"one": {}, "ppo": {"mini_batches": 2, "ppo_epochs": 2}}.items():
        acts = TrainerActivities(store)
        inp = step_input(tiny_model, tmp_path / name, 0, samples, lr=0.05, micro_batch_size=4, **ppo)
        results[name] = (
            await ActivityEnvironment().run(acts.train_step, inp.model_copy(update={"job_id": f"{JOB}-{name}"}))
        ).metrics
    assert results["one"]["updates"] == 1.0 and results["one"]["clip_frac"] == 0.0
    assert results["ppo"]["updates"] == 4.0 and results["ppo"]["clip_frac"] > 0.0
    assert results["ppo"]["update_skipped"] == 0.0


async def test_a_batch_without_signal_leaves_the_weights_alone(tiny_model: Path, tok, tmp_path: Path) -> None:
    """After a step with signal (AdamW holds momentum), a batch whose groups all scored alike has a zero
    gradient: the update is not made, so the published weights are the previous version's, bit for bit."""
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    solved = [s.model_copy(update={"reward": 1.0, "success": True}) for s in samples]
    acts = TrainerActivities(store)
    env = ActivityEnvironment()
    first = await env.run(acts.train_step, step_input(tiny_model, tmp_path / "run", 0, samples, lr=0.01))
    second = await env.run(acts.train_step, step_input(tiny_model, tmp_path / "run", 1, solved, lr=0.01))
    assert first.metrics["grad_norm"] > 0 and first.metrics["updates_without_signal"] == 0.0
    assert second.metrics["grad_norm"] == 0.0 and second.metrics["groups_with_signal"] == 0.0
    assert second.metrics["updates_without_signal"] == 1.0 and second.metrics["update_skipped"] == 0.0
    assert same(published_tensors(store, second.weights_key), published_tensors(store, first.weights_key))
    third = await env.run(acts.train_step, step_input(tiny_model, tmp_path / "run", 2, samples, lr=0.01))
    assert not same(published_tensors(store, third.weights_key), published_tensors(store, second.weights_key))


def test_checkpoint_files_keep_the_latest_two(tiny_model: Path, tmp_path: Path) -> None:
    model = load_model(tiny_model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    for step in (4, 9, 14):
        save_checkpoint(tmp_path, model, opt, step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000009", "step-000014"]
    fresh = load_model(tiny_model)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert load_checkpoint(tmp_path, fresh, fresh_opt) == 14
    assert state_dict_blob(fresh) == state_dict_blob(model)
    assert load_checkpoint(tmp_path / "none", fresh, fresh_opt) is None


async def test_a_bandit_learns_to_say_R(tiny_model: Path, tok, tmp_path: Path) -> None:
    """Prompt "move:", reward 1 iff the first sampled token is "R": P(R) must rise clearly within 30 steps."""
    store = LocalStore(tmp_path / "store")
    acts = TrainerActivities(store)
    env = ActivityEnvironment()
    sampler = load_model(tiny_model)
    prompt_ids = tok("move:", add_special_tokens=False)["input_ids"]
    r_id = tok.convert_tokens_to_ids("R")
    gen = torch.Generator().manual_seed(0)
    groups, group_size = 32, 8

    @torch.no_grad()
    def p_r() -> float:
        return float(torch.softmax(sampler(torch.tensor([prompt_ids])).logits[0, -1], -1)[r_id])

    p0 = p_r()
    for step in range(30):
        with torch.no_grad():  # one prompt: one forward serves every sample of the step
            logp = torch.log_softmax(sampler(torch.tensor([prompt_ids])).logits[0, -1], -1)
        samples = []
        for g in range(groups):
            key = turn_key(JOB, f"s{step}-g{g}", 0)
            toks = torch.multinomial(logp.exp(), group_size, replacement=True, generator=gen).tolist()
            completions = [
                {"text": "", "token_ids": [t], "logprobs": [float(logp[t])], "finish_reason": "length"} for t in toks
            ]
            record = {
                "prompt": "move:",
                "prompt_ids": prompt_ids,
                "policy_version": step,
                "policy_version_end": step,
                "completions": completions,
            }
            store.put_json(key, record)
            for i, c in enumerate(record["completions"]):
                hit = c["token_ids"][0] == r_id
                samples.append(
                    SampleRef(
                        trajectory_id=f"s{step}-g{g}-{i}",
                        task="bandit",
                        group_id=f"s{step}-g{g}",
                        reward=float(hit),
                        success=hit,
                        turn_keys=[key],
                        policy_version_min=step,
                        policy_version_max=step,
                        completion_index=i,
                    )
                )
        inp = step_input(tiny_model, tmp_path / "run", step, samples, micro_batch_size=256)
        result = await env.run(acts.train_step, inp)
        load_tensors_into(sampler, published_tensors(store, result.weights_key))
    p30 = p_r()
    assert p30 > max(3 * p0, 0.2), f"P(R) went from {p0:.4f} to {p30:.4f} in 30 steps"  # measured: 0.003 → ~0.8


async def test_the_kl_term_loads_a_frozen_reference_policy(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    acts = TrainerActivities(store)
    env = ActivityEnvironment()
    loss = LossConfig(kl_coef=0.1, entropy_coef=0.01)
    kls = []
    for step in range(2):
        inp = step_input(tiny_model, tmp_path / "run", step, samples, loss=loss)
        kls.append((await env.run(acts.train_step, inp)).metrics["kl"])
    assert kls[0] == pytest.approx(0.0, abs=1e-8) and kls[1] > 0.0  # π = π_ref before the first update only
    assert not any(p.requires_grad for p in acts._jobs[JOB].policy._ref.parameters())


async def test_bf16_trains_with_fp32_masters_and_checkpointing_keeps_the_step(
    tiny_model: Path, tok, tmp_path: Path
) -> None:
    """dtype bfloat16: the model computes in bf16, AdamW steps fp32 masters, the blob is float32 for the engines.
    activation_checkpointing: recomputing activations in backward publishes the same weights."""
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    env = ActivityEnvironment()
    results = {}
    for name, extra in {
        "plain": {},
        "recompute": {"activation_checkpointing": True},
        "bf16": {"dtype": "bfloat16"},
    }.items():
        acts = TrainerActivities(store)
        run = tmp_path / name
        results[name] = await env.run(
            acts.train_step, step_input(tiny_model, run, 0, samples, **extra).model_copy(update={"job_id": name})
        )
        policy = acts._jobs[name].policy
        if name == "bf16":
            assert all(p.dtype == torch.bfloat16 for p in policy.params)
            assert all(m.dtype == torch.float32 for m in policy.optimizer.masters)
    plain, recompute, bf16 = (published_tensors(store, results[n].weights_key) for n in ("plain", "recompute", "bf16"))
    assert max(float((plain[k] - recompute[k]).abs().max()) for k in plain) < 1e-6
    assert all(t.dtype == torch.float32 for t in bf16.values())
    assert max(float((plain[k] - bf16[k]).abs().max()) for k in plain) < 0.05  # bf16 rounding, same update
    assert results["bf16"].metrics["loss"] == pytest.approx(results["plain"].metrics["loss"], abs=0.05)


async def test_the_advantage_std_floor_reaches_the_step(tiny_model: Path, tok, tmp_path: Path) -> None:
    """`advantage_std_floor` above every group's std: the step's advantages are the raw differences / the floor."""
    from rollart.activities.rl.advantages import grpo_advantages

    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    raw = grpo_advantages([s.reward for s in samples], [s.group_id for s in samples], normalize_std=False)
    inp = step_input(tiny_model, tmp_path / "run", 0, samples, loss=LossConfig(advantage_std_floor=10.0))
    metrics = (await ActivityEnvironment().run(TrainerActivities(store).train_step, inp)).metrics
    assert any(raw) and metrics["adv_abs_mean"] == pytest.approx(sum(map(abs, raw)) / len(raw) / 10.0, rel=1e-4)


async def test_the_trust_region_keeps_a_steps_change_within_its_limit(tiny_model: Path, tok, tmp_path: Path) -> None:
    """AdamW's first step moves every weight by the learning rate (m / √v is ±1): at lr 0.002 that moves the tiny
    model's trained log-probs by more than 0.2 nats. With `max_logprob_change: 0.2` the update is halved until
    within it, and the record says how far it moved and how often it was halved; an update that stays
    within a limit is left whole."""
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    results = {}
    for name, limit in {"free": None, "limited": 0.2, "loose": 50.0}.items():
        inp = step_input(tiny_model, tmp_path / name, 0, samples, lr=0.002, max_logprob_change=limit)
        acts = TrainerActivities(store)
        results[name] = (
            await ActivityEnvironment().run(acts.train_step, inp.model_copy(update={"job_id": f"{JOB}-{name}"}))
        ).metrics
    assert "logprob_change" not in results["free"] and "update_shrinks" not in results["free"]
    limited, loose = results["limited"], results["loose"]
    assert loose["update_shrinks"] == 0 and loose["logprob_change"] > 0.2  # the whole update moves it that far
    assert 1 <= limited["update_shrinks"] < 6 and 0 < limited["logprob_change"] <= 0.2
