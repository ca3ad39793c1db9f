"""Per-token advantages for every algorithm, from rewards (and values, reference log-probs).

    grpo          (r - mean_group) / std_group                    Shao et al. 2024
    dr_grpo       r - mean_group (no std scaling)                 Liu et al. 2025
    rloo          r - mean of the other G-1 samples               Ahmadian et al. 2024
    reinforce_pp  return-to-go, whitened over the batch           Hu 2025 (REINFORCE++)
    ppo           GAE over sampled tokens with a learned critic   Schulman et al. 2017

KL in the reward (`algo.kl_in=reward`): PPO and REINFORCE++ subtract `coef * kl_t` at every
sampled token (InstructGPT); the outcome-only estimators (GRPO family) subtract
`coef * Σ_t kl_t` from the sequence reward before the group baseline. Everything returned is
in completion layout `(B, C)` (train/batch.py), zero past each row's end; inserted tokens get
advantage 0 and are skipped by GAE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seekrl.algo.advantages import gae, group_advantages, kl_estimate, token_rewards_with_kl, whiten
from seekrl.train.batch import TokenBatch

__all__ = ["GROUP_ESTIMATORS", "Estimate", "estimate_advantages"]

GROUP_ESTIMATORS = {
    "grpo": dict(baseline="mean", scale="std"),
    "dr_grpo": dict(baseline="mean", scale="none"),
    "rloo": dict(baseline="rloo", scale="none"),
}


@dataclass
class Estimate:
    adv_BC: torch.Tensor  # per token
    returns_BC: torch.Tensor | None  # per token (PPO critic targets)
    kl_mean: float | None  # mean per-token KL(policy_old || ref) on sampled tokens, when computed


def estimate_advantages(
    algo: str,
    batch: TokenBatch,
    *,
    ref_logp_BC: torch.Tensor | None = None,
    kl_coef_in_reward: float = 0.0,
    kl_estimator: str = "k1",
    values_BC: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> Estimate:
    """Advantages (and PPO's returns) of `batch` for `algo.name`; the KL against the reference
    is taken from `batch.old_logp_BC` and `ref_logp_BC` when both are given."""
    mask_BC = batch.loss_mask_BC
    rewards_B = batch.rewards_B
    kl_BC = None
    kl_mean = None
    if ref_logp_BC is not None and batch.old_logp_BC is not None:
        kl_BC = kl_estimate(batch.old_logp_BC, ref_logp_BC, kind=kl_estimator) * mask_BC
        kl_mean = float(kl_BC.sum() / mask_BC.sum().clamp(min=1))

    if algo in GROUP_ESTIMATORS:
        if kl_BC is not None and kl_coef_in_reward > 0:
            rewards_B = rewards_B - kl_coef_in_reward * kl_BC.sum(-1)
        adv_B = group_advantages(rewards_B, batch.group_ids_B, **GROUP_ESTIMATORS[algo])
        return Estimate(batch.trim(adv_B[:, None] * mask_BC), None, kl_mean)

    coef = kl_coef_in_reward if kl_BC is not None else 0.0
    token_rewards_BC = token_rewards_with_kl(rewards_B, kl_BC if kl_BC is not None else torch.zeros_like(mask_BC), mask_BC, coef)
    if algo == "reinforce_pp":
        # Return-to-go with gamma = 1 is GAE with zero values and lam = 1; then batch whitening.
        returns_BC, _ = gae(token_rewards_BC, torch.zeros_like(mask_BC), mask_BC, 1.0, 1.0)
        return Estimate(batch.trim(whiten(returns_BC, mask_BC) * mask_BC), None, kl_mean)
    if algo == "ppo":
        if values_BC is None:
            raise ValueError("ppo needs the critic's values")
        adv_BC, returns_BC = gae(token_rewards_BC, values_BC, mask_BC, gamma, lam)
        return Estimate(batch.trim(whiten(adv_BC, mask_BC) * mask_BC), batch.trim(returns_BC), kl_mean)
    raise ValueError(f"unknown algorithm '{algo}'")
