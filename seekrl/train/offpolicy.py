"""The log-probs the PPO ratio is taken against: plain PPO, or decoupled PPO (AReaL).

Plain PPO (`algo.decoupled=false`) clips r = π_θ / π_old, with π_old the behaviour policy: the
engine's log-probs when they are exact for the trainer's weights (`reuse`), else recomputed.

When the step is one optimizer step on fresh tokens (`from_update`: plain PPO in sync mode,
`train.ppo_epochs=1`, `train.minibatches=1`) and the engine's log-probs are not exact, the
recomputed old log-probs would be the update's own forward pass at the same weights: π_old =
π_θ.detach() there (ratio exactly 1, the same gradient) and the extra forward pass is skipped
(`old_BC` None; train/policy.py takes the micro-batch's own detached log-probs).

Decoupled PPO (`algo.decoupled=true`, the default in async mode) separates the policy that
sampled a token (behaviour, version v_b: the engine's log-probs, always) from the one the update
is clipped around (proximal: the policy being trained, version v = step - 1):

    loss = w · max(-A·r, -A·clip(r, 1-ε, 1+ε)),  r = π_θ / π_prox,  w = π_prox / π_behav

and tokens with w > `algo.behav_imp_cap` are dropped (algo/losses.py policy_loss). π_prox is
- `recompute`: one forward pass of the policy before the update. When every sampled token of the
  batch is fresh (v_b = v) and the engine's log-probs are exact, π_prox = π_behav and the pass
  is skipped (w = 1 exactly, the sync loop's update).
- `loglinear` (AReaL): no forward pass; in the loss, log π_prox = log π_behav + α (log π_θ -
  log π_behav) with π_θ's log-probs detached and α = (v - v_b) / (v + 1 - v_b) per token (θ moves
  from version v towards v + 1 during the update; fresh tokens get α = 0, i.e. π_behav).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seekrl.algo.config import AlgoConfig
from seekrl.train.batch import TokenBatch

__all__ = ["OldLogprobs", "loglinear_alpha", "old_logprobs"]


@dataclass
class OldLogprobs:
    old_BC: torch.Tensor | None  # the ratio's denominator (None: the update's own detached log-probs, `from_update`): behaviour (plain), proximal (recompute), behaviour until the loss interpolates (loglinear)
    alpha_BC: torch.Tensor | None = None  # loglinear: the interpolation weight per token
    recomputed: bool = False  # old_BC is the trainer's own forward pass at the trained version


def loglinear_alpha(versions: list[int], trained_version: int) -> list[float]:
    """α per token (module docstring); 0 for inserted tokens (version -1) and fresh ones."""
    v = trained_version
    return [0.0 if vb < 0 or vb >= v else (v - vb) / (v + 1 - vb) for vb in versions]


def old_logprobs(a: AlgoConfig, trainer, batch: TokenBatch, trained_version: int, reuse: bool,
                 from_update: bool = False) -> OldLogprobs:
    """The denominators of the step's update (module docstring). `reuse`: the engine's log-probs
    (`batch.behav_logp_BC`) are exact for the trainer's weights at the version that sampled them.
    `from_update`: the step is one optimizer step, so a recomputation equals the update's own
    forward pass (module docstring). With decoupled PPO the update reads the behaviour log-probs
    from the batch too."""
    behav = batch.behav_logp_BC
    if not a.decoupled:
        if reuse:
            return OldLogprobs(behav, recomputed=False)
        return OldLogprobs(None) if from_update else OldLogprobs(trainer.logprobs(batch), recomputed=True)
    if a.prox_logp == "loglinear":
        alpha = [loglinear_alpha(batch.versions_BC[i, : len(c)].tolist(), trained_version) for i, c in enumerate(batch.completion_ids)]
        out = torch.zeros_like(behav)
        for i, row in enumerate(alpha):
            if row:
                out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
        return OldLogprobs(behav, out)
    sampled = batch.versions_BC[batch.loss_mask_BC > 0]
    fresh = bool((sampled == trained_version).all())
    if reuse and fresh:
        return OldLogprobs(behav)
    return OldLogprobs(trainer.logprobs(batch), recomputed=True)
