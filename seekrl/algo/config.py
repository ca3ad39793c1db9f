"""The `algo:` config section: which advantage estimator and policy objective the trainer uses.

The allowed values are declared here once, as Literal types; the functions that take them
(algo/losses.py `aggregate`, algo/advantages.py `kl_estimate`, train/estimate.py) read the same
tuples (`AGG_MODES`, `KL_KINDS`, `ALGOS`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range

__all__ = ["AlgoConfig", "AlgoName", "LossAgg", "KLKind", "ALGOS", "AGG_MODES", "KL_KINDS", "GROUP_ALGOS"]

AlgoName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]
ALGOS: tuple[str, ...] = typing.get_args(AlgoName)
AGG_MODES: tuple[str, ...] = typing.get_args(LossAgg)
KL_KINDS: tuple[str, ...] = typing.get_args(KLKind)
GROUP_ALGOS = ("grpo", "dr_grpo", "rloo")  # a group baseline: G >= 2 samples per task


@dataclass
class AlgoConfig:
    name: AlgoName = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp | ppo."""
    clip_low: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """PPO ratio clip below 1."""
    clip_high: Annotated[float, Range(ge=0, text="a finite number >= 0 (0.2, or 0.28 for DAPO's clip-higher)")] = 0.2
    """PPO ratio clip above 1 (DAPO clip-higher: 0.28)."""
    dual_clip: Annotated[float | None, Range(gt=1, text="> 1 (3.0 is usual)")] = None
    """Dual-clip constant c > 1 for negative advantages; none disables."""
    loss_agg: LossAgg = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (Dr. GRPO's default)."""
    kl_coef: Annotated[float, Range(ge=0, text="a finite number >= 0 (0 disables the reference model)")] = 0.0
    """KL coefficient; 0 disables the reference model entirely."""
    kl_estimator: KLKind = "k3"
    """k1 | k2 | k3 (Schulman)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where the KL acts: loss (GRPO) | reward (PPO, per-token penalty)."""
    kl_target: Annotated[float | None, Range(gt=0, text="a finite number > 0 (e.g. 0.01) or null for a fixed algo.kl_coef")] = None
    """Adaptive KL: target KL per step (Ziegler et al.); none keeps the coefficient fixed."""
    kl_horizon: int = 10000
    """Adaptive KL horizon."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (entropy is always logged)."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """PPO discount."""
    lam: Annotated[float, Range(ge=0, le=1)] = 1.0
    """PPO GAE lambda."""
    value_clip: Annotated[float | None, Range(gt=0, text="a finite number > 0 (e.g. 0.2) or null for no clipping")] = 0.2
    """PPO value clip; none disables."""
    filter_zero_std: bool = False
    """Drop groups whose rewards are all equal (DAPO dynamic sampling)."""
    mask_truncated: bool = False
    """Exclude completions cut by max_new_tokens from the loss (DAPO overlong filtering)."""
    decoupled: bool | None = None
    """Decoupled PPO (AReaL's use_decoupled_loss): clip against the proximal policy, weight by proximal / behaviour; none = true in async mode, false in sync."""
    prox_logp: Literal["recompute", "loglinear"] = "recompute"
    """Decoupled PPO's proximal log-probs: recompute (one forward pass of the current policy before the update) | loglinear (interpolate behaviour and current log-probs by version; no forward pass)."""
    behav_imp_cap: Annotated[float | None, Range(gt=0, text="> 0 (e.g. 5.0)")] = None
    """Decoupled PPO: tokens whose behaviour importance weight (proximal / behaviour) exceeds this are dropped from the loss; none = no cap."""

    mismatch: Literal["auto", "tis", "mis", "none"] = "auto"
    """Correction for engine log-probs that differ from the trainer's (algo/mismatch.py): tis (truncated importance weight) | mis (masked: weight 0 outside [mismatch_cap_low, mismatch_cap]) | none; auto = tis when the engine's log-probs are not exact for the trainer's weights (vLLM, SGLang, bf16, engine.urls), none when they are."""
    mismatch_level: Literal["token", "sequence", "geometric"] = "token"
    """The ratio the correction acts on: token (per token) | sequence (product over the completion's sampled tokens) | geometric (their geometric mean)."""
    mismatch_cap: Annotated[float | None, Range(gt=0, text="> 0 (2.0 is usual for tis) or null for no bound")] = 2.0
    """Upper bound of the importance weight: tis truncates to it, mis drops tokens (or completions) above it."""
    mismatch_cap_low: Annotated[float, Range(ge=0, text=">= 0 (e.g. 0.5; 0 = no lower bound)")] = 0.0
    """mis: tokens (or completions) whose ratio is below this are dropped too."""

    def check(self) -> None:
        if self.mismatch_cap is not None and self.mismatch_cap_low >= self.mismatch_cap:
            raise ConfigError(f"algo.mismatch_cap_low={self.mismatch_cap_low} must be below algo.mismatch_cap={self.mismatch_cap}; lower it")
        if self.behav_imp_cap is not None and self.mismatch not in ("auto", "none"):
            raise ConfigError("algo.behav_imp_cap and algo.mismatch both weigh decoupled PPO's behaviour ratio; "
                              "keep one (algo.behav_imp_cap=X is algo.mismatch=mis algo.mismatch_cap=X)")
        if self.behav_imp_cap is not None and not self.decoupled:  # (decoupled is resolved before the checks)
            raise ConfigError("algo.behav_imp_cap caps decoupled PPO's behaviour weight; set algo.decoupled=true or drop the cap")
