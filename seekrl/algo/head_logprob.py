"""Log-probs (and entropy) of chosen tokens through the LM head, without full-vocabulary logits.

`head_logprob_entropy(hidden_NH, weight_VH, bias_V, targets_N, temperature)` returns, per row n,

    logp[n] = log_softmax(z[n])[targets[n]]      ent[n] = H(softmax(z[n]))
    z[n]    = (hidden[n] @ weight.T + bias) / temperature           (float32)

(`temperature` one float, or one per row: a `(N,)` tensor, for rows sampled at different
temperatures, rollout.branch_temperature.)

as the plain `head(hidden).float() / T` → gather / logsumexp → entropy would, but it projects
`chunk` rows at a time and keeps only `hidden` and one float per row (the logsumexp) for the
backward, which recomputes each chunk's logits (unless all of them fit in `KEEP_BYTES`: then the
forward keeps them and the backward spends no second matmul; a small vocabulary's case). The float32 `(N, V)` logits, their softmax and
their gradient are never materialised whole: with SmolLM2's 49,152-token vocabulary, 4,096
completion tokens would need 805 MB per such tensor; a chunk needs `chunk × V × 4` bytes.

Backward, per chunk (p = softmax(z), g = upstream gradients of logp and ent):

    dlogp/dz = onehot(target) - p          dH/dz = -p * (z - sum(p * z))

then through `/ T` and the linear map: dhidden = dz_raw @ weight, dweight = dz_raw.T @ hidden.
The weight may be frozen (reference model, LoRA base): its gradient is only computed when asked.
Exact to float rounding against the plain path (tests/unit/test_head_logprob.py).
"""

from __future__ import annotations

import torch

__all__ = ["head_logprob_entropy", "auto_chunk", "worth_chunking"]

CHUNK_BYTES = 32 * 2**20  # float32 logits of one chunk: rows × vocabulary × 4 bytes
KEEP_BYTES = 128 * 2**20  # all the logits up to this size are kept for the backward instead of recomputed


def worth_chunking(n: int, vocab: int) -> bool:
    """Whether `n` rows of logits over `vocab` are too big to hold whole (more than KEEP_BYTES):
    below that, the plain `head(h).float()` + log-softmax path is as lean and a little faster."""
    return n * vocab * 4 > KEEP_BYTES


