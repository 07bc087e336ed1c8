"""Engines keep the contract (shapes, versions, finish reasons, true behaviour logprobs) and swap weights in place
(new logprobs follow the new weights, versions are stamped, stale loads are no-ops).

One engine of each kind serves the whole module, in file order: the contract first, on the weights it was
built with, then the swaps, which leave it on other weights.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollart.activities.engines.base import (
    Engine,
    EngineDeadError,
    EngineError,
    EngineOutput,
    EngineRequestError,
    WeightsBlobError,
    check_weights,
)
from rollart.activities.engines.factory import create_engine
from rollart.client.local import publish_model
from rollart.contracts.generation import EnginePressure
from rollart.infra.store.payload import LocalStore
from rollart.infra.store.weight_stream import WeightsTransferError
from rollart.infra.store.weights import WeightsSource, read_manifest
from rollart.infra.tiny_model import build_tiny_model
from rollart.spec.config import EngineConfig, SamplingParams, WeightsConfig

log = logging.getLogger(__name__)

PROMPT = "SFFF\nFHAH\nFFFH\nHFFG\nmove:"
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, n=4)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("engines") / "model", seed=0)


@pytest_asyncio.fixture(scope="module")
async def hf_engine(model_dir: Path) -> AsyncIterator[Engine]:
    engine = create_engine(model_dir, EngineConfig(kind="hf", max_model_len=128))
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest_asyncio.fixture(scope="module")
async def vllm_engine(model_dir: Path) -> AsyncIterator[Engine]:
    """vLLM with its priority scheduler (`engine.priority: turns`): requests of equal priority, as every test here
    but the priority one sends, are served in arrival order as by the default fcfs scheduler (the session stack's)."""
    cfg = EngineConfig(kind="vllm", max_model_len=256, max_num_seqs=64, kv_cache_gib=1, priority="turns")
    engine = create_engine(model_dir, cfg)
    await engine.start()
    yield engine
    await engine.shutdown()


def check_output(out: EngineOutput, sampling: SamplingParams, eos_id: int | None = None) -> None:
    assert out.prompt_ids
    assert len(out.completions) == sampling.n
    assert out.policy_version == out.policy_version_end == 0
    for c in out.completions:
        assert 1 <= len(c.token_ids) == len(c.logprobs) <= sampling.max_tokens
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert len(c.token_ids) == sampling.max_tokens
        elif eos_id is not None:
            assert c.token_ids[-1] == eos_id


@pytest.mark.integration
def test_factory_is_lazy() -> None:
    import subprocess
    import sys

    code = "import sys, rollart.activities.engines.factory; print('vllm' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
    with pytest.raises(ValueError, match="unknown engine kind"):
        create_engine(Path("."), EngineConfig.model_construct(kind="tpu"))


@pytest.mark.integration
def test_the_jobs_gpu_settings_reach_vllm(model_dir: Path) -> None:
    import torch

    cfg = EngineConfig(
        dtype="bfloat16",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.6,
        enable_prefix_caching=False,
        max_num_seqs=32,
    )
    args = create_engine(model_dir, cfg).engine_args()
    assert (
        args.dtype,
        args.tensor_parallel_size,
        args.gpu_memory_utilization,
        args.enable_prefix_caching,
        args.max_num_seqs,
    ) == ("bfloat16", 2, 0.6, False, 32)
    assert args.enforce_eager is not torch.cuda.is_available()  # CUDA graphs on GPUs, eager on CPUs
    assert create_engine(model_dir, EngineConfig()).engine_args().enable_prefix_caching is True
    assert create_engine(model_dir, EngineConfig()).engine_args().scheduling_policy == "fcfs"
    assert create_engine(model_dir, EngineConfig(priority="turns")).engine_args().scheduling_policy == "priority"


async def test_hf_generates_n_completions(hf_engine: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=8, n=2)
    before = hf_engine.tokens_generated()
    out = await hf_engine.generate(PROMPT, sampling, "hf-1")
    check_output(out, sampling, eos_id=0)
    assert hf_engine.tokens_generated() == before + sum(len(c.token_ids) for c in out.completions)


async def test_hf_rejects_too_long_prompt(hf_engine: Engine) -> None:
    with pytest.raises(EngineError, match="max_model_len") as err:
        await hf_engine.generate("SFFF " * 200, SamplingParams(max_tokens=4), "hf-long")
    assert isinstance(err.value, EngineRequestError)


async def test_hf_stop_string(hf_engine: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=64, n=4, stop=["F"])
    out = await hf_engine.generate(PROMPT, sampling, "hf-stop")
    for c in out.completions:
        assert "F" not in c.text


@pytest.mark.integration
async def test_vllm_serves_concurrent_requests(vllm_engine: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=16, n=2)
    before = vllm_engine.tokens_generated()
    outs = await asyncio.gather(*(vllm_engine.generate(PROMPT, sampling, f"c{i}") for i in range(32)))
    for out in outs:
        check_output(out, sampling, eos_id=0)
    assert vllm_engine.tokens_generated() - before == sum(len(c.token_ids) for o in outs for c in o.completions)


@pytest.mark.integration
async def test_vllm_serves_waiting_requests_of_lower_priority_first(vllm_engine: Engine) -> None:
    """A full engine (64 running, more waiting) gets 8 requests of priority -3, the rank `turns` gives a trajectory
    3 turns in: they are scheduled ahead of the requests that were waiting before them, so they finish first."""
    sampling = SamplingParams(temperature=1.0, max_tokens=24)
    finished: list[str] = []

    async def request(name: str, priority: int) -> None:
        await vllm_engine.generate(PROMPT, sampling, name, priority)
        finished.append(name)

    early = [asyncio.create_task(request(f"early{i}", 0)) for i in range(64 + 32)]  # 32 wait for a slot
    deadline = time.monotonic() + 60
    while vllm_engine.pressure().waiting < 16:
        assert time.monotonic() < deadline, vllm_engine.pressure()
        await asyncio.sleep(0.01)
    late = [asyncio.create_task(request(f"late{i}", -3)) for i in range(8)]
    await asyncio.gather(*early, *late)
    rank = {name: i for i, name in enumerate(finished)}
    lates = sorted(rank[f"late{i}"] for i in range(8))
    waited = sorted(rank[f"early{i}"] for i in range(64, 96))  # the last 32 in: waiting when the late ones came
    assert lates[-1] < waited[len(waited) // 2], (lates, waited)  # all 8 before half of those that waited


@pytest.mark.integration
async def test_vllm_reports_its_pressure_and_prefix_cache(vllm_engine: Engine, model_dir: Path) -> None:
    """vLLM's stat loggers feed `pressure()`: a prompt of more than one 128-token block asked twice is found in the
    prefix cache the second time; an idle engine has nothing running or waiting. The HF engine reports zeros."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    long = PROMPT
    while len(tokenizer(long).input_ids) < 140:
        long += "\n" + PROMPT
    before = vllm_engine.pressure()
    sampling = SamplingParams(max_tokens=2)
    await vllm_engine.generate(long, sampling, "p1")
    first = vllm_engine.pressure()
    await vllm_engine.generate(long, sampling, "p2")
    second = vllm_engine.pressure()
    assert first.prefix_queries > before.prefix_queries and second.prefix_hits >= first.prefix_hits + 128
    assert second.running == second.waiting == 0 and 0.0 <= second.kv_usage <= 1.0 and second.preempted == 0
    # its rates (generate_pool: auto): the first request's prompt was computed, the second's found in the cache
    assert first.prefill_tokens >= before.prefill_tokens + 128 and first.prefill_s > before.prefill_s
    assert second.prefill_tokens - first.prefill_tokens < first.prefill_tokens - before.prefill_tokens
    assert second.decode_tokens > before.decode_tokens and second.decode_s > before.decode_s
    assert second.decode_steps > before.decode_steps and second.max_batch == 64  # its max_num_seqs


async def test_hf_measures_its_prefill_and_decode(hf_engine: Engine) -> None:
    """The HF engine reports no pressure, only its rates: each prompt's tokens and the seconds to the first token,
    each later token and the seconds after it."""
    before = hf_engine.pressure()
    out = await hf_engine.generate(PROMPT, SamplingParams(max_tokens=8, n=2), "rates")
    after = hf_engine.pressure()
    generated = sum(len(c.token_ids) for c in out.completions)
    assert after.prefill_tokens - before.prefill_tokens == len(out.prompt_ids) and after.prefill_s > before.prefill_s
    assert after.decode_tokens - before.decode_tokens == generated - 2 and after.decode_s > before.decode_s
    longest = max(len(c.token_ids) for c in out.completions)
    assert after.decode_steps - before.decode_steps == longest - 1 and after.max_batch == 0  # a request at a time
    counts = dict.fromkeys(("prefill_tokens", "prefill_s", "decode_tokens", "decode_s", "decode_steps"), 0)
    assert after.model_copy(update=counts) == EnginePressure()


@pytest.mark.integration
async def test_vllm_logprobs_match_transformers(vllm_engine: Engine, model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=24, n=4)
    out = await vllm_engine.generate(PROMPT, sampling, "lp")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for c in out.completions:
        ids = torch.tensor([out.prompt_ids + c.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        start = len(out.prompt_ids)
        positions = torch.arange(start - 1, start - 1 + len(c.token_ids))
        expected = logp[positions, torch.tensor(c.token_ids)]
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4), (c.logprobs, expected.tolist())


@pytest.mark.integration
async def test_vllm_cancel_aborts_request(vllm_engine: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=200, n=1)
    task = asyncio.create_task(vllm_engine.generate(PROMPT, sampling, "to-cancel"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    llm = vllm_engine._llm  # type: ignore[attr-defined]
    for _ in range(50):
        if llm.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.02)
    assert llm.get_num_unfinished_requests() == 0
    out = await vllm_engine.generate(PROMPT, SamplingParams(max_tokens=4), "after-cancel")
    assert len(out.completions[0].token_ids) >= 1


@pytest.mark.integration
async def test_vllm_bad_request_is_engine_error(vllm_engine: Engine) -> None:
    with pytest.raises(EngineError, match="maximum context length") as err:
        await vllm_engine.generate("SFFF " * 300, SamplingParams(max_tokens=4), "too-long")
    assert isinstance(err.value, EngineRequestError)  # invalid request: callers must not retry
    out = await vllm_engine.generate(PROMPT, SamplingParams(max_tokens=2), "still-alive")
    assert out.completions


# --- weight swaps (after the contract: they leave the engines on other weights) ---------------------------


def perturbed_model(model_dir: Path, seed: int) -> Any:
    """The tiny model with 0.05·randn added to every parameter (tied embedding perturbed once)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def publish(
    model: Any, version: int, model_dir: Path, job: str = "engines", publisher: Any = None, **weights: Any
) -> WeightsSource:
    """Publish `model` as `version` exactly as the trainer does (buckets and a manifest in a local store)."""
    cfg = WeightsConfig(**{"dtype": "float32", **weights})
    return publish_model(LocalStore(model_dir.parent / "store"), job, version, model, cfg, publisher)


def teacher_forced(model: Any, out: EngineOutput) -> list[list[float]]:
    """Log-probabilities `model` gives each sampled token, by one forward pass over prompt + completion."""
    import torch

    result = []
    start = len(out.prompt_ids)
    for c in out.completions:
        with torch.no_grad():
            logits = model(torch.tensor([out.prompt_ids + c.token_ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        positions = torch.arange(start - 1, start - 1 + len(c.token_ids))
        result.append(logp[positions, torch.tensor(c.token_ids)].tolist())
    return result


def max_error(out: EngineOutput, expected: list[list[float]]) -> float:
    return max(
        abs(a - b) for c, e in zip(out.completions, expected, strict=True) for a, b in zip(c.logprobs, e, strict=True)
    )


@pytest.fixture(scope="module")
def original(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def new_weights(model_dir: Path) -> tuple[Any, WeightsSource]:
    """Version 1: the perturbed model, published."""
    model = perturbed_model(model_dir, seed=1)
    return model, publish(model, 1, model_dir)


def test_weights_check_rejects_what_does_not_fit(model_dir: Path, new_weights: tuple[Any, WeightsSource]) -> None:
    manifest = new_weights[1].manifest
    check_weights(manifest, model_dir)  # the trainer's format passes
    bucket = manifest.buckets[0]
    name = "model.norm.weight"
    without = [t for t in bucket.tensors if t.name != name]
    missing = manifest.model_copy(update={"buckets": [bucket.model_copy(update={"tensors": without})]})
    with pytest.raises(WeightsBlobError, match=f"missing.*{name}"):
        check_weights(missing, model_dir)
    check_weights(missing.model_copy(update={"kind": "delta", "base_version": 0}), model_dir)  # a delta may skip
    shorter = [t.model_copy(update={"shape": [t.shape[0] - 1]}) if t.name == name else t for t in bucket.tensors]
    wrong = manifest.model_copy(update={"buckets": [bucket.model_copy(update={"tensors": shorter})]})
    with pytest.raises(WeightsBlobError, match="shape mismatch"):
        check_weights(wrong, model_dir)
    renamed = [t.model_copy(update={"name": "model.nope"}) if t.name == name else t for t in bucket.tensors]
    extra = manifest.model_copy(update={"buckets": [bucket.model_copy(update={"tensors": renamed})]})
    with pytest.raises(WeightsBlobError, match=r"unexpected.*model\.nope"):
        check_weights(extra, model_dir)


def _gone(source: WeightsSource) -> WeightsSource:
    """`source` with its first bucket renamed to a key that is not in the store (a retired version)."""
    m = source.manifest
    first = m.buckets[0].model_copy(update={"key": m.buckets[0].key + ".gone"})
    return source.model_copy(update={"manifest": m.model_copy(update={"buckets": [first, *m.buckets[1:]]})})


# --- HF engine -------------------------------------------------------------------------------------------


async def test_hf_load_weights(
    hf_engine: Engine, new_weights: tuple[Any, WeightsSource], original: Any, model_dir: Path
) -> None:
    model, source = new_weights
    before = await hf_engine.generate(PROMPT, SAMPLING, "hf-before")
    assert max_error(before, teacher_forced(original, before)) < 1e-4
    await hf_engine.load_weights(source, 1)
    assert hf_engine.policy_version == 1
    out = await hf_engine.generate(PROMPT, SAMPLING, "hf-after")
    assert (out.policy_version, out.policy_version_end) == (1, 1)
    assert max_error(out, teacher_forced(model, out)) < 1e-4
    assert max_error(out, teacher_forced(original, out)) > 0.05
    await hf_engine.load_weights(_gone(source), 1)  # stale: not even opened
    assert hf_engine.policy_version == 1
    with pytest.raises(WeightsTransferError, match=r"engines.*v1.*not in"):  # gone: refused before any load
        await hf_engine.load_weights(_gone(source), 2)
    assert hf_engine.policy_version == 1
    await hf_engine.load_weights(None, 0, force=True)  # the model dir's own weights (another job's v0)
    out = await hf_engine.generate(PROMPT, SAMPLING, "hf-base")
    assert max_error(out, teacher_forced(original, out)) < 1e-4


async def test_hf_bf16_and_delta_publishes(hf_engine: Engine, model_dir: Path) -> None:
    """bf16 weights load into a float32 engine; with deltas on, an engine holding v−1 takes the delta and ends up
    exactly where the full version would put it."""
    import torch

    from rollart.activities.training.publish import Publisher

    job, publisher = "delta", Publisher()
    model = perturbed_model(model_dir, seed=3)
    with torch.no_grad():  # bf16-exact values: what the engine computes with is exactly the model's
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    v1 = publish(model, 1, model_dir, job, publisher, dtype="bfloat16", delta=True)
    assert v1.manifest.deltas and v1.manifest.delta_key is None  # nothing to take a delta from yet
    await hf_engine.load_weights(v1, 1, force=True)
    assert hf_engine.delta_base == (job, 1)
    out = await hf_engine.generate(PROMPT, SAMPLING, "bf16")
    assert max_error(out, teacher_forced(model, out)) < 1e-4
    with torch.no_grad():  # a small step: one tensor's row moves, the rest stays (as bf16 rounding often leaves it)
        row = model.model.layers[1].mlp.down_proj.weight[3]
        row.copy_((row + 0.25).to(torch.bfloat16).float())
    v2 = publish(model, 2, model_dir, job, publisher, dtype="bfloat16", delta=True)
    delta = read_manifest(LocalStore(model_dir.parent / "store"), v2.manifest.delta_key)
    assert (delta.kind, delta.base_version) == ("delta", 1)
    assert [t.name for t in delta.tensors] == ["model.layers.1.mlp.down_proj.weight"]
    assert delta.tensors[0].encoding == "sparse" and delta.nbytes < v2.manifest.nbytes / 100
    await hf_engine.load_weights(WeightsSource(store=v2.store, manifest=delta), 2)
    out = await hf_engine.generate(PROMPT, SAMPLING, "delta")
    assert max_error(out, teacher_forced(model, out)) < 1e-4
    with pytest.raises(WeightsTransferError, match="needs this engine to hold v1"):  # holds v2 now: refused
        await hf_engine.load_weights(WeightsSource(store=v2.store, manifest=delta), 3)


# --- vLLM engine -----------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_vllm_swap_under_load(vllm_engine: Engine, new_weights: tuple[Any, WeightsSource], original: Any) -> None:
    """32 requests in flight across the swap all finish; afterwards logprobs are the new model's."""
    model, source = new_weights
    assert vllm_engine.policy_version == 0
    long = SamplingParams(temperature=1.0, top_k=0, max_tokens=64, n=2)
    tasks = [asyncio.create_task(vllm_engine.generate(PROMPT, long, f"load-{i}")) for i in range(32)]
    await asyncio.sleep(0.3)
    t0 = time.perf_counter()
    await vllm_engine.load_weights(source, 1)
    swap_s = time.perf_counter() - t0
    log.warning("vLLM weight swap took %.3f s", swap_s)
    outs = await asyncio.gather(*tasks)
    for out in outs:
        assert {out.policy_version, out.policy_version_end} <= {0, 1}
        assert out.policy_version <= out.policy_version_end
        assert all(len(c.token_ids) >= 1 for c in out.completions)
    assert vllm_engine.policy_version == 1
    spanning = sum(o.policy_version < o.policy_version_end for o in outs)
    log.warning("%d of 32 requests spanned the swap", spanning)

    out = await vllm_engine.generate(PROMPT, SAMPLING, "after")
    assert (out.policy_version, out.policy_version_end) == (1, 1)
    assert max_error(out, teacher_forced(model, out)) < 1e-4
    assert max_error(out, teacher_forced(original, out)) > 0.05


@pytest.mark.integration
async def test_vllm_stale_and_bad_loads_keep_the_engine(
    vllm_engine: Engine, new_weights: tuple[Any, WeightsSource]
) -> None:
    version = vllm_engine.policy_version
    gone = _gone(new_weights[1])
    await vllm_engine.load_weights(gone, version)  # not newer: no-op
    await vllm_engine.load_weights(gone, 0)
    assert vllm_engine.policy_version == version
    with pytest.raises(WeightsTransferError, match=r"engines.*v1.*not in"):  # refused before the engine is paused
        await vllm_engine.load_weights(gone, version + 1)
    m = new_weights[1].manifest
    shapes = [t.model_copy(update={"shape": [1, *t.shape]}) for t in m.buckets[0].tensors]
    wrong = m.model_copy(update={"buckets": [m.buckets[0].model_copy(update={"tensors": shapes})]})
    with pytest.raises(WeightsBlobError):
        await vllm_engine.load_weights(new_weights[1].model_copy(update={"manifest": wrong}), version + 1)
    assert vllm_engine.policy_version == version
    out = await vllm_engine.generate(PROMPT, SamplingParams(max_tokens=4), "still-alive")
    assert out.policy_version == version and out.completions[0].token_ids


@pytest.mark.integration
async def test_vllm_concurrent_loads_are_serialised(vllm_engine: Engine, model_dir: Path) -> None:
    """Two racing swaps both apply in order; the older one arriving last is a no-op."""
    v = vllm_engine.policy_version
    sources = [publish(perturbed_model(model_dir, seed=10 + i), v + 1 + i, model_dir, "race") for i in range(2)]
    await asyncio.gather(vllm_engine.load_weights(sources[0], v + 1), vllm_engine.load_weights(sources[1], v + 2))
    assert vllm_engine.policy_version == v + 2
    await vllm_engine.load_weights(sources[0], v + 1)
    assert vllm_engine.policy_version == v + 2


@pytest.mark.integration
async def test_vllm_takes_a_delta_into_fused_layers(vllm_engine: Engine, model_dir: Path) -> None:
    """A delta that changes q_proj alone (fused into vLLM's qkv_proj) is loaded with its whole group: logprobs equal
    the new model's; bf16 published weights into a float32 engine."""
    import torch

    from rollart.activities.training.publish import Publisher

    job, publisher, v = "vllm-delta", Publisher(), vllm_engine.policy_version
    model = perturbed_model(model_dir, seed=4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    await vllm_engine.load_weights(publish(model, 1, model_dir, job, publisher, dtype="bfloat16", delta=True), v + 1)
    assert vllm_engine.delta_base == (job, 1)
    with torch.no_grad():
        q = model.model.layers[0].self_attn.q_proj.weight
        q[:8].copy_((q[:8] * 1.5).to(torch.bfloat16).float())
    full = publish(model, 2, model_dir, job, publisher, dtype="bfloat16", delta=True)
    delta = read_manifest(LocalStore(model_dir.parent / "store"), full.manifest.delta_key)
    assert [t.name for t in delta.tensors] == ["model.layers.0.self_attn.q_proj.weight"]
    await vllm_engine.load_weights(WeightsSource(store=full.store, manifest=delta), v + 2)
    out = await vllm_engine.generate(PROMPT, SAMPLING, "after-delta")
    assert out.policy_version == v + 2 and max_error(out, teacher_forced(model, out)) < 1e-4


# --- failure path, without vLLM --------------------------------------------------------------------------


class _FailingLLM:
    """Stands in for AsyncLLM: the reload RPC blows up, as a broken worker would."""

    errored = False

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.engine_core = self

    async def pause_scheduler_async(self, **kwargs: Any) -> None:
        self.calls.append("pause")

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[int]:
        self.calls.append(method)
        raise RuntimeError("simulated worker failure")

    async def reset_prefix_cache(self, **kwargs: Any) -> bool:
        return True

    async def resume_generation(self) -> None:
        self.calls.append("resume")


async def test_vllm_failed_reload_marks_engine_dead(model_dir: Path, new_weights: tuple[Any, WeightsSource]) -> None:
    from rollart.activities.engines.vllm_engine import VllmEngine

    engine = VllmEngine(model_dir)
    engine._llm = _FailingLLM()  # type: ignore[attr-defined]
    with pytest.raises(EngineDeadError, match="restart the generation worker"):
        await engine.load_weights(new_weights[1], 1)
    assert engine.policy_version == 0
    with pytest.raises(EngineDeadError):
        await engine.generate(PROMPT, SamplingParams(max_tokens=2), "after-failure")


class _SlowLLM(_FailingLLM):
    """Stands in for AsyncLLM: the reload RPC takes a while and succeeds."""

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[int]:
        self.calls.append(method)
        await asyncio.sleep(0.2)
        return [1]


async def test_vllm_cancelled_swap_still_completes(model_dir: Path, new_weights: tuple[Any, WeightsSource]) -> None:
    """Cancelling the caller mid-swap must not leave vLLM paused: the swap finishes, then the cancel propagates."""
    from rollart.activities.engines.vllm_engine import VllmEngine

    engine = VllmEngine(model_dir)
    llm = _SlowLLM()
    engine._llm = llm  # type: ignore[attr-defined]
    task = asyncio.create_task(engine.load_weights(new_weights[1], 1))
    for _ in range(200):  # until the reload RPC is under way
        if len(llm.calls) >= 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert llm.calls[-1] == "resume" and engine.policy_version == 1 and not engine._dead  # type: ignore[attr-defined]
