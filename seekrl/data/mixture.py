"""A weighted mixture of task sources: each batch's tasks drawn from the sources by weight,
reproducibly from the seed, and resumable exactly.

    it = MixtureIterator({"hotpotqa.jsonl": tasks_a, "nq.jsonl": tasks_b}, {"hotpotqa.jsonl": 0.7, "nq.jsonl": 0.3},
                         batch_size=8, seed=0)
    it.next_batch()          # 8 tasks, about 70% from hotpotqa.jsonl
    it.state_dict()          # {"kind": "mixture", "seed": 0, "batches": 1, "sources": {name: {"epoch", "index", "seed"}}}

How batch b is drawn (`data.train` as a list of `{name, weight}`; data/sets.py builds this):
1. how many of its `batch_size` tasks each source gives: systematic sampling by weight, with one
   uniform `u` from `random.Random(h(seed, "mixture", b))`: the points (u + j) / batch_size,
   j = 0..batch_size-1, fall into the sources' shares of [0, 1) (in the listed order). A source
   of share p gives floor or ceil of p * batch_size tasks, p * batch_size on average: the mixture
   holds in every batch, not only over many. The same generator then shuffles the slots.
2. each slot takes the next task of its source's own order: a `TaskIterator` of batch size 1 over
   the source's tasks, seeded `h(seed, "source", name)`, which goes through all of them before
   any repeats and reshuffles each pass (`data.shuffle=false`: file order).
`h` is a SHA-256 of the parts (the same in every process), so batch b depends only on the seed,
b and the source orders: `state_dict()` is the batch count, the seed and each source's position
(JSON), and a restored iterator yields exactly the batches the saved one would have. The weights
are not part of the state: a resumed run may change them, and draws by the new ones from then on.

Each task keeps its `Task.source` (the data set's name: builtin name, file stem, a verl row's
data_source), which the per-source metrics read.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence

from seekrl.data.iterator import TaskIterator
from seekrl.data.skip import FlatHistory
from seekrl.types import Task

__all__ = ["MixtureIterator", "stable_int"]


def stable_int(*parts) -> int:
    """A 32-bit integer from SHA-256 of the parts' text: the same in every process and run."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode("utf-8")).digest()[:4], "big")


class MixtureIterator:
    """Yield lists of `batch_size` tasks drawn from weighted sources (module docstring)."""

    def __init__(self, sources: dict[str, Sequence[Task]], weights: dict[str, float], batch_size: int, seed: int = 0,
                 shuffle: bool = True, history: FlatHistory | None = None) -> None:
        if not sources:
            raise ValueError("a mixture needs at least one source")
        if set(weights) != set(sources):
            raise ValueError(f"weights name {sorted(weights)}, sources {sorted(sources)}: give one weight per source")
        bad = {k: w for k, w in weights.items() if not (math.isfinite(w) and w >= 0)}
        if bad:
            raise ValueError(f"mixture weights must be finite and >= 0, got {bad}")
        total = sum(weights.values())
        if total <= 0:
            raise ValueError("every mixture weight is 0; give at least one source a weight > 0")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        empty = [k for k, ts in sources.items() if not ts and weights[k] > 0]
        if empty:
            raise ValueError(f"mixture source {empty[0]!r} has no tasks")
        self.names = list(sources)
        self.weights = {k: float(weights[k]) for k in self.names}
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.sources = {k: list(sources[k]) for k in self.names}
        self.tasks = [t for k in self.names for t in self.sources[k]]
        self.history = history  # data.skip_flat: one for every source's order, stored once (state_dict)
        self._orders = {k: TaskIterator(ts, 1, seed=stable_int(self.seed, "source", k), shuffle=shuffle, history=history,
                                        salt=k, owns_history=False)
                        for k, ts in self.sources.items() if ts}
        self._batches = 0
        self._drawn = 0

    @property
    def epoch(self) -> int:
        """Tasks drawn so far over the number of tasks, rounded down: passes' worth of tasks."""
        return self._drawn // max(1, len(self.tasks))

    def __len__(self) -> int:
        """Batches per pass' worth of tasks."""
        return max(1, len(self.tasks) // self.batch_size)

    def counts(self, batch: int) -> dict[str, int]:
        """How many tasks each source gives to batch number `batch` (0-based)."""
        return dict(zip(self.names, self._plan(batch)[0]))

    def _plan(self, batch: int) -> tuple[list[int], random.Random]:
        rng = random.Random(stable_int(self.seed, "mixture", batch))
        total = sum(self.weights.values())
        bounds, acc = [], 0.0
        for k in self.names:
            acc += self.weights[k] / total
            bounds.append(acc)
        bounds[-1] = 1.0
        u = rng.random()
        counts = [0] * len(self.names)
        i = 0
        for j in range(self.batch_size):
            x = (u + j) / self.batch_size
            while x >= bounds[i] and i < len(bounds) - 1:
                i += 1
            counts[i] += 1
        return counts, rng

    def next_batch(self) -> list[Task]:
        counts, rng = self._plan(self._batches)
        slots = [k for k, n in zip(self.names, counts) for _ in range(n)]
        rng.shuffle(slots)
        out = [self._orders[k].next_batch()[0] for k in slots]
        self._batches += 1
        self._drawn += len(out)
        return out

    def __iter__(self) -> MixtureIterator:
        return self

    def __next__(self) -> list[Task]:
        return self.next_batch()

    def record(self, task: Task, informative: bool) -> None:
        """One rollout of `task`'s group (data.skip_flat; a no-op without a history)."""
        if self.history is not None:
            self.history.record(task, informative)

    def metrics(self) -> dict[str, float]:
        """data.skip_flat: the sources' left-out tasks summed (none without a history)."""
        return self.history.metrics(sum(it.skipped for it in self._orders.values())) if self.history is not None else {}

    def state_dict(self) -> dict:
        state = {"kind": "mixture", "seed": self.seed, "batches": self._batches, "drawn": self._drawn,
                 "sources": {k: it.state_dict() for k, it in self._orders.items()}}
        if self.history is not None:
            state["skip_flat"] = self.history.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position (the saved seed replaces this iterator's)."""
        if state.get("kind") != "mixture":
            raise ValueError("the saved data state is of one data order, not a mixture: data.train was a single source when "
                             "the checkpoint was written; resume with that data.train, or start a new run")
        saved = state.get("sources") or {}
        if set(saved) != set(self._orders):
            raise ValueError(f"the saved mixture has sources {', '.join(sorted(saved)) or 'none'}, data.train has "
                             f"{', '.join(sorted(self._orders))}; resume with the same sources (weights may change)")
        for k, it in self._orders.items():
            it.load_state_dict(saved[k])
        if self.history is not None and "skip_flat" in state:
            self.history.load_state_dict(state["skip_flat"])
        self.seed = int(state["seed"])
        self._batches, self._drawn = int(state["batches"]), int(state.get("drawn", 0))

    def filtered(self, keep: Callable[[Task], bool]) -> MixtureIterator:
        """A new iterator (at the start) over the tasks `keep` accepts; a source with weight > 0 left
        without tasks is a ValueError naming it."""
        sources = {k: [t for t in ts if keep(t)] for k, ts in self.sources.items()}
        for k, ts in sources.items():
            if not ts and self.weights[k] > 0:
                raise ValueError(f"data.train source '{k}' has no task left (every prompt is too long); raise "
                                 "rollout.max_prompt_tokens or give it weight 0")
        return MixtureIterator(sources, self.weights, self.batch_size, seed=self.seed, shuffle=self.shuffle, history=self.history)
