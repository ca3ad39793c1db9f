"""An endless, resumable iterator of task batches.

Each epoch visits the tasks in the order of a permutation drawn from
`random.Random(seed + epoch)` — deterministic, and independent of the global RNG, so the
order does not change when other code draws random numbers. `state_dict()` is two integers and
the seed (JSON-able); a restored iterator yields exactly the batch the saved one would have
yielded next, including when the save fell exactly at the end of an epoch.

    it = TaskIterator(tasks, batch_size=8, seed=0)
    batch = it.next_batch()              # or: for batch in it: ...
    state = it.state_dict()              # {"epoch": 0, "index": 8, "seed": 0}
    it2 = TaskIterator(tasks, 8); it2.load_state_dict(state)   # it2.next_batch() == it.next_batch()

With drop_last (the default) every batch has exactly `batch_size` tasks and the last
`len(tasks) % batch_size` tasks of each epoch's order are skipped (a different few each epoch);
without it the epoch's last batch is shorter.

With a `FlatHistory` (`data.skip_flat`, data/skip.py) each epoch's order leaves out the tasks
whose recent groups had no reward spread (`record` hears of each group); the tasks left out of
the current epoch are part of `state_dict()`, and so are the history's counts (unless a
MixtureIterator owns the history and stores it once).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from seekrl.data.skip import FlatHistory
from seekrl.types import Task

__all__ = ["TaskIterator"]


class TaskIterator:
    """Yield lists of `batch_size` Tasks forever, reshuffled each epoch with a seeded RNG."""

    def __init__(
        self, tasks: Sequence[Task], batch_size: int, seed: int = 0, shuffle: bool = True, drop_last: bool = True,
        history: FlatHistory | None = None, salt: str = "", owns_history: bool = True,
    ) -> None:
        if not tasks:
            raise ValueError("TaskIterator needs at least one task; the data set is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > len(tasks):
            raise ValueError(
                f"batch_size ({batch_size}) is larger than the data set ({len(tasks)} tasks); "
                f"use a smaller batch size or more data"
            )
        self.tasks = list(tasks)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._epoch = 0
        self._index = 0  # tasks of the current epoch's order already yielded
        self._order: list[int] | None = None  # cached permutation of self._epoch
        self.history, self.salt, self.owns_history = history, salt, owns_history
        self._skipped: list[int] = []  # tasks left out of the current epoch's order (data.skip_flat)

    @property
    def epoch(self) -> int:
        """The epoch the last yielded batch came from (0 before any batch)."""
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        n, b = len(self.tasks), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        if self._skipped:
            out = set(self._skipped)
            order = [i for i in order if i not in out]
        return order

    def next_batch(self) -> list[Task]:
        if self._order is None:
            self._order = self._permutation(self._epoch)
        remaining = len(self._order) - self._index
        if remaining <= 0 or (self.drop_last and remaining < self.batch_size):
            self._epoch += 1
            self._index = 0
            self._skipped = self.history.left_out(
                self.tasks, seed=self.seed, epoch=self._epoch, keep_at_least=self.batch_size if self.drop_last else 1,
                salt=self.salt) if self.history is not None else []
            self._order = self._permutation(self._epoch)
        picked = self._order[self._index : self._index + self.batch_size]
        self._index += len(picked)
        return [self.tasks[i] for i in picked]

    def __iter__(self) -> TaskIterator:
        return self

    def __next__(self) -> list[Task]:
        return self.next_batch()

    def record(self, task: Task, informative: bool) -> None:
        """One rollout of `task`'s group (data.skip_flat; a no-op without a history)."""
        if self.history is not None:
            self.history.record(task, informative)

    @property
    def skipped(self) -> int:
        """Tasks left out of the current epoch's order (data.skip_flat)."""
        return len(self._skipped)

    def metrics(self) -> dict[str, float]:
        """data.skip_flat: `data/skip_flat/*` (none without a history)."""
        return self.history.metrics(self.skipped) if self.history is not None else {}

    def state_dict(self) -> dict:
        state = {"epoch": self._epoch, "index": self._index, "seed": self.seed}
        if self._skipped or self.history is not None:
            state["skipped"] = list(self._skipped)
        if self.history is not None and self.owns_history:
            state["skip_flat"] = self.history.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position (the saved seed replaces this iterator's seed)."""
        if state.get("kind") == "mixture":
            raise ValueError("the saved data state is of a mixture (data.train a list of sources with weights), not one data "
                             "order; resume with that data.train, or start a new run")
        missing = {"epoch", "index", "seed"} - set(state)
        if missing:
            raise ValueError(f"iterator state lacks {', '.join(sorted(missing))}; got keys {', '.join(state)}")
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index <= len(self.tasks):
            raise ValueError(
                f"iterator state epoch={epoch} index={index} does not fit a data set of "
                f"{len(self.tasks)} tasks (was the data set changed since the checkpoint?)"
            )
        skipped = state.get("skipped") or []
        if not all(isinstance(i, int) and 0 <= i < len(self.tasks) for i in skipped):
            raise ValueError(f"iterator state's skipped tasks do not fit a data set of {len(self.tasks)} tasks "
                             "(was the data set changed since the checkpoint?)")
        if self.history is not None and self.owns_history and "skip_flat" in state:
            self.history.load_state_dict(state["skip_flat"])
        self.seed = int(state["seed"])
        self._epoch, self._index, self._order, self._skipped = epoch, index, None, list(skipped)
