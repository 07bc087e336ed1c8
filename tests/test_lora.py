"""LoRA (`trainer.lora`) without vLLM: the config, the trainer (only adapters train, publish and checkpoint; the
base is the KL reference; resume), the adapter store, the HF engine and the generate activity serving adapters,
and `rollart eval` / `rollart export` of a LoRA run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollart.activities.engines.base import (
    Completion,
    Engine,
    EngineOutput,
    WeightsBlobError,
    check_adapter_dir,
)
from rollart.activities.engines.hf_engine import HfEngine
from rollart.activities.generate import GenerateActivities
from rollart.activities.rl.adapter_io import load_adapter_blob_into, with_lora
from rollart.activities.trainer import TrainerActivities, checkpoint_dir
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.client.local import trainer_logprobs
from rollart.contracts.activities import SampleRef, TrainStepInput, TrainStepResult
from rollart.contracts.generation import GenerateInput, WeightsRef
from rollart.infra.store.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_key,
    fetch_adapter,
    is_adapter_key,
    latest_adapter,
    publish_adapter,
)
from rollart.infra.store.payload import LocalStore
from rollart.infra.store.weights import WeightsManifest, WeightsSource, commit, manifest_key
from rollart.spec.config import JobSpec, LoraConfig, LossConfig, SamplingParams, TrainerConfig, load_job
from rollart.spec.config.load import JobSpecError
from tests.support.batches import JOB, frozenlake_batch, load_model
from tests.support.cli import rollart

LORA = LoraConfig(rank=8, alpha=16)
ENV = ActivityEnvironment()


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    return AutoTokenizer.from_pretrained(tiny_model)


def step_input(model: Path, run: Path, step: int, samples: list[SampleRef], **trainer: object) -> TrainStepInput:
    cfg = TrainerConfig(**{"lora": LORA, "lr": 1e-2, **trainer})
    return TrainStepInput(job_id=JOB, step=step, samples=samples, model_dir=str(model), run_dir=str(run), trainer=cfg)


def sequences(store: LocalStore, samples: list[SampleRef]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of each sample's first turn."""
    out = []
    for s in samples:
        record = store.get_json(s.turn_keys[0])
        out.append((record["prompt_ids"], record["completions"][s.completion_index]["token_ids"]))
    return out


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


