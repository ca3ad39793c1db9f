"""Policy, value, entropy and KL losses, and how token losses become one scalar.

Pure tensor functions on padded tensors (`_B` batch, `_T` tokens, `_V` vocabulary; mask 1 =
the token counts, i.e. it was sampled by the policy). No model, no I/O, no global state.

What is here, and the papers it follows:
- `policy_loss`: PPO's clipped surrogate (Schulman et al. 2017) with
  * asymmetric clipping, ratio in [1 - clip_low, 1 + clip_high] (DAPO "clip-higher", Yu et al. 2025);
  * optional dual clip (Ye et al. 2020, as in verl): for negative advantages the loss is capped
    at dual_clip * (-adv), so a huge ratio on a bad token cannot dominate the update;
  * optional decoupled PPO (AReaL, Fu et al. 2025) for off-policy (stale) rollouts: with
    `behav_logp_BT` given, `old_logp_BT` is the *proximal* policy (recomputed by the trainer)
    and each token loss is weighted by the detached importance weight
    exp(old_logp - behav_logp). With `behav_imp_cap`, tokens whose weight exceeds the cap get
    weight 0 but stay in the denominator of the aggregation -- exactly as AReaL does.
  The log-ratio is clamped to [-20, 20] before the exp (verl) so the ratio is never inf.
- `gspo_loss`: GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", Qwen): one
  importance ratio per sequence, the length-normalised geometric mean of its token ratios
  s = exp(mean_t(logp - old_logp)), clipped per sequence; `token=True` is GSPO-token, whose
  per-token ratio sg(s) * p / sg(p) has the value s and lets each token carry its own advantage
  (with one advantage per sequence both give the same gradient).
- `cispo_loss`: CISPO (MiniMax-M1, 2025): the importance-sampling weight itself is clipped and
  detached, w = sg(clip(r, 1 - clip_low, 1 + clip_high)), and the loss -A * w * logp keeps every
  token's gradient (PPO zeroes the gradient of a clipped token).
- `POLICY_LOSSES`: `algo.policy_loss` -> one of the three (same call signature).
- `value_loss`: PPO's clipped value loss 0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2).
- `entropy_from_logits`: entropy of the softmax, in float32, chunked over rows to bound memory.
- `kl_loss`: a KL estimator (k1/k2/k3, see advantages.kl_estimate) as a loss term (GRPO's KL
  penalty; k3 is verl's "low_var_kl").
- `aggregate`: token-mean (DAPO), seq-mean-token-mean (original GRPO), seq-mean-token-sum, and
  seq-mean-token-sum-norm (Dr. GRPO, Liu et al. 2025: divide the total by B * a constant).
  Dr. GRPO divides by a fixed constant (the generation budget); we default it to T, the padded
  length, which is only constant if the trainer pads to the budget -- pass `norm_const` (e.g.
  max_new_tokens) otherwise. verl divides by T alone (no B); we follow the paper (B * const).
  With gradient accumulation over micro-batches the local token-mean is not the global one:
  scale each micro-batch loss by its share of the valid tokens.

Run the tests: `python -m pytest tests/unit/test_losses.py -q`.
"""

from __future__ import annotations

import functools

import torch

from seekrl.algo.advantages import kl_estimate
from seekrl.algo.config import AGG_MODES
from seekrl.algo.mismatch import Correction, correction_weights

__all__ = [
    "AGG_MODES",
    "masked_mean",
    "aggregate",
    "policy_loss",
    "gspo_loss",
    "cispo_loss",
    "POLICY_LOSSES",
    "value_loss",
    "entropy_from_logits",
    "kl_loss",
]



