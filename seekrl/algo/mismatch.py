"""Importance weights that correct for the gap between the engine that sampled and the trainer.

An engine that samples in another precision or kernel (vLLM, SGLang, a bf16 server) gives
behaviour log-probs log π_behav that differ from the trainer's log π_old on the same weights.
PPO's ratio is taken against π_old, so the update is off-policy by ρ = π_old / π_behav per
sampled token. These functions turn ρ into a detached weight that multiplies each token's loss
(the tokens a weight of 0 drops stay in the aggregation's denominator, as AReaL does):

    level    token      ρ_t
             sequence   Π_t ρ_t over the row's sampled tokens (one weight per row)
             geometric  exp(mean_t log ρ_t) (one weight per row; length-independent)
    mode     tis        w = min(ρ, cap)                        truncated IS (Yao et al. 2025)
             mis        w = ρ if cap_low <= ρ <= cap else 0    masked IS (IcePop, Zhao et al. 2025)
             none       w = ρ                                  plain IS (decoupled PPO's weight)

The same functions weigh decoupled PPO's behaviour weight π_prox / π_behav (train/offpolicy.py),
of which the engine mismatch is a part. `mismatch_stats` measures the gap itself: the k3
estimate of KL(π_behav || π_old) on the sampled tokens and the largest token ratio.

Pure tensor functions, `(B, T)` in, no model. Tests: tests/unit/test_mismatch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Correction", "correction_weights", "mismatch_stats"]


@dataclass(frozen=True)
class Correction:
    """How behaviour log-probs weigh the loss (module docstring); `mode` none = the plain ratio."""

    mode: str = "tis"  # tis | mis | none
    level: str = "token"  # token | sequence | geometric
    cap: float | None = 2.0  # upper bound: truncation (tis) or mask (mis); None = no bound
    cap_low: float = 0.0  # mis: lower bound of the kept ratios

    def __post_init__(self) -> None:
        if self.mode not in ("tis", "mis", "none"):
            raise ValueError(f"unknown correction mode {self.mode!r}; choose tis, mis or none")
        if self.level not in ("token", "sequence", "geometric"):
            raise ValueError(f"unknown correction level {self.level!r}; choose token, sequence or geometric")
        if self.cap is not None and self.cap <= 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")
        if self.cap_low < 0 or (self.cap is not None and self.cap_low >= self.cap):
            raise ValueError(f"cap_low must be >= 0 and below cap, got {self.cap_low} (cap {self.cap})")


def _frac(flag_BT: torch.Tensor, m_BT: torch.Tensor) -> float:
    return float((flag_BT & m_BT).sum().item() / max(int(m_BT.sum().item()), 1))


@torch.no_grad()
def correction_weights(
    target_logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor, mask_BT: torch.Tensor, c: Correction, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached weights (B, T) for each token's loss, and stats: `weight_mean` (of the ratio before
    the cap/mask, over sampled tokens), `truncated_frac` (tis: tokens whose weight was cut to the
    cap), `masked_frac` (mis: tokens given weight 0). `target_logp_BT` is the policy the update is
    taken against (π_old, or π_prox with decoupled PPO)."""
    if target_logp_BT.shape != behav_logp_BT.shape or target_logp_BT.shape != mask_BT.shape:
        raise ValueError(f"shapes differ: target {tuple(target_logp_BT.shape)}, behav {tuple(behav_logp_BT.shape)}, mask {tuple(mask_BT.shape)}")
    dtype = dtype or target_logp_BT.dtype
    m_BT = mask_BT.bool()
    log_rho_BT = (target_logp_BT.detach() - behav_logp_BT.detach()).clamp(-20.0, 20.0)
    if c.level == "token":
        rho_BT = torch.exp(log_rho_BT).to(dtype)
    else:
        lr_BT = torch.where(m_BT, log_rho_BT, torch.zeros_like(log_rho_BT))
        seq_B = lr_BT.sum(-1)
        if c.level == "geometric":
            seq_B = seq_B / m_BT.sum(-1).clamp(min=1)
        rho_BT = torch.exp(seq_B.clamp(-20.0, 20.0))[:, None].expand(log_rho_BT.shape).to(dtype)
    stats = {"weight_mean": float(_masked_mean(rho_BT, m_BT)), "truncated_frac": 0.0, "masked_frac": 0.0}
    if c.mode == "tis" and c.cap is not None:
        over_BT = rho_BT > c.cap
        stats["truncated_frac"] = _frac(over_BT, m_BT)
        return torch.where(over_BT, torch.full_like(rho_BT, c.cap), rho_BT), stats
    if c.mode == "mis":
        out_BT = rho_BT < c.cap_low
        if c.cap is not None:
            out_BT = out_BT | (rho_BT > c.cap)
        stats["masked_frac"] = _frac(out_BT, m_BT)
        return torch.where(out_BT, torch.zeros_like(rho_BT), rho_BT), stats
    return rho_BT, stats


def _masked_mean(x_BT: torch.Tensor, m_BT: torch.Tensor) -> float:
    return float(torch.where(m_BT, x_BT, torch.zeros_like(x_BT)).sum() / m_BT.sum().clamp(min=1))


@torch.no_grad()
def mismatch_stats(trainer_logp_BT: torch.Tensor, engine_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """The gap between engine and trainer log-probs of the same tokens under the same weights:
    `kl` = mean k3 estimate of KL(π_engine || π_trainer) over the masked tokens (>= 0; 0 when they
    agree), `ratio_max` = largest π_trainer / π_engine, `abs_diff_max` = largest |Δ log-prob|,
    `tokens` = how many tokens were compared."""
    m_BT = mask_BT.bool()
    n = int(m_BT.sum())
    if n == 0:
        return {"kl": 0.0, "ratio_max": 1.0, "abs_diff_max": 0.0, "tokens": 0.0}
    d = (trainer_logp_BT.double() - engine_logp_BT.double())[m_BT].clamp(-20.0, 20.0)  # log ρ
    k3 = torch.expm1(d) - d  # ρ - 1 - log ρ >= 0, computed without cancellation for small d
    return {"kl": float(k3.mean()), "ratio_max": float(torch.exp(d).max()), "abs_diff_max": float(d.abs().max()), "tokens": float(n)}
