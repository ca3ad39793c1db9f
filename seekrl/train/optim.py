"""What every optimisation loop of seekrl shares: AdamW and its schedule, minibatch order, and the
guard that skips non-finite updates.

Non-finite updates (`NonFiniteGuard`). Before each optimizer step the loss of every micro-batch
and the clipped gradient norm are checked; when one is nan or inf that optimizer step is skipped
(gradients zeroed, no optimizer.step, so the weights and the optimizer state never take a
non-finite value) while the learning-rate schedule still advances: it counts RL steps, so the lr
at step N is the same in every run. The RL loop counts an RL step with a skipped update in
`train/nonfinite_skipped` (1.0) and `train/nonfinite_skipped_total`, and stops with
`NonFiniteError` after `train.max_nonfinite` such steps in a row (0: never). SFT does the same.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import torch

from seekrl.errors import NonFiniteError
from seekrl.parallel.ranks import Ranks
from seekrl.train.config import TrainConfig

__all__ = ["NonFiniteGuard", "finite_everywhere", "step_scheduler", "lr_lambda", "make_optimizer", "minibatch_count",
           "minibatch_indices"]


class NonFiniteGuard:
    """Decides whether an optimizer step may run, and counts RL steps whose updates were skipped.

        if guard.finite({"loss/policy": loss, "grad_norm/policy": norm}): optimizer.step()
        ...
        stats.add(**guard.end_step())   # once per RL step: train/nonfinite_skipped(_total)
        guard.raise_if_stuck(step)      # NonFiniteError after max_consecutive skipped steps in a row

    Several updates (policy and critic, several minibatches) may report into one guard in one RL
    step; the step counts as skipped when any of them was. `state_dict` goes into checkpoints.
    """

    def __init__(self, max_consecutive: int, hint: str = "lower train.lr or check the rewards") -> None:
        self.max_consecutive = max_consecutive  # 0: never stop
        self.hint = hint  # the fix the stop message suggests
        self.consecutive = 0  # RL steps in a row with a skipped update
        self.total = 0  # RL steps with a skipped update, over the run
        self.first_bad: tuple[str, float] | None = None  # this RL step's first non-finite value
        self.last_bad: tuple[str, float] | None = None

    def finite(self, values: dict[str, float]) -> bool:
        """True when every value is finite; otherwise records the first bad one and returns False."""
        for name, value in values.items():
            if not math.isfinite(value):
                if self.first_bad is None:
                    self.first_bad = (name, value)
                return False
        return True

    def end_step(self) -> dict[str, float]:
        """Close one RL step; its metrics train/nonfinite_skipped (0 or 1) and train/nonfinite_skipped_total."""
        skipped = self.first_bad is not None
        if skipped:
            self.total += 1
            self.consecutive += 1
            self.last_bad = self.first_bad
        else:
            self.consecutive = 0
        self.first_bad = None
        return {"train/nonfinite_skipped": float(skipped), "train/nonfinite_skipped_total": float(self.total)}

    def raise_if_stuck(self, step: int) -> None:
        if self.max_consecutive and self.consecutive >= self.max_consecutive:
            name, value = self.last_bad or ("loss", math.nan)
            raise NonFiniteError(
                f"step {step}: {name} is {value}; {self.consecutive} consecutive steps had a non-finite loss or gradient "
                f"norm and their updates were skipped (train.max_nonfinite={self.max_consecutive}); "
                f"{self.hint} (the checkpoints hold the last finite weights)"
            )

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.consecutive = int(state.get("consecutive", 0))
        self.total = int(state.get("total", 0))


def step_scheduler(scheduler) -> None:
    """`scheduler.step()`, without torch's warning about a scheduler step before any optimizer
    step: that happens on purpose when the first updates were skipped as non-finite."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
        scheduler.step()


def lr_lambda(warmup: int, total: int, schedule: str, min_ratio: float):
    """Multiplier of the base lr at RL step s: linear warmup, then constant or cosine to min_ratio."""

    def f(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def make_optimizer(params, lr: float, t: TrainConfig, total_steps: int):
    """AdamW over the parameters that train, and its schedule (warmup, then constant or cosine;
    stepped once per RL step, so warmup and cosine count RL steps)."""
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=t.weight_decay, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, total_steps, t.schedule, t.min_lr_ratio))
    return opt, sched


def minibatch_count(t: TrainConfig, groups: list[int]) -> int:
    """Optimizer steps an epoch over a batch whose rows are of `groups`: train.minibatches, or with
    train.minibatch_size (tasks a step) ceil(its groups / minibatch_size). Every rank holds the
    whole batch, so every rank counts the same."""
    if not t.minibatch_size:
        return t.minibatches
    return max(1, -(-len(set(groups)) // t.minibatch_size))


def minibatch_indices(n: int, epochs: int, minibatches: int, gen: torch.Generator,
                      groups: list[int] | None = None) -> Iterator[tuple[int, list[int]]]:
    """(epoch, indices) for each optimizer step; reshuffled per epoch when there are several minibatches.

    With `groups` (each row's group: `TokenBatch.group_ids_B`) a minibatch is made of whole groups,
    as verl counts `ppo_mini_batch_size` in prompts: a task's rows, which share its prompt and
    (answer branches) an episode's history, stay in one minibatch, so the shared-prefix layout
    still runs that prefix once, and the groups are dealt out as evenly as their number allows.
    Fewer groups than minibatches: rows are split as without `groups`."""
    units = [[i] for i in range(n)]
    if groups is not None:
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            by_group.setdefault(g, []).append(i)
        if len(by_group) >= minibatches:
            units = list(by_group.values())
    u = len(units)
    for epoch in range(epochs):
        order = torch.randperm(u, generator=gen).tolist() if minibatches > 1 else list(range(u))
        for k in range(minibatches):
            chunk = order[k * u // minibatches : (k + 1) * u // minibatches]
            yield epoch, sorted(i for j in chunk for i in units[j])


def finite_everywhere(finite: bool, guard: NonFiniteGuard, ranks: Ranks) -> bool:
    """An optimizer step runs on every rank or on none: skipped when any rank saw a non-finite loss."""
    if not ranks.distributed:
        return finite
    everywhere = ranks.all_true(finite)
    if not everywhere:
        guard.finite({"loss (on another rank)": math.nan})  # counts the step as skipped on this rank too
    return everywhere
