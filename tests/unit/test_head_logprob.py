"""The chunked LM-head log-prob + entropy (algo/head_logprob.py) against the plain full-logits path."""

import pytest
import torch

from seekrl.algo.head_logprob import auto_chunk, head_logprob_entropy
from seekrl.algo.losses import entropy_from_logits


def _reference(h, w, b, targets, t):
    z = torch.nn.functional.linear(h, w, b).float() / t
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, -1)
    return logp, entropy_from_logits(z)


def _inputs(n=37, hdim=24, vocab=101, seed=0, dtype=torch.float32, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hdim, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hdim, generator=g) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(vocab, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, vocab, (n,), generator=g)
    return h, w, b, targets


def _grads(fn, h, w, b, targets, t, a_logp, a_ent):
    for x in (h, w, b):
        if x is not None:
            x.grad = None
    logp, ent = fn(h, w, b, targets, t)
    ((logp * a_logp).sum() + (ent * a_ent).sum()).backward()
    return logp.detach(), ent.detach(), [x.grad.clone() for x in (h, w, b) if x is not None]


@pytest.mark.parametrize("chunk", [1, 5, 37, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_equal_the_full_logits_path(chunk, temperature, bias):
    h, w, b, targets = _inputs(bias=bias)
    g = torch.Generator().manual_seed(1)
    a_logp, a_ent = torch.randn(len(targets), generator=g), torch.randn(len(targets), generator=g)
    t = temperature if temperature > 0 else 1.0
    ref = _grads(_reference, h, w, b, targets, t, a_logp, a_ent)
    got = _grads(lambda *x: head_logprob_entropy(*x, chunk=chunk), h, w, b, targets, temperature, a_logp, a_ent)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=1e-5)
    for gg, rr in zip(got[2], ref[2]):  # float32 sums of V terms: within 1e-5 of the gradient's scale
        torch.testing.assert_close(gg, rr, rtol=0, atol=1e-5 * max(1.0, rr.abs().max().item()))


@pytest.mark.parametrize("chunk", [5, 1000])
def test_a_temperature_per_row_equals_each_rows_own(chunk):
    """Rows sampled at their own temperature (rollout.branch_temperature): a `(N,)` temperature
    gives each row the log-prob, entropy and gradients of the plain path at its temperature (<= 0: 1)."""
    h, w, b, targets = _inputs()
    g = torch.Generator().manual_seed(2)
    a_logp, a_ent = torch.randn(len(targets), generator=g), torch.randn(len(targets), generator=g)
    t_N = torch.tensor([(0.7, 1.3, 1.0, 0.0)[i % 4] for i in range(len(targets))])
    ref = _grads(_reference, h, w, b, targets, torch.where(t_N > 0, t_N, torch.ones_like(t_N))[:, None], a_logp, a_ent)
    got = _grads(lambda *x: head_logprob_entropy(*x, chunk=chunk), h, w, b, targets, t_N, a_logp, a_ent)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=1e-5)
    for gg, rr in zip(got[2], ref[2]):
        torch.testing.assert_close(gg, rr, rtol=0, atol=1e-5 * max(1.0, rr.abs().max().item()))
    one = _grads(lambda *x: head_logprob_entropy(*x, chunk=chunk), h, w, b, targets, 1.3, a_logp, a_ent)
    assert not torch.allclose(one[0], got[0])  # the rows' own temperatures matter


def test_without_entropy_and_with_a_frozen_head():
    h, w, b, targets = _inputs(bias=False)
    w.requires_grad_(False)
    logp, ent = head_logprob_entropy(h, w, None, targets, entropy=False, chunk=8)
    assert ent is None
    logp.sum().backward()
    ref_h = h.grad.clone()
    h.grad = None
    _reference(h, w, None, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(ref_h, h.grad, rtol=1e-5, atol=1e-6)
    assert w.grad is None  # a frozen head gets no gradient, and none is computed


def test_masked_vocabulary_and_empty_input():
    h, w, b, targets = _inputs(n=6, vocab=20)
    with torch.no_grad():
        b[10:] = float("-inf")  # tokens 10.. can never be drawn
    targets = targets % 10
    logp, ent = head_logprob_entropy(h, w, b, targets, chunk=4)
    ref = _reference(h, w, b, targets, 1.0)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(logp, ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref[1], rtol=0, atol=1e-5)
    (logp.sum() + ent.sum()).backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
    empty, _ = head_logprob_entropy(h[:0], w, b, targets[:0])
    assert empty.shape == (0,)


def test_bfloat16_head_matches_the_plain_bf16_path():
    h, w, b, targets = _inputs(dtype=torch.bfloat16)
    logp, ent = head_logprob_entropy(h, w, b, targets, chunk=7)
    ref = _reference(h, w, b, targets, 1.0)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref[1], rtol=0, atol=1e-5)


def test_auto_chunk_bounds_the_logits_of_a_chunk():
    assert auto_chunk(49152) * 49152 * 4 <= 32 * 2**20
    assert auto_chunk(10**9) == 16


def test_kept_and_recomputed_logits_give_the_same_gradients(monkeypatch):
    """Small inputs keep their logits for the backward; large ones recompute them: the same result,
    and a second backward (retain_graph) recomputes after the kept logits were used up."""
    import seekrl.algo.head_logprob as hl

    h, w, b, targets = _inputs()
    out = {}
    for name, keep_bytes in (("kept", 2**30), ("recomputed", 0)):
        monkeypatch.setattr(hl, "KEEP_BYTES", keep_bytes)
        h.grad = w.grad = b.grad = None
        logp, ent = hl.head_logprob_entropy(h, w, b, targets, 0.8, chunk=8)
        loss = logp.sum() + 0.5 * ent.sum()
        loss.backward(retain_graph=True)
        first = [x.grad.clone() for x in (h, w, b)]
        loss.backward()
        out[name] = first, [x.grad.clone() for x in (h, w, b)]
    for a, c in zip(out["kept"][0] + out["kept"][1], out["recomputed"][0] + out["recomputed"][1]):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-6)
    for a, c in zip(out["kept"][0], out["kept"][1]):  # the second backward adds the same gradient again
        torch.testing.assert_close(2 * a, c, rtol=0, atol=1e-5)
