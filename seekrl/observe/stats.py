"""Accumulate the metrics of one training step, then export them as a flat dict of floats.

Every key keeps a running sum and count, so values added by several micro-batches combine
correctly: repeated `add` of a key averages its values, and `add_masked` accumulates the
masked *sum* and the *number of unmasked tokens*, so micro-batches combine as a token-weighted
mean (not a mean of per-micro-batch means). Scopes prefix keys: inside
`with tracker.scope("loss"):` the call `tracker.add(policy=1.2)` records "loss/policy".

    tracker = StatsTracker()
    with tracker.scope("loss"):
        tracker.add(policy=1.2)
        tracker.add_masked("entropy", entropy_BT, mask_BT)
    tracker.add_dist("reward", rewards)
    metrics = tracker.export()   # {"loss/entropy": ..., "loss/policy": 1.2, "reward/max": ...}

Tensors are accepted (0-d tensors in `add`; any shape in `add_masked`/`add_dist`) but torch is
not required: the tracker reads them through `.detach()`/`.tolist()`/`.item()`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

__all__ = ["StatsTracker"]


def _to_float(value: Any) -> float:
    """A python number, numpy scalar or 0-d (one-element) tensor → float."""
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach()
        if value.numel() != 1:
            raise ValueError(f"StatsTracker.add expects a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # numpy scalar / 0-d array
        return float(value.item())
    return float(value)


def _to_list(values: Any) -> list[float]:
    """A tensor / array / iterable of numbers → flat list of floats."""
    if hasattr(values, "detach"):
        return [float(v) for v in values.detach().float().reshape(-1).tolist()]
    if hasattr(values, "tolist"):
        flat = values.tolist()
        if not isinstance(flat, list):
            return [float(flat)]
        values = flat
    out: list[float] = []
    stack: list[Any] = [values]
    while stack:  # flatten nested lists in order
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            out.append(float(item))
    return out


class StatsTracker:
    """Scoped metric accumulator; see the module docstring."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, float] = {}
        self._dists: dict[str, list[float]] = {}  # key -> [n, mean, m2, min, max]
        self._maxes: dict[str, float] = {}
        self._prefix: list[str] = []

    # ----------------------------------------------------------------------------- scopes
    @contextmanager
    def scope(self, name: str) -> Iterator["StatsTracker"]:
        """Prefix every key recorded inside the block with `name/` (scopes nest)."""
        self._prefix.append(name.strip("/"))
        try:
            yield self
        finally:
            self._prefix.pop()

    def _key(self, name: str) -> str:
        return "/".join([*self._prefix, name]) if self._prefix else name

    def _accumulate(self, key: str, total: float, count: float) -> None:
        self._sums[key] = self._sums.get(key, 0.0) + total
        self._counts[key] = self._counts.get(key, 0.0) + count

    # ----------------------------------------------------------------------------- adding
    def add(self, **values: Any) -> None:
        """Record scalars; a key added several times in one step exports its mean."""
        for name, value in values.items():
            self._accumulate(self._key(name), _to_float(value), 1.0)

    def add_weighted(self, weight: float, **values: Any) -> None:
        """Record scalars with a weight: a key exports sum(value × weight) / sum(weight). Micro-batches
        add their loss with their share of the minibatch, so the export is the minibatch's loss
        whatever the micro-batching (and whichever rank computed which micro-batch)."""
        for name, value in values.items():
            self._accumulate(self._key(name), _to_float(value) * weight, float(weight))

    def add_max(self, **values: Any) -> None:
        """Record scalars of which the step exports the largest (ratio_max over micro-batches)."""
        for name, value in values.items():
            key = self._key(name)
            self._maxes[key] = max(self._maxes.get(key, -math.inf), _to_float(value))

    def add_masked(self, name: str, x: Any, mask: Any) -> None:
        """Record the mean of `x` over positions where `mask` is nonzero (token-weighted).

        Keeps sum(x * mask) and sum(mask) so that several calls (micro-batches) export
        sum_i(sum x_i m_i) / sum_i(sum m_i). An all-zero mask adds nothing; a key that never
        received a token exports nothing.
        """
        if hasattr(x, "detach") and hasattr(mask, "detach"):
            x_ = x.detach().double()
            m_ = mask.detach().to(x_.dtype)
            if x_.shape != m_.shape:
                raise ValueError(f"add_masked({name!r}): x {tuple(x_.shape)} and mask {tuple(m_.shape)} differ in shape")
            total, count = float((x_ * m_).sum().item()), float(m_.sum().item())
        else:
            xs, ms = _to_list(x), _to_list(mask)
            if len(xs) != len(ms):
                raise ValueError(f"add_masked({name!r}): x has {len(xs)} values but mask has {len(ms)}")
            total, count = sum(a * b for a, b in zip(xs, ms)), float(sum(ms))
        if count > 0:
            self._accumulate(self._key(name), total, count)

    def add_dist(self, name: str, values: Iterable[float] | Any) -> None:
        """Record a distribution: exports name/mean, name/std, name/min, name/max.

        Repeated calls pool the values (mean and population std over all of them, combined
        with Chan et al.'s parallel update so large offsets do not lose precision).
        """
        xs = _to_list(values)
        if not xs:
            return
        n_b = float(len(xs))
        mean_b = sum(xs) / n_b
        m2_b = sum((v - mean_b) ** 2 for v in xs)
        key = self._key(name)
        n_a, mean_a, m2_a, lo, hi = self._dists.get(key, [0.0, 0.0, 0.0, math.inf, -math.inf])
        n = n_a + n_b
        delta = mean_b - mean_a
        self._dists[key] = [
            n,
            mean_a + delta * n_b / n,
            m2_a + m2_b + delta * delta * n_a * n_b / n,
            min(lo, min(xs)),
            max(hi, max(xs)),
        ]

    # ----------------------------------------------------------------------------- ranks
    def state(self) -> dict:
        """What `merge` combines: the running sums, counts and distributions (JSON)."""
        return {"sums": self._sums, "counts": self._counts, "dists": self._dists, "maxes": self._maxes}

    def merge(self, states: list[dict]) -> None:
        """Replace this tracker's values by the combination of `states` (every rank's `state()`):
        sums and counts add, distributions pool. A value every rank recorded alike exports as it was."""
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        dists: dict[str, list[float]] = {}
        maxes: dict[str, float] = {}
        for st in states:
            for k, v in st["maxes"].items():
                maxes[k] = max(maxes.get(k, -math.inf), v)
            for k, v in st["sums"].items():
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0.0) + st["counts"][k]
            for k, (n_b, mean_b, m2_b, lo_b, hi_b) in st["dists"].items():
                n_a, mean_a, m2_a, lo, hi = dists.get(k, [0.0, 0.0, 0.0, math.inf, -math.inf])
                n = n_a + n_b
                delta = mean_b - mean_a
                dists[k] = [n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n, min(lo, lo_b), max(hi, hi_b)]
        self._sums, self._counts, self._dists, self._maxes = sums, counts, dists, maxes

    # ----------------------------------------------------------------------------- export
    def export(self, reset: bool = True) -> dict[str, float]:
        """All metrics of the step as {key: float}, keys sorted; clears the tracker if `reset`."""
        out: dict[str, float] = {}
        for key, total in self._sums.items():
            out[key] = total / self._counts[key]
        out.update(self._maxes)
        for key, (n, mean, m2, lo, hi) in self._dists.items():
            out[f"{key}/mean"] = mean
            out[f"{key}/std"] = math.sqrt(max(m2 / n, 0.0))
            out[f"{key}/min"] = lo
            out[f"{key}/max"] = hi
        if reset:
            self.reset()
        return dict(sorted(out.items()))

    def reset(self) -> None:
        """Forget everything recorded (scopes in use are kept)."""
        self._sums.clear()
        self._counts.clear()
        self._dists.clear()
        self._maxes.clear()
