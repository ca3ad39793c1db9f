"""The `algo:` config section: which advantage estimator and policy objective the trainer uses.

The allowed values are declared here once, as Literal types; the functions that take them
(algo/losses.py `aggregate`, algo/advantages.py `kl_estimate`, train/estimate.py) read the same
tuples (`AGG_MODES`, `KL_KINDS`, `ALGOS`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range

__all__ = ["AlgoConfig", "TeacherConfig", "AlgoName", "PolicyLoss", "LossAgg", "KLKind", "ALGOS", "AGG_MODES",
           "KL_KINDS", "GROUP_ALGOS", "OBJECTIVE_DEFAULTS"]

AlgoName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo", "distill"]
PolicyLoss = Literal["ppo", "gspo", "gspo_token", "cispo"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]
ALGOS: tuple[str, ...] = typing.get_args(AlgoName)
AGG_MODES: tuple[str, ...] = typing.get_args(LossAgg)
KL_KINDS: tuple[str, ...] = typing.get_args(KLKind)
GROUP_ALGOS = ("grpo", "dr_grpo", "rloo")  # a group baseline: G >= 2 samples per task

# Each objective's (clip_low, clip_high, loss_agg) where the config leaves them null: PPO's 0.2;
# GSPO's sequence ratio is a geometric mean, near 1, so its paper clips it at 3e-4 / 4e-4 and
# averages per sequence; CISPO bounds the IS weight only from above (MiniMax-M1: "we did not
# impose a lower bound"; SkyRL's example caps at 1 + 5).
OBJECTIVE_DEFAULTS: dict[str, tuple[float, float, str]] = {
    "ppo": (0.2, 0.2, "token-mean"),
    "gspo": (3e-4, 4e-4, "seq-mean-token-mean"),
    "gspo_token": (3e-4, 4e-4, "seq-mean-token-mean"),
    "cispo": (1.0, 5.0, "token-mean"),
}


@dataclass
class TeacherConfig:
    """On-policy distillation's teacher (`algo.teacher.*`): a model seekrl loads, or an engine server."""

    path: str | None = None
    """Teacher model (anything model.path takes: a folder, smollm2, tiny; a checkpoint folder runs/NAME/checkpoints/step_N means its model/), scored in the trainer's process; its tokenizer must be the policy's."""
    url: str | None = None
    """Teacher on an engine server that returns prompt log-probs (seekrl serve engine, or vLLM with algo.teacher.api=vllm); instead of algo.teacher.path."""
    api: Literal["seekrl", "vllm"] = "seekrl"
    """The teacher server's API: seekrl (`seekrl serve engine`, /score) | vllm (/v1/completions with prompt_logprobs; temperature 1 only, so rollout.temperature=1 and, with answer branches, rollout.branch_temperature=1)."""
    token_env: str | None = None
    """Environment variable holding the teacher server's bearer token (none: no token)."""
    timeout_s: Annotated[float, Range(gt=0, text="> 0 seconds")] = 300.0
    """Longest wait for one scoring request to the teacher server."""


