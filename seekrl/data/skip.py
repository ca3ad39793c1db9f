"""An online curriculum (`data.skip_flat`): leave out of later epochs the training tasks whose
groups had no reward spread in their last rollouts.

    history = FlatHistory(after=1, prob=0.8, keep=0.5)
    it = TaskIterator(tasks, 4, seed=0, history=history)
    ... a step rolls out it.next_batch() ...
    it.record(group.task, informative=False)   # the rollout, for each group it scored (rollout/executor.py)
    # at the next epoch's start, that task is left out of the order with probability 0.8

A group whose rewards are all equal trains nothing under GRPO (`algo.filter_zero_std` drops it,
`rollout.refill` samples another); on a hard data set most groups are all wrong, and most of a
step's rollout is spent on them. The pass-rate curriculum (data/curriculum.py) measures that
once, before training, with the starting model; this one follows the policy as it trains, the
way Skywork-OR1 drops solved prompts between epochs and GRESO skips prompts whose recent
rollouts had zero variance:

- the rollout records, for every group it scored whose trajectories all ran (status "ok": an
  infrastructure failure says nothing about the task), whether the group was informative, by the
  run's own rule (`GroupSignal`, the refill's and the filter's). A task's count is the number of
  its rollouts in a row without spread; an informative one resets it to 0.
- when an epoch starts, each task whose count is at least `after` is left out of that epoch's
  order with probability `prob` (one uniform per such task, from `random.Random` seeded by the
  iterator's seed, the epoch and `salt`). With `prob` < 1 a left-out task comes back now and then
  and its count is reset when it has spread again, so the pool follows the policy and does not
  shrink to the few tasks that were informative once.
- with `keep` > 0 (`data.skip_flat_keep`) an epoch keeps at least that fraction of the tasks:
  when more would be left out, those left out are the ones with the longest runs without spread
  (ties in the same seeded random order), and the rest stay in (`data/skip_flat/capped_epochs`
  counts those epochs). Without it the pool shrinks as the policy trains: on the HotpotQA recipe
  two thirds of the questions were out by step 64, and the later epochs trained on the same
  hundred again and again (RESULTS.md).
- an epoch keeps at least one batch: when leaving out would leave fewer than `batch_size` tasks,
  nothing is left out of that epoch (`data/skip_flat/full_epochs` counts those epochs).

The counts live here, keyed by `(task.source, task.id)`; each TaskIterator keeps the tasks it
left out of its current epoch, so its order can be rebuilt on resume. Both are in the data state
the checkpoint stores (`state_dict`), so a resumed sync run draws exactly the tasks the
uninterrupted one would have. Metrics (`metrics()`, every step): `data/skip_flat/skipped` (tasks
left out of the current epochs' orders), `data/skip_flat/flat` (tasks whose count reached
`after`), `data/skip_flat/full_epochs` and `data/skip_flat/capped_epochs` (epochs so far).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from seekrl.types import Task

__all__ = ["FlatHistory"]


def _key(task: Task) -> tuple[str, str]:
    return str(task.source), str(task.id)


class FlatHistory:
    """How many rollouts in a row each task's group had no reward spread, and which tasks an epoch leaves out."""

    def __init__(self, after: int, prob: float = 0.8, keep: float = 0.0) -> None:
        if after < 1:
            raise ValueError(f"FlatHistory needs after >= 1 flat rollouts, got {after}")
        if not 0.0 < prob <= 1.0:
            raise ValueError(f"FlatHistory's skip probability must be in (0, 1], got {prob}")
        if not 0.0 <= keep < 1.0:
            raise ValueError(f"FlatHistory's kept fraction must be in [0, 1), got {keep}")
        self.after, self.prob, self.keep = int(after), float(prob), float(keep)
        self._flat: dict[tuple[str, str], int] = {}
        self.full_epochs = 0  # epochs that left nothing out, to keep one batch
        self.capped_epochs = 0  # epochs whose leave-out was cut to keep the fraction `keep`

    def record(self, task: Task, informative: bool) -> None:
        """One rollout of `task`'s group: `informative` (it had spread) resets the count, else it grows by 1."""
        key = _key(task)
        if informative:
            self._flat.pop(key, None)
        else:
            self._flat[key] = self._flat.get(key, 0) + 1

    def count(self, task: Task) -> int:
        """Rollouts in a row without spread."""
        return self._flat.get(_key(task), 0)

    def left_out(self, tasks: Sequence[Task], *, seed: int, epoch: int, keep_at_least: int, salt: str = "") -> list[int]:
        """The indices of `tasks` (ascending) that epoch `epoch` leaves out (module docstring): at
        most all but the fraction `keep` of them, the longest runs without spread first; none when
        fewer than `keep_at_least` tasks would remain."""
        rng = random.Random(f"skip_flat/{salt}/{seed}/{epoch}")
        out = [i for i, t in enumerate(tasks) if self.count(t) >= self.after and rng.random() < self.prob]
        most = len(tasks) - math.ceil(self.keep * len(tasks) - 1e-9)
        if len(out) > most:
            self.capped_epochs += 1
            rng.shuffle(out)  # ties between equal counts in the epoch's seeded order
            out = sorted(sorted(out, key=lambda i: -self.count(tasks[i]))[:most])
        if out and len(tasks) - len(out) < keep_at_least:
            self.full_epochs += 1
            return []
        return out

    def flat_tasks(self) -> int:
        """Tasks whose count reached `after`."""
        return sum(n >= self.after for n in self._flat.values())

    def metrics(self, skipped: int) -> dict[str, float]:
        """`data/skip_flat/*`, with `skipped` the tasks the current epochs' orders leave out."""
        return {"data/skip_flat/skipped": float(skipped), "data/skip_flat/flat": float(self.flat_tasks()),
                "data/skip_flat/full_epochs": float(self.full_epochs),
                "data/skip_flat/capped_epochs": float(self.capped_epochs)}

    def state_dict(self) -> dict:
        return {"after": self.after, "prob": self.prob, "keep": self.keep, "full_epochs": self.full_epochs,
                "capped_epochs": self.capped_epochs, "flat": [[s, i, n] for (s, i), n in sorted(self._flat.items())]}

    def load_state_dict(self, state: dict) -> None:
        """Restore the counts (the saved `after`/`prob`/`keep` are not restored: a resumed run may change them)."""
        try:
            self._flat = {(str(s), str(i)): int(n) for s, i, n in state.get("flat", [])}
        except (TypeError, ValueError):
            raise ValueError("the saved data state's skip_flat counts are not [source, id, count] rows; "
                             "resume from an intact checkpoint, or start a new run") from None
        self.full_epochs = int(state.get("full_epochs", 0))
        self.capped_epochs = int(state.get("capped_epochs", 0))
