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

Finite inputs give finite metrics, up to the float limit (values near 1e308): keys keep a running
weighted mean (not a sum that overflows), distributions keep their standard deviation (not a sum
of squares) and every combination is scaled so no intermediate overflows.
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


def _combine_mean(mean_a: float, w_a: float, mean_b: float, w_b: float) -> float:
    """The weighted mean of two weighted means, without overflowing (w_a + w_b != 0)."""
    w = w_a + w_b
    delta = mean_b - mean_a
    if math.isfinite(delta) or not (math.isfinite(mean_a) and math.isfinite(mean_b)):
        return mean_a + delta * (w_b / w)
    return mean_a * (w_a / w) + mean_b * (w_b / w)  # delta overflowed: both terms stay finite


def _pool(a: list[float], b: list[float]) -> list[float]:
    """Two distributions [n, mean, std, min, max] pooled (Chan et al.'s update in std form, scaled
    by the largest of std_a, std_b and |delta| so nothing squares past the float limit)."""
    n_a, mean_a, std_a, lo_a, hi_a = a
    n_b, mean_b, std_b, lo_b, hi_b = b
    if n_a == 0:
        return list(b)
    n = n_a + n_b
    mean = _combine_mean(mean_a, n_a, mean_b, n_b)
    half = mean_b / 2 - mean_a / 2  # delta / 2: finite whenever the means are
    c = max(std_a, std_b, abs(half))
    if c == 0 or not math.isfinite(c):
        std = c if not math.isfinite(c) else 0.0
    else:
        var = (n_a / n) * (std_a / c) ** 2 + (n_b / n) * (std_b / c) ** 2 + 4 * (n_a / n) * (n_b / n) * (half / c) ** 2
        std = c * math.sqrt(var)
    lo, hi = min(lo_a, lo_b), max(hi_a, hi_b)
    if math.isfinite(lo) and math.isfinite(hi):
        std = min(std, hi / 2 - lo / 2)  # a population std is at most half the range (rounding can pass it)
    return [n, mean, std, lo, hi]


def _batch_dist(xs: list[float]) -> list[float]:
    """[n, mean, population std, min, max] of `xs`, computed in a scaled way near the float limit."""
    n = float(len(xs))
    lo, hi = min(xs), max(xs)
    mean = sum(xs) / n
    if not math.isfinite(mean) and math.isfinite(lo) and math.isfinite(hi):
        mean = sum(v / n for v in xs)
    halves = [v / 2 - mean / 2 for v in xs]  # deviations / 2: finite whenever the values are
    c = max(abs(h) for h in halves)
    if c == 0 or not math.isfinite(c):
        std = 0.0 if c == 0 else math.nan
    else:
        std = c * (2 * math.sqrt(sum((h / c) ** 2 for h in halves) / n))
        if math.isfinite(lo) and math.isfinite(hi):
            std = min(std, hi / 2 - lo / 2)
    return [n, mean, std, lo, hi]


def _masked_mean_lists(xs: list[float], ms: list[float]) -> tuple[float, float]:
    count = float(sum(ms))
    if count <= 0:
        return 0.0, count
    total = sum(a * b for a, b in zip(xs, ms))
    if math.isfinite(total) or not all(math.isfinite(a * b) for a, b in zip(xs, ms)):
        return total / count, count
    scale = max(abs(a) for a, b in zip(xs, ms) if b)  # the sum overflowed: sum the scaled values
    return scale * (sum((a / scale) * b for a, b in zip(xs, ms)) / count), count


class StatsTracker:
    """Scoped metric accumulator; see the module docstring."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}  # key -> running weighted mean (a sum would overflow near 1e308)
        self._counts: dict[str, float] = {}  # key -> its total weight
        self._dists: dict[str, list[float]] = {}  # key -> [n, mean, std, min, max]
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

    def _accumulate(self, key: str, mean: float, weight: float) -> None:
        """Add `mean` with `weight` to the key's running weighted mean."""
        w_a = self._counts.get(key, 0.0)
        if w_a + weight == 0:  # nothing to average yet (zero weights)
            self._sums.setdefault(key, 0.0)
            self._counts[key] = w_a + weight
            return
        self._sums[key] = _combine_mean(self._sums.get(key, 0.0), w_a, mean, weight)
        self._counts[key] = w_a + weight

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
            self._accumulate(self._key(name), _to_float(value), float(weight))

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
            count = float(m_.sum().item())
            if count <= 0:
                return
            total = float((x_ * m_).sum().item())
            if not math.isfinite(total) and bool((x_ * m_).isfinite().all()):  # the sum overflowed: scale it
                scale = float(x_.abs().masked_fill(m_ == 0, 0).max().item())
                mean = scale * (float(((x_ / scale) * m_).sum().item()) / count)
            else:
                mean = total / count
        else:
            xs, ms = _to_list(x), _to_list(mask)
            if len(xs) != len(ms):
                raise ValueError(f"add_masked({name!r}): x has {len(xs)} values but mask has {len(ms)}")
            mean, count = _masked_mean_lists(xs, ms)
        if count > 0:
            self._accumulate(self._key(name), mean, count)

    def add_dist(self, name: str, values: Iterable[float] | Any) -> None:
        """Record a distribution: exports name/mean, name/std, name/min, name/max.

        Repeated calls pool the values (mean and population std over all of them, combined
        with Chan et al.'s parallel update so large offsets do not lose precision, in a scaled
        form that stays finite up to the float limit).
        """
        xs = _to_list(values)
        if not xs:
            return
        key = self._key(name)
        self._dists[key] = _pool(self._dists.get(key, [0.0, 0.0, 0.0, math.inf, -math.inf]), _batch_dist(xs))

    # ----------------------------------------------------------------------------- ranks
    def state(self) -> dict:
        """What `merge` combines: the running sums, counts and distributions (JSON)."""
        return {"sums": self._sums, "counts": self._counts, "dists": self._dists, "maxes": self._maxes}

    def merge(self, states: list[dict]) -> None:
        """Replace this tracker's values by the combination of `states` (every rank's `state()`):
        weighted means combine, distributions pool. A value every rank recorded alike exports as it was."""
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        dists: dict[str, list[float]] = {}
        maxes: dict[str, float] = {}
        for st in states:
            for k, v in st["maxes"].items():
                maxes[k] = max(maxes.get(k, -math.inf), v)
            for k, v in st["sums"].items():
                w_a, w_b = counts.get(k, 0.0), st["counts"][k]
                sums[k] = _combine_mean(sums.get(k, 0.0), w_a, v, w_b) if w_a + w_b != 0 else sums.get(k, 0.0)
                counts[k] = w_a + w_b
            for k, dist in st["dists"].items():
                dists[k] = _pool(dists.get(k, [0.0, 0.0, 0.0, math.inf, -math.inf]), list(dist))
        self._sums, self._counts, self._dists, self._maxes = sums, counts, dists, maxes

    # ----------------------------------------------------------------------------- export
    def export(self, reset: bool = True) -> dict[str, float]:
        """All metrics of the step as {key: float}, keys sorted; clears the tracker if `reset`."""
        out: dict[str, float] = {}
        for key, mean in self._sums.items():
            if self._counts[key] != 0:
                out[key] = mean
        out.update(self._maxes)
        for key, (n, mean, std, lo, hi) in self._dists.items():
            out[f"{key}/mean"] = mean
            out[f"{key}/std"] = std
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