@dataclass
class AlgoConfig:
    name: AlgoName = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp | ppo | distill (on-policy distillation: the per-token reverse KL to algo.teacher is the reward)."""
    policy_loss: PolicyLoss = "ppo"
    """The policy objective: ppo (clipped token ratio) | gspo (sequence ratio, Zheng et al. 2025) | gspo_token (GSPO with per-token advantages) | cispo (clipped, stop-gradient IS weight on every token, MiniMax-M1)."""
    clip_low: Annotated[float | None, Range(ge=0, le=1)] = None
    """Ratio clip below 1: the ratio (ppo, gspo) or the IS weight (cispo; 1 = no lower bound) is kept above 1 - clip_low; none = the objective's own (objective_defaults)."""
    clip_high: Annotated[float | None, Range(ge=0, text="a finite number >= 0 (0.2, or 0.28 for DAPO's clip-higher)")] = None
    """Ratio clip above 1 (DAPO clip-higher: 0.28); none = the objective's own: 0.2 for ppo, 4e-4 for gspo (3e-4 below), 5 for cispo."""
    dual_clip: Annotated[float | None, Range(gt=1, text="> 1 (3.0 is usual)")] = None
    """Dual-clip constant c > 1 for negative advantages; none disables."""
    loss_agg: LossAgg | None = None
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (Dr. GRPO's); none = the objective's own: seq-mean-token-mean for gspo and gspo_token (GSPO's 1/|y| per sequence), token-mean otherwise."""
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
    ptx_coef: Annotated[float, Range(ge=0, text="a finite number >= 0 (e.g. 0.2; 0: off)")] = 0.0
    """PPO-ptx (InstructGPT): weight of the supervised loss (token-mean cross-entropy) on data.ptx's examples added to every policy update, holding chosen behaviour where RL does not train (train/ptx.py); 0: off."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (entropy is always logged)."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """PPO discount."""
    lam: Annotated[float, Range(ge=0, le=1)] = 1.0
    """PPO GAE lambda."""
    value_clip: Annotated[float | None, Range(gt=0, text="a finite number > 0 (e.g. 0.2) or null for no clipping")] = 0.2
    """PPO value clip; none disables."""
    filter_zero_std: bool = False
    """Drop groups whose rewards are all equal (DAPO dynamic sampling); with branch_credit=local, the groups none of whose answer-branch sets has reward spread (they train nothing); with turn_advantage, a group whose per-turn returns differ at some turn is kept."""
    mask_truncated: bool = False
    """Exclude completions cut by max_new_tokens from the loss (DAPO overlong filtering)."""
    decoupled: bool | None = None
    """Decoupled PPO (AReaL's use_decoupled_loss): clip against the proximal policy, weight by proximal / behaviour; none = true in async mode, false in sync."""
    prox_logp: Literal["recompute", "loglinear"] = "recompute"
    """Decoupled PPO's proximal log-probs: recompute (one forward pass of the current policy before the update) | loglinear (interpolate behaviour and current log-probs by version; no forward pass)."""
    behav_imp_cap: Annotated[float | None, Range(gt=0, text="> 0 (e.g. 5.0)")] = None
    """Decoupled PPO: tokens whose behaviour importance weight (proximal / behaviour) exceeds this are dropped from the loss; none = no cap."""

    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """On-policy distillation's teacher (algo.teacher.path or algo.teacher.url)."""
    distill_coef: Annotated[float | None, Range(ge=0, text="a finite number >= 0 or null")] = None
    """Weight of the per-token reverse-KL reward log p_teacher - log p_student; none = 1 with algo.name=distill, 0 otherwise (with grpo etc. and a teacher, it is added to the task advantages)."""
    turn_advantage: bool = False
    """Turn-level credit (group estimators): the reward functions' per-turn rewards become per-turn advantages (returns over the turns left, normalised among the group's episodes at the same turn) added to the outcome advantage of each turn's tokens."""
    branch_credit: Literal["mean", "episode", "local"] = "mean"
    """With rollout.answer_branches > 1, what the history an episode shares with its branches trains with: mean (the mean advantage of the set, the episode and its branches: Tree-GRPO's node value; 0 with one episode per task, so only the answers train) | episode (the episode's own advantage: one sample of it) | local (0: the searches do not train; each answer's advantage is its own less its set's mean, so only the reading of the set's context trains, against its siblings)."""
    turn_gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Discount over turns (group estimators, either rollout.trajectory): turn k of K gets the outcome advantage times turn_gamma^(K-1-k); it also discounts algo.turn_advantage's returns."""

    mismatch: Literal["auto", "tis", "mis", "none"] = "auto"
    """Correction for engine log-probs that differ from the trainer's (algo/mismatch.py): tis (truncated importance weight) | mis (masked: weight 0 outside [mismatch_cap_low, mismatch_cap]) | none; auto = tis when the engine's log-probs are not exact for the trainer's weights (vLLM, SGLang, bf16, engine.urls), none when they are."""
    mismatch_level: Literal["token", "sequence", "geometric"] = "token"
    """The ratio the correction acts on: token (per token) | sequence (product over the completion's sampled tokens) | geometric (their geometric mean)."""
    mismatch_cap: Annotated[float | None, Range(gt=0, text="> 0 (2.0 is usual for tis) or null for no bound")] = 2.0
    """Upper bound of the importance weight: tis truncates to it, mis drops tokens (or completions) above it."""
    mismatch_cap_low: Annotated[float, Range(ge=0, text=">= 0 (e.g. 0.5; 0 = no lower bound)")] = 0.0
    """mis: tokens (or completions) whose ratio is below this are dropped too."""

    def resolved(self) -> AlgoConfig:
        """A copy with the objective's own defaults where a key is null (config.resolve calls it)."""
        lo, hi, agg = OBJECTIVE_DEFAULTS.get(self.policy_loss, OBJECTIVE_DEFAULTS["ppo"])  # (a bad name is reported by the checks)
        return dataclasses.replace(
            self, clip_low=lo if self.clip_low is None else self.clip_low, clip_high=hi if self.clip_high is None else self.clip_high,
            loss_agg=agg if self.loss_agg is None else self.loss_agg,
            distill_coef=(1.0 if self.name == "distill" else 0.0) if self.distill_coef is None else self.distill_coef,
        )

    def check(self) -> None:
        if self.policy_loss != "cispo" and self.clip_low is not None and self.clip_low >= 1:
            raise ConfigError(f"algo.clip_low={self.clip_low} must be below 1 for algo.policy_loss={self.policy_loss} "
                              "(the ratio's lower bound 1 - clip_low must be positive); 1 means no lower bound only for cispo")
        if self.dual_clip is not None and self.policy_loss != "ppo":
            raise ConfigError(f"algo.dual_clip bounds PPO's clipped surrogate; algo.policy_loss={self.policy_loss} has none: drop algo.dual_clip")
        has_teacher = self.teacher.path is not None or self.teacher.url is not None
        if self.teacher.path is not None and self.teacher.url is not None:
            raise ConfigError("algo.teacher.path and algo.teacher.url are both set; keep one (a model to load, or a server to ask)")
        if self.name == "distill" and not has_teacher:
            raise ConfigError("algo.name=distill needs a teacher: set algo.teacher.path=DIR (a model) or algo.teacher.url=URL (an engine server)")
        if self.name == "distill" and self.distill_coef == 0:
            raise ConfigError("algo.name=distill with algo.distill_coef=0 has no advantage to train on (the teacher's reward is all of it); "
                              "drop algo.distill_coef (1) or set it above 0")
        if has_teacher and self.name != "distill" and not self.distill_coef:
            raise ConfigError(f"algo.teacher is set but algo.name={self.name} with algo.distill_coef=0 never asks it; "
                              "set algo.name=distill, or algo.distill_coef=0.5 to add the teacher's reward to the task's")
        if self.mismatch_cap is not None and self.mismatch_cap_low >= self.mismatch_cap:
            raise ConfigError(f"algo.mismatch_cap_low={self.mismatch_cap_low} must be below algo.mismatch_cap={self.mismatch_cap}; lower it")
        if self.behav_imp_cap is not None and self.mismatch not in ("auto", "none"):
            raise ConfigError("algo.behav_imp_cap and algo.mismatch both weigh decoupled PPO's behaviour ratio; "
                              "keep one (algo.behav_imp_cap=X is algo.mismatch=mis algo.mismatch_cap=X)")
        if self.behav_imp_cap is not None and not self.decoupled:  # (decoupled is resolved before the checks)
            raise ConfigError("algo.behav_imp_cap caps decoupled PPO's behaviour weight; set algo.decoupled=true or drop the cap")
