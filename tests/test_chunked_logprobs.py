"""Chunked log-probs and entropies (from logits, fused with the LM head, vocabulary-parallel) against today's
full-vocabulary `losses.token_logprobs_and_entropy`: the same values and gradients, and no whole fp32 block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rollart.activities.rl import chunked_logprobs
from rollart.activities.rl.batch import TrainSequence, collate
from rollart.activities.rl.chunked_logprobs import (
    head_logprobs,
    head_logprobs_and_entropy,
    logits_logprobs,
    logits_logprobs_and_entropy,
)
from rollart.activities.rl.losses import token_logprobs, token_logprobs_and_entropy

B, T, H, V = 3, 13, 24, 97
CHUNKS = [1, 5, 16, 39, 500]  # one token; not dividing T nor B*T; more than T; B*T; more than every token


def inputs(dtype: torch.dtype = torch.float32, bias: bool = True, seed: int = 0) -> tuple:
    """Hidden states, a head of a trained model's scale (logits of a few nats), a bias, ids and gradient weights."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 2 / H**0.5).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(V, generator=gen)).to(dtype).requires_grad_() if bias else None
    ids = torch.randint(0, V, (B, T), generator=gen)
    g_logp, g_ent = torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen)
    return hidden, weight, b, ids, g_logp, g_ent


def backprop(
    logp: torch.Tensor, ent: torch.Tensor, g_logp: torch.Tensor, g_ent: torch.Tensor, wrt: list, grad_ent: bool
):
    """Values and gradients of Σ g·logp (+ Σ g·entropy when the entropy keeps its gradient)."""
    loss = (logp * g_logp).sum() + ((ent if grad_ent else ent.detach()) * g_ent).sum()
    return [logp.detach(), ent.detach(), *torch.autograd.grad(loss, [w for w in wrt if w is not None])]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max(float((x.detach().float() - y.detach().float()).abs().max()) for x, y in zip(a, b))


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest difference of each pair relative to the first's largest magnitude (at least 1): fp32 rounding
    of a sum taken in another order is relative to the size of what is summed."""
    return max(max_diff([x], [y]) / max(1.0, float(x.abs().max())) for x, y in zip(a, b))


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_from_logits_equals_the_full_vocabulary_path(chunk: int, entropy_grad: bool) -> None:
    hidden, weight, bias, ids, g_logp, g_ent = inputs()
    logits = F.linear(hidden, weight, bias)
    want = backprop(*token_logprobs_and_entropy(logits, ids), g_logp, g_ent, [logits], entropy_grad)
    got = backprop(*logits_logprobs_and_entropy(logits, ids, chunk), g_logp, g_ent, [logits], entropy_grad)
    assert max_diff(want[:2], got[:2]) == 0.0  # the same ops on the same rows
    assert rel_diff(want, got) < 1e-6  # the gradient's closed form rounds otherwise than autograd's graph
    assert torch.equal(logits_logprobs(logits, ids, chunk), want[0])
    assert torch.equal(token_logprobs(logits, ids, chunk_tokens=chunk), token_logprobs(logits, ids))


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize(("entropy_grad", "bias"), [(True, True), (False, True), (True, False)])
def test_fused_with_the_head_equals_the_full_vocabulary_path(chunk: int, entropy_grad: bool, bias: bool) -> None:
    hidden, weight, b, ids, g_logp, g_ent = inputs(bias=bias)
    wrt = [hidden, weight, b]
    want = backprop(*token_logprobs_and_entropy(F.linear(hidden, weight, b), ids), g_logp, g_ent, wrt, entropy_grad)
    got = backprop(*head_logprobs_and_entropy(hidden, weight, b, ids, chunk), g_logp, g_ent, wrt, entropy_grad)
    assert rel_diff(want, got) < 1e-6  # a chunk's matmul rounds as the whole one does, up to summation order
    assert rel_diff([want[0]], [head_logprobs(hidden, weight, b, ids, chunk)]) < 1e-6


def test_padded_positions_get_no_gradient_and_masked_losses_agree() -> None:
    """A right-padded micro-batch whose loss reads only completion tokens: equal losses and gradients, and the
    padding's hidden states get exactly zero gradient from either path."""
    seqs = [TrainSequence([1, 2, 3], [4, 5], [0.0, 0.0], 1.0), TrainSequence([7] * 9, [8], [0.0], -1.0)]
    mb = collate(seqs, pad_id=0)
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(*mb.input_ids.shape, H, generator=gen, requires_grad=True)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).requires_grad_()
    mask = mb.completion_mask

    def grads(logp: torch.Tensor, ent: torch.Tensor) -> list[torch.Tensor]:
        return [*torch.autograd.grad(((logp + 0.1 * ent) * mask).sum(), [hidden, weight]), (logp * mask).detach()]

    want = grads(*token_logprobs_and_entropy(F.linear(hidden, weight), mb.input_ids))
    got = grads(*head_logprobs_and_entropy(hidden, weight, None, mb.input_ids, 4))
    assert rel_diff(want, got) < 1e-6
    last = mb.attention_mask.sum(-1) - 1  # a sequence's last real token predicts nothing the loss reads
    for i, end in enumerate(last.tolist()):
        assert float(got[0][i, end:].abs().max()) == 0.0


