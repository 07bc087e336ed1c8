"""Engines keep the contract: shapes, versions, finish reasons, and true behaviour logprobs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from rollart.activities.engines.base import Engine, EngineError, EngineOutput, EngineRequestError
from rollart.activities.engines.factory import create_engine
from rollart.infra.config import EngineConfig, SamplingParams
from rollart.infra.tiny_model import build_tiny_model

PROMPT = "SFFF\nFHAH\nFFFH\nHFFG\nmove:"


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
    engine = create_engine(model_dir, EngineConfig(kind="vllm", max_model_len=256, max_num_seqs=64, kv_cache_gib=1))
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
