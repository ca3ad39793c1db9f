"""Do the engine and the trainer agree? Checked on every RL step, so that a broken weight sync,
a wrong engine or a precision gap cannot train silently.

- **Versions.** Every sampled token carries the weight version the engine reported for it
  (`Completion.version(s)`, from the server's `weight_version` for remote engines). Before step
  s the trainer published version s - 1; in sync mode every token must come from it, in async
  mode from a version it published (0 .. s - 1). A trajectory with a token from any other
  version is rejected: `Trajectory.status = "version_mismatch"`, excluded from the update
  (rl.py `usable`) and counted in `rollout/excluded/version_mismatch`.
- **Log-probs.** On fresh tokens (sampled by version s - 1, the weights the trainer holds before
  its update) the trainer's log-probs are compared with the engine's: all of them when the
  trainer recomputed old log-probs anyway, else the first `train.agreement_rows` completions
  (one extra forward pass each). `mismatch/kl` (k3 estimate of KL(engine || trainer)),
  `mismatch/ratio_max`, `mismatch/abs_diff_max`; a step whose KL passes `train.agreement_max_kl`
  counts in `mismatch/disagree` and warns once per run.
"""

from __future__ import annotations

import logging

import torch

from seekrl.algo.mismatch import mismatch_stats
from seekrl.train.batch import TokenBatch
from seekrl.types import Trajectory

__all__ = ["version_ok", "reject_unexpected_versions", "AgreementCheck"]

log = logging.getLogger(__name__)


def version_ok(traj: Trajectory, step: int, sync: bool) -> bool:
    """Whether every sampled token of `traj` comes from a version the trainer published before `step`."""
    latest = step - 1
    for v, m in zip(traj.versions, traj.loss_mask):
        if not m or v < 0:  # inserted tokens carry -1 (trained on only in the unmasked ablation)
            continue
        if v > latest or (sync and v != latest):
            return False
    return True


def reject_unexpected_versions(trajs: list[Trajectory], step: int, sync: bool) -> int:
    """Mark the trajectories with a token from an unexpected version (status "version_mismatch"); return how many."""
    n = 0
    for t in trajs:
        if t.status == "ok" and not version_ok(t, step, sync):
            t.status = "version_mismatch"
            n += 1
    return n


class AgreementCheck:
    """Engine vs trainer log-probs on the fresh tokens of each step (module docstring)."""

    def __init__(self, rows: int, max_kl: float):
        self.rows, self.max_kl = rows, max_kl
        self.warned = False

    def measure(self, trainer, batch: TokenBatch, trained_version: int, trainer_logp_BC: torch.Tensor | None) -> dict[str, float]:
        """`trainer_logp_BC`: the trainer's log-probs of the whole batch at `trained_version` when
        the step computed them (recomputed old log-probs), else None: then the first
        `self.rows` completions with fresh tokens are scored here."""
        fresh_BC = (batch.loss_mask_BC > 0) & (batch.versions_BC == trained_version)
        if trainer_logp_BC is None:
            rows = [i for i in range(len(batch)) if bool(fresh_BC[i].any())][: self.rows]
            if not rows:  # every rank takes the same decision: the batch is the same everywhere
                return {}
            sub = batch.select(rows)
            s = mismatch_stats(trainer.logprobs(sub), sub.behav_logp_BC, (sub.loss_mask_BC > 0) & (sub.versions_BC == trained_version))
        else:
            if not bool(fresh_BC.any()):
                return {}
            s = mismatch_stats(trainer_logp_BC, batch.behav_logp_BC, fresh_BC)
        out = {"mismatch/kl": s["kl"], "mismatch/ratio_max": s["ratio_max"], "mismatch/abs_diff_max": s["abs_diff_max"],
               "mismatch/disagree": float(s["kl"] > self.max_kl)}
        if s["kl"] > self.max_kl and not self.warned:
            self.warned = True
            log.warning(
                "engine and trainer disagree on the sampled tokens' log-probs at version %d: KL %.3g > "
                "train.agreement_max_kl=%s (largest |Δ log-prob| %.3g); check the weight sync and the engine's dtype "
                "(counted in mismatch/disagree; warned once)", trained_version, s["kl"], self.max_kl, s["abs_diff_max"],
            )
        return out