def test_bf16_inputs_are_as_close_to_fp32_as_the_full_vocabulary_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """From bf16 logits the chunked values equal today's exactly; fused with a bf16 head they are no further
    from the fp32 truth than today's path (bf16 tolerance), gradients included (the head's made 10 rows at a
    time and summed in fp32)."""
    monkeypatch.setattr(chunked_logprobs, "_HEAD_ROWS", 10)
    h32, w32, b32, ids, g_logp, g_ent = inputs()
    h16, w16, b16, *_ = inputs(torch.bfloat16)
    truth = backprop(*token_logprobs_and_entropy(F.linear(h32, w32, b32), ids), g_logp, g_ent, [h32, w32, b32], True)
    wrt = [h16, w16, b16]
    today = backprop(*token_logprobs_and_entropy(F.linear(h16, w16, b16), ids), g_logp, g_ent, wrt, True)
    chunked = backprop(*logits_logprobs_and_entropy(F.linear(h16, w16, b16), ids, 5), g_logp, g_ent, wrt, True)
    fused = backprop(*head_logprobs_and_entropy(h16, w16, b16, ids, 5), g_logp, g_ent, wrt, True)
    assert max_diff(today[:2], chunked[:2]) == 0.0
    assert all(g.dtype == torch.bfloat16 for g in fused[2:])
    for i, name in enumerate(["logp", "entropy", "grad hidden", "grad weight", "grad bias"]):
        err_today = max_diff([today[i]], [truth[i]])
        err_chunked, err_fused = max_diff([chunked[i]], [truth[i]]), max_diff([fused[i]], [truth[i]])
        scale = float(truth[i].abs().max())
        print(f"{name}: |bf16 - fp32| today {err_today:.2e}, chunked {err_chunked:.2e}, fused {err_fused:.2e}")
        for err in (err_chunked, err_fused):
            assert err <= 1.5 * err_today + 1e-6 * scale, (name, err, err_today)
            assert err < 0.05 * scale, (name, err, scale)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor (elements) any op makes while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("chunk", [4, 16])
def test_no_tensor_of_the_whole_vocabulary_block_is_made(chunk: int) -> None:
    """Fused: forward and backward make nothing larger than one chunk's `[chunk, V]` (the head's `[V, H]` and
    its gradient are smaller here); today's path makes whole `[B, T−1, V]` blocks."""
    hidden, weight, bias, ids, g_logp, g_ent = inputs()
    with _LargestTensor() as fused:
        backprop(*head_logprobs_and_entropy(hidden, weight, bias, ids, chunk), g_logp, g_ent, [hidden, weight], True)
    with _LargestTensor() as today:
        lp, ent = token_logprobs_and_entropy(F.linear(hidden, weight, bias), ids)
        backprop(lp, ent, g_logp, g_ent, [hidden, weight], True)
    assert fused.largest <= max(chunk * V, V * H), fused.largest
    assert today.largest >= B * (T - 1) * V