# --- the config ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trainer", "engine", "expected"),
    [
        ("{backend: megatron, lora: {rank: 8}}", "{}", "lora needs backend: torch: the megatron backend's layers"),
        ("{lora: {target_modules: []}}", "{}", "trainer.lora.target_modules: Value error, give at least one module"),
        ("{lora: {target_modules: [model.layers.0.q_proj]}}", "{}", "not module names"),
        ("{lora: {rank: 0}}", "{}", "trainer.lora.rank"),
        ("{lora: {rank: 16}}", "{max_lora_rank: 8}", "engine.max_lora_rank (8) is below trainer.lora.rank (16)"),
        ("{lora: {dropout: 1.0}}", "{}", "trainer.lora.dropout"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_field(
    tmp_path: Path, trainer: str, engine: str, expected: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"tasks:\n  - {{name: a, env: frozenlake, reward: success}}\ntrainer: {trainer}\nengine: {engine}\n")
    with pytest.raises(JobSpecError) as err:
        load_job(job)
    assert expected in str(err.value)


def test_engines_follow_the_adapters_rank() -> None:
    tasks = [{"name": "a", "env": "frozenlake", "reward": "success"}]
    assert JobSpec(tasks=tasks).engine.max_lora_rank is None  # full fine-tuning: vLLM without LoRA layers
    assert JobSpec(tasks=tasks, trainer={"lora": {"rank": 4}}).engine.max_lora_rank == 4
    assert JobSpec(tasks=tasks, trainer={"lora": {}}, engine={"max_lora_rank": 32}).engine.max_lora_rank == 32
    example = load_job(Path(__file__).resolve().parent.parent / "examples" / "frozenlake_lora.yaml")
    assert example.trainer.lora is not None and example.engine.max_lora_rank == example.trainer.lora.rank


async def test_targets_the_model_lacks_are_refused_naming_those_it_has(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    inp = step_input(tiny_model, tmp_path / "run", 0, samples, lora=LoraConfig(target_modules=["q_proj", "c_attn"]))
    with pytest.raises(ApplicationError) as err:
        await ENV.run(TrainerActivities(store).train_step, inp)
    assert err.value.non_retryable
    assert "has no linear layer named c_attn; its linear layers: down_proj, gate_proj, k_proj, o_proj, q_proj" in str(
        err.value
    )


# --- the trainer ---------------------------------------------------------------------------------------------


async def test_only_the_adapters_train_and_go_out(tiny_model: Path, tok, tmp_path: Path) -> None:
    """The optimizer holds the adapters alone; the base does not move; a step publishes the adapter in peft's layout,
    which peft loads on the base to the trainer's own logprobs."""
    from peft import PeftModel

    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    acts = TrainerActivities(store)
    result = await ENV.run(acts.train_step, step_input(tiny_model, tmp_path / "run", 0, samples))
    policy = acts._jobs[JOB].policy
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adam = policy.optimizer.optimizer.param_groups[0]["params"]
    assert len(adam) == len(trainable) == len(policy.params) and sum(p.numel() for p in adam) == 47_104
    base = load_model(tiny_model).state_dict()
    with policy.model.disable_adapter():
        for name, p in policy.model.get_base_model().state_dict().items():
            if "lora_" not in name:
                assert torch.equal(p, base[name.replace(".base_layer", "")]), name  # frozen

    assert result.weights_key == adapter_key(JOB, 1) and is_adapter_key(result.weights_key)
    assert latest_adapter(store, JOB).version == 1 and not store.exists(manifest_key(JOB, 1))  # no full weights
    published = store.root / "adapters" / JOB / "v000001"
    assert sorted(p.name for p in published.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    config = check_adapter_dir(published, max_rank=8)
    assert (config["r"], config["lora_alpha"], config["use_dora"], config["bias"]) == (8, 16, False, "none")
    assert len(st_load(store.get(result.weights_key))) == 28  # A and B of 7 linear layers × 2 layers

    seqs = sequences(store, samples)
    peft_model = PeftModel.from_pretrained(load_model(tiny_model), str(published)).eval()
    with torch.no_grad():
        by_peft = []
        for prompt, completion in seqs:
            logp = torch.log_softmax(peft_model(torch.tensor([prompt + completion])).logits[0], -1)
            by_peft.append([float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)])
    trainer = trainer_logprobs(tiny_model, store.get(result.weights_key), seqs, lora=LORA)
    assert max_diff(by_peft, trainer) < 1e-5
    assert max_diff(trainer_logprobs(tiny_model, None, seqs), trainer) > 1e-3  # the adapter changed the policy


async def test_the_reference_policy_is_the_base_with_adapters_off(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    acts = TrainerActivities(store)
    kls = []
    for step in range(2):
        inp = step_input(tiny_model, tmp_path / "run", step, samples, loss=LossConfig(kl_coef=0.1))
        kls.append((await ENV.run(acts.train_step, inp)).metrics["kl"])
    assert kls[0] == pytest.approx(0.0, abs=1e-8) and kls[1] > 0.0  # B starts at 0: v0 is the base
    policy = acts._jobs[JOB].policy
    assert policy._ref is None  # no second copy of the model
    from rollart.activities.rl.batch import TrainSequence, collate

    seqs = sequences(store, samples)
    mb = collate([TrainSequence(p, c, [0.0] * len(c), 0.0) for p, c in seqs], policy.pad_id)
    ref = policy.ref_logprobs(mb)
    base = trainer_logprobs(tiny_model, None, seqs)
    assert (
        max(abs(float(ref[i, len(p) + j]) - base[i][j]) for i, (p, c) in enumerate(seqs) for j in range(len(c))) < 1e-5
    )


async def test_checkpoints_hold_the_adapter_and_a_fresh_trainer_resumes(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    run = tmp_path / "run"
    acts = TrainerActivities(store)
    for step in range(3):
        await ENV.run(acts.train_step, step_input(tiny_model, run, step, samples, checkpoint_every=2))
    (ckpt,) = checkpoint_dir(run).iterdir()
    assert ckpt.name == "step-000001"
    assert sorted(p.name for p in ckpt.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS, "meta.json", "optimizer.pt"]
    assert json.loads((ckpt / "meta.json").read_text())["lora"] is True
    assert (ckpt / ADAPTER_WEIGHTS).stat().st_size < 250_000  # the adapter (47k floats), not the 0.56M-param base

    # step 2 is recorded but not checkpointed: a fresh trainer takes the checkpoint's optimizer and v3's adapter
    fresh = TrainerActivities(store)
    r3 = await ENV.run(fresh.train_step, step_input(tiny_model, run, 3, samples, checkpoint_every=2))
    assert r3.version == 4 and not r3.replayed
    again = TrainerActivities(store)
    with pytest.raises(ApplicationError):  # only to load it: step 9 is not the next one
        await ENV.run(again.train_step, step_input(tiny_model, run, 9, samples, checkpoint_every=2))
    policy = again._jobs[JOB].policy
    assert policy.adapter_files()[ADAPTER_WEIGHTS] == store.get(adapter_key(JOB, 4))
    assert policy.optimizer.state_dict()["optimizer"]["state"]  # Adam moments of the adapters came back

    full = TrainerActivities(store)  # the same run dir without trainer.lora: refused, saying why
    with pytest.raises(ApplicationError) as err:
        await ENV.run(full.train_step, step_input(tiny_model, run, 4, samples, lora=None))
    assert err.value.non_retryable and "written with trainer.lora" in err.value.message


def test_an_adapter_of_another_rank_does_not_load(tiny_model: Path) -> None:
    small = with_lora(load_model(tiny_model), LoraConfig(rank=4))
    other = TorchPolicy(tiny_model, TrainerConfig(lora=LORA), torch.device("cpu"))
    blob = other.adapter_files()[ADAPTER_WEIGHTS]
    with pytest.raises(ValueError, match=r"another trainer\.lora"):
        load_adapter_blob_into(small, blob)


async def test_bf16_and_recomputed_activations_train_the_adapters(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    blobs = {}
    for name, extra in {
        "plain": {},
        "recompute": {"activation_checkpointing": True},
        "bf16": {"dtype": "bfloat16"},
    }.items():
        acts = TrainerActivities(store)
        inp = step_input(tiny_model, tmp_path / name, 0, samples, **extra).model_copy(update={"job_id": name})
        blobs[name] = st_load(store.get((await ENV.run(acts.train_step, inp)).weights_key))
        assert all(m.dtype == torch.float32 for m in acts._jobs[name].policy.optimizer.masters)
    plain, recompute, bf16 = (torch.cat([b[k].flatten() for k in sorted(b) if "lora_B" in k]) for b in blobs.values())
    assert float(plain.abs().max()) > 1e-3  # B left 0
    assert float((plain - recompute).abs().max()) < 1e-6
    # bf16 rounding flips the sign of Adam's first step on the smallest gradients, not the update as a whole
    assert float(torch.nn.functional.cosine_similarity(plain, bf16, dim=0)) > 0.9


# --- the adapter store ---------------------------------------------------------------------------------------


def test_published_adapters_keep_the_newest_and_fetch_into_peft_layout(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    files = {ADAPTER_CONFIG: b"{}", ADAPTER_WEIGHTS: b"w"}
    for v in range(1, 5):
        ref = publish_adapter(store, "j", v, {**files, ADAPTER_WEIGHTS: f"w{v}".encode()}, keep=2)
    assert ref.key == "adapters/j/v000004/adapter_model.safetensors" and ref.prefix == "adapters/j/v000004"
    assert [store.exists(adapter_key("j", v)) for v in range(1, 5)] == [False, False, True, True]
    assert not store.exists(adapter_key("j", 2, ADAPTER_CONFIG))
    fetched, path = fetch_adapter(store, "j", tmp_path / "pulled")
    assert fetched.version == 4 and (path / ADAPTER_WEIGHTS).read_bytes() == b"w4"
    assert (path / ADAPTER_CONFIG).read_bytes() == b"{}"
    assert fetch_adapter(store, "other", tmp_path / "pulled") is None
    assert not is_adapter_key(manifest_key("j", 1))
    with pytest.raises(ValueError, match="an adapter is the files"):
        publish_adapter(store, "j", 5, {ADAPTER_WEIGHTS: b"w"})


# --- serving ---------------------------------------------------------------------------------------------------


async def test_the_hf_engine_serves_adapters_on_its_base(tiny_model: Path, tok, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    acts = TrainerActivities(store)
    await ENV.run(acts.train_step, step_input(tiny_model, tmp_path / "run", 0, samples))
    engine = HfEngine(tiny_model, max_model_len=128)
    await engine.start()
    try:
        adapter = tmp_path / "v1"
        fetched, path = fetch_adapter(store, JOB, tmp_path / "pulled")
        path.rename(adapter)
        await engine.load_adapter(adapter, fetched.version, owned=True)
        assert engine.policy_version == 1 and not adapter.exists()  # read at once, so the copy went at once
        sampling = SamplingParams(temperature=1.0, top_k=0, max_tokens=8, n=3)
        out = await engine.generate("SFFF\nFHFH\nFFFH\nHFFG\nmove:", sampling, "r")
        assert (out.policy_version, out.policy_version_end) == (1, 1)
        seqs = [(out.prompt_ids, c.token_ids) for c in out.completions]
        want = trainer_logprobs(tiny_model, store.get(adapter_key(JOB, 1)), seqs, lora=LORA)
        assert max_diff([c.logprobs for c in out.completions], want) < 1e-4
        base = trainer_logprobs(tiny_model, None, seqs)
        await engine.load_adapter(None, 2)  # the base alone
        out = await engine.generate("SFFF\nFHFH\nFFFH\nHFFG\nmove:", sampling, "r")
        seqs = [(out.prompt_ids, c.token_ids) for c in out.completions]
        assert max_diff([c.logprobs for c in out.completions], trainer_logprobs(tiny_model, None, seqs)) < 1e-4
        assert max_diff(want, base) > 1e-3
        with pytest.raises(WeightsBlobError, match=r"no readable adapter_config\.json"):
            await engine.load_adapter(tmp_path / "nowhere", 3)
    finally:
        await engine.shutdown()


class AdapterEngine(Engine):
    """Records what it is asked to load; serves adapters unless built without them."""

    def __init__(self, lora: bool = True) -> None:
        self.lora = lora
        self.loads: list[tuple[str, int, bool]] = []

    async def start(self) -> None:
        pass

    async def generate(self, prompt: str, sampling: SamplingParams, request_id: str, priority: int = 0) -> EngineOutput:
        return EngineOutput([1], [Completion([2], [-0.1], "R", "length")], self.policy_version, self.policy_version)

    async def shutdown(self) -> None:
        pass

    def tokens_generated(self) -> int:
        return 0

    @property
    def serves_adapters(self) -> bool:
        return self.lora

    async def load_weights(self, source: WeightsSource | None, version: int, *, force: bool = False) -> None:
        self.loads.append((f"weights:v{source.manifest.version}" if source else "weights:model dir", version, force))
        self.policy_version = version

    async def load_adapter(self, path: Path | None, version: int, *, force: bool = False, owned: bool = False) -> None:
        assert path is not None and owned and (path / ADAPTER_WEIGHTS).read_bytes() == f"a{version}".encode()
        self.loads.append(("adapter", version, force))
        self.policy_version = version


async def test_generation_serves_a_lora_jobs_versions_as_adapters(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    engine = AdapterEngine()
    acts = GenerateActivities(engine, store, "h800-w", tmp_path)

    async def gen(activities: GenerateActivities, job: str, v: int) -> None:
        inp = GenerateInput(
            prompt="p", sampling=SamplingParams(), data_key="k", weights=WeightsRef(job_id=job, min_version=v)
        )
        await ENV.run(activities.generate, inp)

    def adapter(job: str, v: int) -> None:
        publish_adapter(store, job, v, {ADAPTER_CONFIG: b"{}", ADAPTER_WEIGHTS: f"a{v}".encode()})

    adapter("lora", 1)
    await gen(acts, "lora", 1)
    adapter("lora", 2)
    await gen(acts, "lora", 2)
    assert engine.loads == [("adapter", 1, False), ("adapter", 2, False)]  # the base never reloaded
    commit(store, WeightsManifest(job_id="full", version=3, dtype="float32", buckets=[]))
    await gen(acts, "full", 3)  # a full-weights job: its weights replace the base
    adapter("lora2", 1)
    await gen(acts, "lora2", 1)  # a LoRA job after it: the model dir's weights first, then its adapter
    assert engine.loads[2:] == [("weights:v3", 3, True), ("weights:model dir", 0, True), ("adapter", 1, True)]
    with pytest.raises(ApplicationError) as err:
        await gen(acts, "lora2", 5)  # not published yet: retried
    assert err.value.type == "WeightsNotPublished" and not err.value.non_retryable

    plain = GenerateActivities(AdapterEngine(lora=False), store, "h20-w", tmp_path)
    with pytest.raises(ApplicationError) as err:
        await gen(plain, "lora", 2)
    assert err.value.type == "AdaptersNotServed" and err.value.non_retryable
    assert "built without LoRA" in err.value.message


# --- eval and export -------------------------------------------------------------------------------------------


def test_eval_and_export_a_lora_runs_checkpoint(
    tiny_model: Path, tok, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands run their own event loop: this test is a plain function."""
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    run = tmp_path / "run"
    result: TrainStepResult = asyncio.run(
        ENV.run(TrainerActivities(store).train_step, step_input(tiny_model, run, 0, samples, checkpoint_every=1))
    )
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "model_dir": str(tiny_model),
                "store": {"path": str(store.root)},
                "trainer": {"lora": {"rank": 8}},
                "tasks": [{"name": "lake", "env": "frozenlake", "reward": "success", "max_turns": 2}],
            }
        )
    )
    done = rollart(capsys, "eval", str(job), "-n", "1", "--run-dir", str(run))  # (`--job-id`: the same loader)
    assert done.returncode == 0, done.stderr
    assert next(line.split() for line in done.stdout.splitlines() if line.startswith("lake"))[1] == "1"  # v1

    merged = rollart(capsys, "export", str(job), "--run-dir", str(run), "--out", str(tmp_path / "merged"), "--merge")
    assert merged.returncode == 0 and "adapter merged" in merged.stdout, merged.stderr
    alone = rollart(capsys, "export", str(job), "--job-id", JOB, "--out", str(tmp_path / "adapter"))
    assert alone.returncode == 0 and "the adapter alone" in alone.stdout, alone.stderr
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    again = rollart(capsys, "export", str(job), "--job-id", JOB, "--out", str(tmp_path / "adapter"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    both = rollart(capsys, "export", str(job), "--job-id", JOB, "--run-dir", str(run), "--out", str(tmp_path / "x"))
    assert both.returncode == 2 and "one of them" in both.stderr

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    assert not any("lora" in n for n, _ in plain.named_parameters())  # a plain model: no peft needed
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").encode("SFFF") == tok.encode("SFFF")
    seqs = sequences(store, samples)
    with torch.no_grad():
        got = []
        for prompt, completion in seqs:
            logp = torch.log_softmax(plain(torch.tensor([prompt + completion])).logits[0], -1)
            got.append([float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)])
    assert max_diff(got, trainer_logprobs(tiny_model, store.get(result.weights_key), seqs, lora=LORA)) < 1e-4


def test_a_blob_that_is_not_an_adapter_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "dora"
    bad.mkdir()
    (bad / ADAPTER_CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 8, "use_dora": True, "bias": "all"}))
    (bad / ADAPTER_WEIGHTS).write_bytes(st_save({"x": torch.zeros(1)}))
    with pytest.raises(WeightsBlobError, match="cannot be served: DoRA; bias 'all'"):
        check_adapter_dir(bad)
    (bad / ADAPTER_CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 32}))
    with pytest.raises(WeightsBlobError, match="rank 32 over the engine's max_lora_rank 16"):
        check_adapter_dir(bad, max_rank=16)


def test_export_of_a_full_weights_checkpoint_is_the_model_dir_with_its_weights(
    tiny_model: Path, tok, tmp_path: Path
) -> None:
    from rollart.activities.rl.weights_io import unique_tensors
    from rollart.client.local import published_tensors
    from rollart.client.snapshots import export, from_checkpoint, load_into

    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), tok)
    inp = step_input(tiny_model, tmp_path / "run", 0, samples, lora=None, lr=1e-3, checkpoint_every=1)
    result = asyncio.run(ENV.run(TrainerActivities(store).train_step, inp))
    snapshot = from_checkpoint(tmp_path / "run")
    assert (snapshot.version, snapshot.is_adapter) == (1, False)
    out = export(tiny_model, snapshot, tmp_path / "out", merge=True)  # --merge means nothing without an adapter
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in tiny_model.iterdir())
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    published = published_tensors(store, result.weights_key)  # the published version, tied head re-tied
    assert all(torch.equal(t, published[n]) for n, t in unique_tensors(model).items())

    async def served() -> int:  # what `rollart eval --run-dir` serves
        engine = HfEngine(tiny_model, max_model_len=128)
        await engine.start()
        try:
            await load_into(engine, snapshot)
            return engine.policy_version
        finally:
            await engine.shutdown()

    assert asyncio.run(served()) == 1
    with pytest.raises(ValueError, match="no checkpoint of step 7; it has: step-000000"):
        from_checkpoint(tmp_path / "run", step=7)