def auto_chunk(vocab: int) -> int:
    """Rows per chunk so that one chunk's float32 logits take about CHUNK_BYTES."""
    return max(16, CHUNK_BYTES // (4 * max(1, vocab)))


def _rows(inv_t: float | torch.Tensor, s: int, chunk: int) -> float | torch.Tensor:
    """The inverse temperature of rows s .. s + chunk: the float, or their column `(n, 1)`."""
    return inv_t[s : s + chunk, None] if isinstance(inv_t, torch.Tensor) else inv_t


def _chunk_logits(h_nH, weight_VH, bias_V, inv_t: float | torch.Tensor) -> torch.Tensor:
    z = torch.nn.functional.linear(h_nH, weight_VH, bias_V).float()
    return z * inv_t if isinstance(inv_t, torch.Tensor) or inv_t != 1.0 else z


class _HeadLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, targets_N, inv_t: float, chunk: int, entropy: bool):
        N = hidden_NH.shape[0]
        logp = hidden_NH.new_empty(N, dtype=torch.float32)
        ent = hidden_NH.new_empty(N, dtype=torch.float32) if entropy else None
        lse = hidden_NH.new_empty(N, dtype=torch.float32)
        masked = bool(torch.isinf(bias_V).any())  # -inf logits: p = 0 there, and p * z must be 0, not nan
        keep = any(ctx.needs_input_grad[:3]) and not masked and N * weight_VH.shape[0] * 4 <= KEEP_BYTES
        ctx.kept = [] if keep else None
        for s in range(0, N, chunk):
            z = _chunk_logits(hidden_NH[s : s + chunk], weight_VH, bias_V, _rows(inv_t, s, chunk))
            if keep:  # small enough: the backward reuses them (and overwrites them) instead of a matmul
                ctx.kept.append(z)
            lse_n = torch.logsumexp(z, dim=-1)
            lse[s : s + chunk] = lse_n
            logp[s : s + chunk] = z.gather(-1, targets_N[s : s + chunk, None]).squeeze(-1) - lse_n
            if entropy:
                p = torch.exp(z - lse_n[:, None])
                if masked:
                    z.masked_fill_(p == 0, 0.0)
                ent[s : s + chunk] = lse_n - (p * z).sum(-1)
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, targets_N, lse)
        ctx.inv_t, ctx.chunk = inv_t, chunk
        ctx.masked = masked
        ctx.set_materialize_grads(False)
        if entropy:
            return logp, ent
        return logp, None

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden_NH, weight_VH, bias_V, targets_N, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None, None
        g_h = torch.zeros_like(hidden_NH) if need_h else None
        g_w = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if need_w else None
        g_b = torch.zeros(bias_V.shape, dtype=torch.float32, device=bias_V.device) if need_b else None
        kept, ctx.kept = ctx.kept, None  # overwritten below: a second backward (retain_graph) recomputes
        for i, s in enumerate(range(0, hidden_NH.shape[0], ctx.chunk)):
            h = hidden_NH[s : s + ctx.chunk]
            inv_t = _rows(ctx.inv_t, s, ctx.chunk)
            z = kept[i] if kept else _chunk_logits(h, weight_VH, bias_V, inv_t)
            p = torch.exp(z - lse[s : s + ctx.chunk, None])
            # dz = -p * (g_logp + g_ent * (z - E_p[z])), plus g_logp at the target: in place on z
            if g_ent is not None:
                if ctx.masked:
                    z.masked_fill_(p == 0, 0.0)
                z.sub_((p * z).sum(-1, keepdim=True)).mul_(g_ent[s : s + ctx.chunk, None].float())
                gz = z
            else:
                gz = z.zero_()
            if g_logp is not None:
                gl = g_logp[s : s + ctx.chunk].float()
                gz.add_(gl[:, None])
            gz.mul_(p).neg_()
            if g_logp is not None:
                gz.scatter_add_(-1, targets_N[s : s + ctx.chunk, None], gl[:, None])
            if isinstance(inv_t, torch.Tensor) or inv_t != 1.0:
                gz.mul_(inv_t)
            gz = gz.to(hidden_NH.dtype)
            if need_h:
                g_h[s : s + ctx.chunk] = gz @ weight_VH
            if need_w:
                g_w += (gz.t() @ h).float()
            if need_b:
                g_b += gz.float().sum(0)
        g_w = g_w.to(weight_VH.dtype) if g_w is not None else None
        g_b = g_b.to(bias_V.dtype) if g_b is not None else None
        return g_h, g_w, g_b, None, None, None, None


def head_logprob_entropy(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                         targets_N: torch.Tensor, temperature: float | torch.Tensor = 1.0, *, entropy: bool = True,
                         chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp_N, ent_N or None), float32, differentiable in `hidden_NH`, `weight_VH` and `bias_V`
    (module docstring). `temperature` <= 0 means 1 (greedy sampling scores the plain softmax);
    a `(N,)` tensor gives each row its own."""
    if isinstance(temperature, torch.Tensor):
        t = temperature.float().to(hidden_NH.device)
        inv_t = 1.0 / torch.where(t > 0, t, torch.ones_like(t))
    else:
        inv_t = 1.0 / (temperature if temperature > 0 else 1.0)
    chunk = chunk or auto_chunk(weight_VH.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if bias_V is None:  # autograd.Function inputs must be tensors to get a gradient; a zero bias has none
        bias_V = weight_VH.new_zeros(weight_VH.shape[0])
    return _HeadLogprobEntropy.apply(hidden_NH, weight_VH, bias_V, targets_N, inv_t, int(chunk), entropy)
