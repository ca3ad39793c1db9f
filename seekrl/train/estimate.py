"""Per-token advantages for every algorithm, from rewards (and values, reference log-probs).

    grpo          (r - mean_group) / std_group                    Shao et al. 2024
    dr_grpo       r - mean_group (no std scaling)                 Liu et al. 2025
    rloo          r - mean of the other G-1 samples               Ahmadian et al. 2024
    reinforce_pp  return-to-go, whitened over the batch           Hu 2025 (REINFORCE++)
    ppo           GAE over sampled tokens with a learned critic   Schulman et al. 2017
    distill       coef * (log p_teacher - log p_student) per token  Thinking Machines 2025; Qwen3 (algo/distill.py)

KL in the reward (`algo.kl_in=reward`): PPO and REINFORCE++ subtract `coef * kl_t` at every
sampled token (InstructGPT); the outcome-only estimators (GRPO family) subtract
`coef * Σ_t kl_t` from the sequence reward before the group baseline. Everything returned is
in completion layout `(B, C)` (train/batch.py), zero past each row's end; inserted tokens get
advantage 0 and are skipped by GAE.

Episodes and turns (group estimators): the baseline of a task is taken over its G episodes; a
stepwise episode (rollout.trajectory=stepwise: one row per turn, `batch.episode_ids_B`) counts
once, with its reward and whole-episode KL, and each of its rows gets the episode's advantage.
A token of turn k of an episode of K turns gets that advantage times `turn_gamma^(K-1-k)`, in
either layout (1 with the default turn_gamma = 1). With `turn_advantage`, the per-turn rewards
(`batch.turn_rewards`) give per-turn advantages (algo/advantages.py `turn_advantages`, same
baseline and scale as the outcome's), added on each turn's tokens.

Answer branches (rollout.answer_branches; `batch.branch_set_B`, `batch.shared_B`): a branch's
tokens get its own advantage. The history the set's episode shares with its branches gets the
mean advantage of the set (`branch_credit="mean"`, algo/advantages.py
`shared_history_advantages`) or the episode's own (`"episode"`, one sample of the same value);
`"local"` gives the history 0 and each row of a set its advantage less the set's mean (only the
reading trains, against the answers read from the same context).

On-policy distillation (`batch.teacher_logp_BC` filled in by the step's teacher): `distill` is the
teacher's dense reward alone (plus `-coef * kl_t` per token with a reference KL in the reward);
any other estimator with `distill_coef > 0` gets `distill_coef * (log p_teacher - log p_student)`
added to its advantages on the sampled tokens. The student's log-probs are the update's old
log-probs (`batch.old_logp_BC`); the mean reverse KL is reported as `distill/reverse_kl`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seekrl.algo.advantages import (
    episode_group_advantages,
    episode_sum,
    gae,
    shared_history_advantages,
    kl_estimate,
    token_rewards_with_kl,
    turn_advantages,
    turn_discount,
    whiten,
)
from seekrl.algo.distill import distill_advantages, mean_reverse_kl
from seekrl.train.batch import TokenBatch

__all__ = ["GROUP_ESTIMATORS", "Estimate", "estimate_advantages", "task_advantages"]

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
    metrics: dict[str, float] = field(default_factory=dict)  # distill/reverse_kl, when a teacher scored the batch


def estimate_advantages(algo: str, batch: TokenBatch, *, distill_coef: float | None = None, **kwargs) -> Estimate:
    """Advantages (and PPO's returns) of `batch` for `algo.name` (`kwargs`: `task_advantages`'),
    with `distill_coef` times the teacher's per-token reward added where `batch.teacher_logp_BC` is
    set (module docstring; None: 1 for distill, 0 otherwise, as algo.distill_coef)."""
    est = task_advantages(algo, batch, **kwargs)
    teacher_BC, student_BC = batch.teacher_logp_BC, batch.old_logp_BC
    if algo == "distill" and (teacher_BC is None or student_BC is None):
        raise ValueError("distill needs the teacher's log-probs (batch.teacher_logp_BC) and the student's (batch.old_logp_BC)")
    coef = (1.0 if algo == "distill" else 0.0) if distill_coef is None else distill_coef
    if teacher_BC is None or student_BC is None or (algo != "distill" and coef == 0):
        return est
    mask_BC = batch.loss_mask_BC
    est.adv_BC = batch.trim(distill_advantages(student_BC, teacher_BC, mask_BC, coef, est.adv_BC))
    est.metrics["distill/reverse_kl"] = mean_reverse_kl(student_BC, teacher_BC, mask_BC)
    return est


def task_advantages(
    algo: str,
    batch: TokenBatch,
    *,
    ref_logp_BC: torch.Tensor | None = None,
    kl_coef_in_reward: float = 0.0,
    kl_estimator: str = "k1",
    values_BC: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    turn_gamma: float = 1.0,
    turn_advantage: bool = False,
    branch_credit: str = "mean",
) -> Estimate:
    """Advantages (and PPO's returns) of `batch` for `algo.name` from its rewards; the KL against
    the reference is taken from `batch.old_logp_BC` and `ref_logp_BC` when both are given. `distill`
    has no task advantage: 0, less the reference KL per token when it is in the reward. The group
    estimators work on episodes (module docstring: `turn_gamma`, `turn_advantage`)."""
    mask_BC = batch.loss_mask_BC
    rewards_B = batch.rewards_B
    kl_BC = None
    kl_mean = None
    if ref_logp_BC is not None and batch.old_logp_BC is not None:
        kl_BC = kl_estimate(batch.old_logp_BC, ref_logp_BC, kind=kl_estimator) * mask_BC
        kl_mean = float(kl_BC.sum() / mask_BC.sum().clamp(min=1))

    if algo == "distill":  # the teacher's reward is added by estimate_advantages
        zeros_BC = torch.zeros_like(mask_BC)
        return Estimate(batch.trim(-kl_coef_in_reward * kl_BC if kl_BC is not None else zeros_BC), None, kl_mean)
    if algo in GROUP_ESTIMATORS:
        opts = GROUP_ESTIMATORS[algo]
        if kl_BC is not None and kl_coef_in_reward > 0:
            rewards_B = rewards_B - kl_coef_in_reward * episode_sum(kl_BC.sum(-1), batch.episode_ids_B)  # the whole episode's KL
        adv_B = episode_group_advantages(rewards_B, batch.group_ids_B, batch.episode_ids_B, **opts)
        if branch_credit not in ("mean", "episode", "local"):
            raise ValueError(f"branch_credit must be 'mean', 'episode' or 'local', got {branch_credit!r}")
        if branch_credit != "episode" and batch.branch_set_B is not None:  # answer branches: the shared history gets its set's mean (local: 0)
            adv_BC = shared_history_advantages(adv_B, batch.branch_set_B, batch.shared_B, batch.width,
                                               local=branch_credit == "local") * mask_BC
        else:
            adv_BC = adv_B[:, None] * mask_BC
        if turn_gamma != 1.0 and batch.turn_BC is not None:
            adv_BC = adv_BC * turn_discount(batch.turn_BC, batch.turns_B, turn_gamma)
        if turn_advantage:
            adv_BC = adv_BC + _turn_advantages_BC(batch, turn_gamma, opts) * mask_BC
        return Estimate(batch.trim(adv_BC), None, kl_mean)

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


def _turn_advantages_BC(batch: TokenBatch, gamma: float, opts: dict) -> torch.Tensor:
    """Each token's turn advantage: `turn_advantages` of its episode's per-turn rewards, at its turn."""
    episodes_B = batch.episode_ids_B if batch.episode_ids_B is not None else torch.arange(len(batch))
    _, inv_B = torch.unique(episodes_B, return_inverse=True)
    first: dict[int, int] = {}
    for b, e in enumerate(inv_B.tolist()):
        first.setdefault(e, b)
    rows = [first[e] for e in range(len(first))]
    rewards = [batch.turn_rewards[b] if batch.turn_rewards is not None else None for b in rows]
    if any(r is None for r in rewards):
        raise ValueError("algo.turn_advantage=true but an episode has no per-turn rewards; add a reward that gives them "
                         "(reward.functions=[..., retrieved_gold_turn]) or set algo.turn_advantage=false")
    turn_BC = batch.turn_BC if batch.turn_BC is not None else torch.zeros_like(batch.versions_BC)
    turns = batch.turns_B.tolist() if batch.turns_B is not None else [1] * len(batch)
    for b, r in zip(rows, rewards):
        if len(r) != turns[b]:
            raise ValueError(f"an episode of {turns[b]} turns has {len(r)} per-turn rewards; a reward must give one per turn")
    adv = turn_advantages(rewards, [int(batch.group_ids_B[b]) for b in rows], gamma, **opts)
    K = max(1, max(len(a) for a in adv))
    table_EK = torch.zeros(len(adv), K)
    for e, a in enumerate(adv):
        table_EK[e, : len(a)] = torch.tensor(a, dtype=torch.float32)
    return table_EK[inv_B[:, None], turn_BC.clamp(0, K - 1)]
