"""Algorithms as pure tensor functions: advantages (GRPO, RLOO, REINFORCE++, GAE, KL) and
losses (PPO policy/value, entropy, KL, aggregation). No model, no I/O; see DESIGN.md,
"Algorithm API"."""

from seekrl.algo.advantages import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    gae,
    group_advantages,
    kl_estimate,
    reinforce_pp_advantages,
    token_rewards_with_kl,
    whiten,
    zero_std_group_mask,
)
from seekrl.algo.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    aggregate,
    cispo_loss,
    entropy_from_logits,
    gspo_loss,
    kl_loss,
    masked_mean,
    policy_loss,
    value_loss,
)

__all__ = [
    "KL_KINDS",
    "AGG_MODES",
    "POLICY_LOSSES",
    "cispo_loss",
    "gspo_loss",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate",
    "entropy_from_logits",
    "gae",
    "group_advantages",
    "kl_estimate",
    "kl_loss",
    "masked_mean",
    "policy_loss",
    "reinforce_pp_advantages",
    "token_rewards_with_kl",
    "value_loss",
    "whiten",
    "zero_std_group_mask",
]