def _check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; they must match")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (mask broadcasts to x). Empty -> 0, never NaN.

    Masked positions are selected out with `where`, so inf/NaN there do not leak in.
    """
    m = mask.bool().expand(x.shape)
    xm = torch.where(m, x, torch.zeros_like(x))
    if dim is None:
        return xm.sum() / m.sum().clamp(min=1)
    return xm.sum(dim) / m.sum(dim).clamp(min=1)


def aggregate(
    x_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str = "token-mean", norm_const: float | None = None
) -> torch.Tensor:
    """Reduce per-token values x_BT (B, T) to a scalar, counting only mask_BT == 1.

    "token-mean":              sum of valid tokens / number of valid tokens
    "seq-mean-token-mean":     mean over its valid tokens per row, then mean over rows with >= 1 valid token
    "seq-mean-token-sum":      sum over its valid tokens per row, then mean over rows with >= 1 valid token
    "seq-mean-token-sum-norm": sum of valid tokens / (B * norm_const); norm_const defaults to T
    An all-zero mask gives 0 (with a grad_fn when x requires grad), never NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes are {', '.join(AGG_MODES)}")
    if x_BT.dim() != 2:
        raise ValueError(f"aggregate expects x of shape (B, T), got {tuple(x_BT.shape)}")
    _check_same_shape("x_BT", x_BT, "mask_BT", mask_BT)
    m_BT = mask_BT.bool()
    xm_BT = torch.where(m_BT, x_BT, torch.zeros_like(x_BT))
    if mode == "token-mean":
        return xm_BT.sum() / m_BT.sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        B, T = x_BT.shape
        const = float(T) if norm_const is None else float(norm_const)
        if const <= 0:
            raise ValueError(f"norm_const must be > 0, got {norm_const}")
        return xm_BT.sum() / (max(B, 1) * const)
    count_B = m_BT.sum(-1)  # (B,)
    seq_B = xm_BT.sum(-1)  # (B,) token-sum
    if mode == "seq-mean-token-mean":
        seq_B = seq_B / count_B.clamp(min=1)
    has_B = count_B > 0
    return torch.where(has_B, seq_B, torch.zeros_like(seq_B)).sum() / has_B.sum().clamp(min=1)


@torch.no_grad()
def _frac(flag_BT: torch.Tensor, m_BT: torch.Tensor) -> float:
    return float((flag_BT & m_BT).sum().item() / max(int(m_BT.sum().item()), 1))


def _check_objective_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT, is_weight_BT) -> torch.Tensor:
    """Shapes checked; adv as (B, T) (a (B,) advantage broadcast over tokens), detached."""
    _check_same_shape("logp_BT", logp_BT, "mask_BT", mask_BT)
    _check_same_shape("old_logp_BT", old_logp_BT, "mask_BT", mask_BT)
    if is_weight_BT is not None:
        _check_same_shape("is_weight_BT", is_weight_BT, "mask_BT", mask_BT)
    if adv_BT.dim() == 1:
        if adv_BT.shape[0] != logp_BT.shape[0]:
            raise ValueError(f"adv_B has {adv_BT.shape[0]} rows but logp_BT has {logp_BT.shape[0]}")
        adv_BT = adv_BT[:, None].expand(logp_BT.shape)
    _check_same_shape("adv_BT", adv_BT, "mask_BT", mask_BT)
    return adv_BT.detach().to(logp_BT.dtype)


def policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    behav_logp_BT: torch.Tensor | None = None,
    behav_imp_cap: float | None = None,
    norm_const: float | None = None,
    is_weight_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate loss (to minimize) and stats.

    logp_BT (B, T): current policy log-probs of the taken tokens (carries the graph).
    old_logp_BT (B, T): log-probs under the policy that sampled them (or, with behav_logp_BT,
    the proximal policy). adv_BT: (B, T) or (B,) (broadcast over tokens). All but logp_BT are
    detached. Per token, with r = exp(logp - old_logp):
        l = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
        if dual_clip and A < 0: l = min(l, -A * dual_clip)
        if behav_logp_BT: l = l * w, w = exp(old_logp - behav_logp) (0 where w > behav_imp_cap)
        if is_weight_BT: l = l * is_weight_BT (a detached importance weight, algo/mismatch.py)
    then `aggregate(l, mask_BT, agg, norm_const)`.
    stats (python floats): clip_frac (= clip_frac_low + clip_frac_high: valid tokens where the
    clipped branch is active, hence zero gradient), clip_frac_low (A < 0, r < 1 - clip_low),
    clip_frac_high (A > 0, r > 1 + clip_high), dual_clip_frac, approx_kl (token-mean of
    k2 = 0.5 * (logp - old_logp)^2, always >= 0), ratio_mean, ratio_max (over valid tokens);
    with behav_logp_BT also behav_imp_weight_mean (before the cap) and behav_cap_frac.
    """
    if not (0.0 <= clip_low < 1.0):
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (it bounds the ratio for negative advantages), got {dual_clip}")
    if behav_imp_cap is not None and behav_imp_cap <= 0.0:
        raise ValueError(f"behav_imp_cap must be > 0, got {behav_imp_cap}")
    if behav_imp_cap is not None and behav_logp_BT is None:
        raise ValueError("behav_imp_cap needs behav_logp_BT (decoupled PPO)")
    adv_BT = _check_objective_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT, is_weight_BT)
    m_BT = mask_BT.bool()
    old_logp_BT = old_logp_BT.detach()
    log_ratio_BT = logp_BT - old_logp_BT  # (B, T)
    ratio_BT = torch.exp(log_ratio_BT.clamp(-20.0, 20.0))  # (B, T)
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    loss_unclipped_BT = -adv_BT * ratio_BT
    loss_clipped_BT = -adv_BT * ratio_BT.clamp(lo, hi)
    loss_BT = torch.maximum(loss_unclipped_BT, loss_clipped_BT)  # pessimistic bound
    is_clipped_BT = loss_clipped_BT > loss_unclipped_BT  # clipped branch active -> zero grad
    neg_BT = adv_BT < 0
    if dual_clip is not None:
        loss_dual_BT = -adv_BT * dual_clip  # (B, T), no grad
        is_dual_BT = neg_BT & (loss_BT > loss_dual_BT)
        loss_BT = torch.where(neg_BT, torch.minimum(loss_BT, loss_dual_BT), loss_BT)
    else:
        is_dual_BT = torch.zeros_like(m_BT)

    stats: dict[str, float] = {}
    if behav_logp_BT is not None:
        _check_same_shape("behav_logp_BT", behav_logp_BT, "mask_BT", mask_BT)
        c = Correction("mis" if behav_imp_cap is not None else "none", "token", behav_imp_cap)
        w_BT, wstats = correction_weights(old_logp_BT, behav_logp_BT, mask_BT, c, dtype=loss_BT.dtype)
        stats["behav_imp_weight_mean"] = wstats["weight_mean"]
        stats["behav_cap_frac"] = wstats["masked_frac"]
        loss_BT = loss_BT * w_BT
    if is_weight_BT is not None:
        loss_BT = loss_BT * is_weight_BT.detach().to(loss_BT.dtype)

    loss = aggregate(loss_BT, m_BT, agg, norm_const)

    with torch.no_grad():
        low_BT = is_clipped_BT & (ratio_BT < lo)
        high_BT = is_clipped_BT & (ratio_BT > hi)
        n_valid = int(m_BT.sum().item())
        stats.update(
            clip_frac=_frac(is_clipped_BT, m_BT),
            clip_frac_low=_frac(low_BT, m_BT),
            clip_frac_high=_frac(high_BT, m_BT),
            dual_clip_frac=_frac(is_dual_BT, m_BT),
            approx_kl=float(masked_mean(0.5 * log_ratio_BT.square(), m_BT).item()),
            ratio_mean=float(masked_mean(ratio_BT, m_BT).item()),
            ratio_max=float(ratio_BT[m_BT].max().item()) if n_valid else 0.0,
        )
    return loss, stats


def gspo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    norm_const: float | None = None,
    is_weight_BT: torch.Tensor | None = None,
    token: bool = False,
    **_unused,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's clipped surrogate with a sequence-level ratio (Zheng et al. 2025), to minimize.

    Per row i, over its valid tokens (mask 1): s_i = exp(mean_t(logp_it - old_logp_it)).
      sequence (token=False): A_i = mean_t(adv_it); l_i = max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high)),
        put on each valid token of row i (so seq-mean-token-mean, the paper's 1/G sum_i, gives mean_i l_i);
      GSPO-token (token=True): s_it = sg(s_i) * exp(logp_it - sg(logp_it)) (value s_i, gradient
        s_i * grad logp_it); l_it = max(-A_it s_it, -A_it clip(s_it, ...)).
    `is_weight_BT` (mismatch / decoupled weights, detached) multiplies the token losses (for the
    sequence form, whose loss is the same on each token, that weighs row i by the mean of its
    tokens' weights); then `aggregate(l, mask_BT, agg, norm_const)`. Rows without valid tokens
    contribute nothing.
    stats: clip_frac (valid tokens whose sequence ratio is clipped: zero gradient),
    clip_frac_low, clip_frac_high, dual_clip_frac (0), approx_kl (token k2), ratio_mean and
    ratio_max (of the sequence ratios, over rows with a valid token).
    """
    if not (0.0 <= clip_low < 1.0):
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    adv_BT = _check_objective_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT, is_weight_BT)
    m_BT = mask_BT.bool()
    mf_BT = m_BT.to(logp_BT.dtype)
    logp_BT = torch.where(m_BT, logp_BT, torch.zeros_like(logp_BT))  # padding may hold -inf / nan
    log_ratio_BT = torch.where(m_BT, logp_BT - old_logp_BT.detach(), torch.zeros_like(logp_BT))
    n_B = mf_BT.sum(-1)  # (B,)
    seq_log_ratio_B = (log_ratio_BT.sum(-1) / n_B.clamp(min=1)).clamp(-20.0, 20.0)  # (B,)
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    if token:
        s_BT = torch.exp(seq_log_ratio_B.detach())[:, None] * torch.exp(logp_BT - logp_BT.detach())  # (B, T)
        a_BT = adv_BT
    else:
        s_BT = torch.exp(seq_log_ratio_B)[:, None].expand(logp_BT.shape)  # (B, T): the row's ratio on each token
        a_BT = ((adv_BT * mf_BT).sum(-1) / n_B.clamp(min=1))[:, None].expand(logp_BT.shape)
    loss_unclipped_BT = -a_BT * s_BT
    loss_clipped_BT = -a_BT * s_BT.clamp(lo, hi)
    loss_BT = torch.maximum(loss_unclipped_BT, loss_clipped_BT)
    if is_weight_BT is not None:
        loss_BT = loss_BT * is_weight_BT.detach().to(loss_BT.dtype)
    loss = aggregate(loss_BT, m_BT, agg, norm_const)
    with torch.no_grad():
        s_B = torch.exp(seq_log_ratio_B.detach())
        is_clipped_BT = loss_clipped_BT > loss_unclipped_BT
        has_B = n_B > 0
        stats = dict(
            clip_frac=_frac(is_clipped_BT, m_BT),
            clip_frac_low=_frac(is_clipped_BT & (s_B[:, None] < lo), m_BT),
            clip_frac_high=_frac(is_clipped_BT & (s_B[:, None] > hi), m_BT),
            dual_clip_frac=0.0,
            approx_kl=float(masked_mean(0.5 * log_ratio_BT.detach().square(), m_BT).item()),
            ratio_mean=float(s_B[has_B].mean().item()) if bool(has_B.any()) else 1.0,
            ratio_max=float(s_B[has_B].max().item()) if bool(has_B.any()) else 0.0,
        )
    return loss, stats