def test_chunk_size_must_be_positive() -> None:
    hidden, weight, bias, ids, *_ = inputs()
    with pytest.raises(ValueError, match="chunk_tokens must be ≥ 1"):
        head_logprobs(hidden, weight, bias, ids, 0)
    with pytest.raises(ValueError, match="matching input_ids"):
        head_logprobs(hidden[:, :-1], weight, bias, ids, 4)


# ---- megatron: vocabulary-parallel, chunked ----------------------------------------------------


def vocab_parallel_case(vocab: int) -> dict[str, float]:
    """On a tensor-parallel rank: this rank's slice of shared logits (the vocabulary padded to a multiple of
    the ranks with zero logits, as the padded head gives) through the chunked vocabulary-parallel function,
    against the full-vocabulary path; the largest relative difference of values and of the slice's gradient
    (the reduction's formula rounds otherwise than `log_softmax`, at any chunk size)."""
    from megatron.core import parallel_state as ps

    from rollart.activities.training.megatron.vocab_parallel import vocab_parallel_logprobs_and_entropy

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    padded = -(-vocab // tp) * tp
    local = padded // tp
    gen = torch.Generator().manual_seed(5)
    full = 3 * torch.randn(B, T, vocab, generator=gen)
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    g_logp, g_ent = torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen)
    out: dict[str, float] = {}
    for entropy_grad in (True, False):
        ref = full.clone().requires_grad_()
        want = backprop(*token_logprobs_and_entropy(ref, ids), g_logp, g_ent, [ref], entropy_grad)
        want_slice = F.pad(want[2], (0, padded - vocab))[..., rank * local : (rank + 1) * local]
        for chunk in CHUNKS:
            mine = F.pad(full, (0, padded - vocab))[..., rank * local : (rank + 1) * local].clone().requires_grad_()
            lp, ent = vocab_parallel_logprobs_and_entropy(
                mine, ids, rank * local, vocab, entropy_grad=entropy_grad, chunk_tokens=chunk
            )
            assert ent.requires_grad == entropy_grad
            got = backprop(lp, ent, g_logp, g_ent, [mine], entropy_grad)
            out[f"chunk {chunk} entropy_grad {entropy_grad}"] = rel_diff([*want[:2], want_slice], got)
    return out


@pytest.mark.integration
def test_vocab_parallel_chunks_equal_the_full_vocabulary_on_two_ranks() -> None:
    """T=2 over gloo, an odd vocabulary (padded by one): every rank's values and its slice's gradient."""
    from tests.support.gloo import run_on_ranks

    for rank_result in run_on_ranks(vocab_parallel_case, 2, 2, V):
        assert max(rank_result.values()) < 1e-6, rank_result


def test_the_memory_probe_gives_the_same_values_and_gradients_in_every_mode() -> None:
    """`bench trainer_memory`'s probe (tiny shape): the modes it compares compute the same thing."""
    from rollart.client.logprob_probe import MODES, head_logprobs_peak

    rows = {m: head_logprobs_peak(m, 40, 16, 300, "float32", 7, "cpu") for m in MODES}
    for key in ("logp_mean", "entropy_mean", "grad_hidden_norm", "grad_head_norm"):
        values = [r[key] for r in rows.values()]
        assert max(values) - min(values) <= 1e-6 * max(1.0, abs(values[0])), (key, values)
    with pytest.raises(ValueError, match="unknown mode 'all'"):
        head_logprobs_peak("all", 40, 16, 300, "float32", 7, "cpu")