def cispo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float = 1.0,
    clip_high: float = 5.0,
    agg: str = "token-mean",
    norm_const: float | None = None,
    is_weight_BT: torch.Tensor | None = None,
    **_unused,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, 2025), to minimize: l = -A * sg(clip(r, 1 - clip_low, 1 + clip_high)) * logp.

    r = exp(logp - old_logp) per token (log-ratio clamped to [-20, 20]); clip_low = 1 leaves the
    weight unbounded below (the paper's choice). The weight is detached, so every valid token
    keeps the gradient -A * w * grad logp, clipped or not. `is_weight_BT` (mismatch / decoupled
    weights) multiplies it; then `aggregate(l, mask_BT, agg, norm_const)`.
    stats: clip_frac (valid tokens whose weight was clipped; they still train), clip_frac_low,
    clip_frac_high, dual_clip_frac (0), approx_kl, ratio_mean, ratio_max (of r).
    """
    if not (0.0 <= clip_low <= 1.0):
        raise ValueError(f"clip_low must be in [0, 1], got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    adv_BT = _check_objective_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT, is_weight_BT)
    m_BT = mask_BT.bool()
    log_ratio_BT = logp_BT.detach() - old_logp_BT.detach()
    ratio_BT = torch.exp(log_ratio_BT.clamp(-20.0, 20.0))
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    w_BT = ratio_BT.clamp(lo, hi)
    if is_weight_BT is not None:
        w_BT = w_BT * is_weight_BT.detach().to(w_BT.dtype)
    logp_safe_BT = torch.where(m_BT, logp_BT, torch.zeros_like(logp_BT))  # padding may hold -inf
    loss_BT = -adv_BT * w_BT * logp_safe_BT
    loss = aggregate(loss_BT, m_BT, agg, norm_const)
    with torch.no_grad():
        low_BT, high_BT = ratio_BT < lo, ratio_BT > hi
        n_valid = int(m_BT.sum().item())
        stats = dict(
            clip_frac=_frac(low_BT | high_BT, m_BT),
            clip_frac_low=_frac(low_BT, m_BT),
            clip_frac_high=_frac(high_BT, m_BT),
            dual_clip_frac=0.0,
            approx_kl=float(masked_mean(0.5 * log_ratio_BT.square(), m_BT).item()),
            ratio_mean=float(masked_mean(ratio_BT, m_BT).item()),
            ratio_max=float(ratio_BT[m_BT].max().item()) if n_valid else 0.0,
        )
    return loss, stats


POLICY_LOSSES = {
    "ppo": policy_loss,
    "gspo": gspo_loss,
    "gspo_token": functools.partial(gspo_loss, token=True),
    "cispo": cispo_loss,
}


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    norm_const: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped value loss: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2).

    values_BT (B, T) carries the graph; old_values_BT and returns_BT are detached. clip=None
    gives the plain 0.5 * (V - R)^2. stats: vf_clip_frac (valid tokens where the clipped term
    is the larger, hence zero gradient), value_mean, returns_mean, explained_var
    (1 - Var[R - V] / Var[R] over valid tokens; 0 when Var[R] is 0).
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip}")
    _check_same_shape("values_BT", values_BT, "mask_BT", mask_BT)
    _check_same_shape("old_values_BT", old_values_BT, "mask_BT", mask_BT)
    _check_same_shape("returns_BT", returns_BT, "mask_BT", mask_BT)
    m_BT = mask_BT.bool()
    old_values_BT = old_values_BT.detach().to(values_BT.dtype)
    returns_BT = returns_BT.detach().to(values_BT.dtype)
    loss_unclipped_BT = (values_BT - returns_BT).square()  # (B, T)
    if clip is not None:
        v_clipped_BT = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
        loss_clipped_BT = (v_clipped_BT - returns_BT).square()
        loss_BT = 0.5 * torch.maximum(loss_unclipped_BT, loss_clipped_BT)
        is_clipped_BT = loss_clipped_BT > loss_unclipped_BT
    else:
        loss_BT = 0.5 * loss_unclipped_BT
        is_clipped_BT = torch.zeros_like(m_BT)
    loss = aggregate(loss_BT, m_BT, agg, norm_const)
    with torch.no_grad():
        v_BT = values_BT.detach()
        ret_mean = masked_mean(returns_BT, m_BT)
        var_ret = masked_mean((returns_BT - ret_mean).square(), m_BT)
        err_BT = returns_BT - v_BT
        var_err = masked_mean((err_BT - masked_mean(err_BT, m_BT)).square(), m_BT)
        ev = float((1.0 - var_err / var_ret).item()) if float(var_ret.item()) > 0 else 0.0
        stats = {
            "vf_clip_frac": _frac(is_clipped_BT, m_BT),
            "value_mean": float(masked_mean(v_BT, m_BT).item()),
            "returns_mean": float(ret_mean.item()),
            "explained_var": ev,
        }
    return loss, stats


def entropy_from_logits(logits_BTV: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: (..., V) -> (...), in float32.

    H = logsumexp(z) - sum(softmax(z) * z), computed in float32 on `chunk_size` rows at a time
    so a bf16 (B, T, V) tensor is never upcast whole. -inf logits (masked vocabulary) are safe.
    Keeps the graph (for an entropy bonus).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead = logits_BTV.shape[:-1]
    z_NV = logits_BTV.reshape(-1, logits_BTV.shape[-1])
    out = []
    for start in range(0, z_NV.shape[0], chunk_size):
        z = z_NV[start : start + chunk_size].float()  # (n, V)
        lse_n = torch.logsumexp(z, dim=-1)
        p = torch.softmax(z, dim=-1)
        z_safe = torch.where(torch.isneginf(z), torch.zeros_like(z), z)  # p = 0 there; avoid 0 * -inf
        out.append(lse_n - (p * z_safe).sum(-1))
    if not out:
        return torch.zeros(lead, dtype=torch.float32, device=logits_BTV.device)
    return torch.cat(out).reshape(lead)


def kl_loss(
    logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    kind: str = "k3",
    agg: str = "token-mean",
    norm_const: float | None = None,
) -> torch.Tensor:
    """KL(pi || ref) penalty as a loss term: aggregate(kl_estimate(logp, ref_logp, kind)).

    ref_logp_BT is detached; the default k3 is GRPO's / verl's "low_var_kl".
    """
    _check_same_shape("logp_BT", logp_BT, "mask_BT", mask_BT)
    kl_BT = kl_estimate(logp_BT, ref_logp_BT.detach(), kind)  # (B, T)
    return aggregate(kl_BT, mask_BT, agg, norm_const)
