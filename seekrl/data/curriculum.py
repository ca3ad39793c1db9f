"""A curriculum from a measured pass rate (`data.curriculum`): train only on the questions the
starting model solves sometimes but not always.

    seekrl curriculum CONFIG [overrides]      # samples data.curriculum_k answers per training task, writes data.curriculum
    seekrl train CONFIG                       # data.curriculum set: the training tasks are filtered by it

`seekrl curriculum` (jobs.curriculum) runs the evaluator of `seekrl eval` (evaluate.pass_counts)
over `data.train` with the training workflow, `model.path` (the starting, e.g. SFT, policy),
`data.curriculum_k` samples per task at `rollout.temperature`, seeded `stable_seed(data.curriculum_seed or train.seed,
"curriculum")`, and writes one JSON file:

    {"version": 1, "key": {"model", "data", "k", "seed", "temperature", "max_new_tokens"},
     "tasks": [{"source", "id", "n", "correct"}, ...]}

`n` counts the samples that ran (status ok; infrastructure failures left out, as `seekrl eval`
does) and `correct` those `evaluate.score_trajectory` marks correct. A task is kept when
0 < correct < n: the estimated pass@1 (correct / n, the fraction of k samples solved) is
strictly between 0 and 1, so a group of its samples is likely to have reward spread. (pass@k
itself, with n = k samples, is 0 or 1: "solved by some sample" — hence this reading.)

The file is a cache keyed by what decides the measurement: the model path, the data (data.train,
max_train and the prompt settings), k, the seed, the temperature and the token budget. Running
the command again with the same key reuses it; a training run whose key differs, or that finds
no file, stops with a DataError naming the command, so the filter is always reproducible from
its cache. `keep_filter` returns the predicate `load_task_sets` applies to the training tasks
(per source for a mixture).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from seekrl.errors import DataError
from seekrl.types import Task

__all__ = ["curriculum_key", "write_curriculum", "read_curriculum", "keep_filter", "informative_counts", "CURRICULUM_VERSION"]

CURRICULUM_VERSION = 1


def curriculum_key(*, model: str, data: dict[str, Any], k: int, seed: int, temperature: float, max_new_tokens: int) -> dict:
    """What the measurement depends on, as JSON-able values (the cache's key)."""
    return {"model": str(model), "data": json.loads(json.dumps(data)), "k": int(k), "seed": int(seed),
            "temperature": float(temperature), "max_new_tokens": int(max_new_tokens)}


def informative_counts(n: int, correct: int) -> bool:
    """Solved sometimes, not always: 0 < correct < n."""
    return 0 < correct < n


def write_curriculum(path: str | Path, key: dict, counts: Iterable[tuple[Task, int, int]]) -> Path:
    """Write the cache: `counts` holds (task, n, correct) for every measured task."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tasks = [{"source": t.source, "id": t.id, "n": int(n), "correct": int(c)} for t, n, c in counts]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"version": CURRICULUM_VERSION, "key": key, "tasks": tasks}, indent=1))
    tmp.replace(path)
    return path


def read_curriculum(path: str | Path, key: dict | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """(source, id) -> (n, correct) from the cache at `path`; with `key`, a cache measured for
    another key is a DataError that says which parts differ."""
    path = Path(path)
    fix = "run `seekrl curriculum CONFIG` (same config and overrides) to measure it"
    if not path.is_file():
        raise DataError(f"data.curriculum: '{path}' does not exist; {fix}")
    try:
        saved = json.loads(path.read_text())
        entries = saved["tasks"]
        table = {(str(e["source"]), str(e["id"])): (int(e["n"]), int(e["correct"])) for e in entries}
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"data.curriculum: '{path}' is not a curriculum file ({type(e).__name__}: {e}); {fix}") from None
    if key is not None and saved.get("key") != key:
        old = saved.get("key") or {}
        diff = ", ".join(f"{k}: {old.get(k)!r} -> {key[k]!r}" for k in key if old.get(k) != key[k]) or "format"
        raise DataError(f"data.curriculum: '{path}' was measured for another setting ({diff}); {fix}")
    return table


def keep_filter(path: str | Path, key: dict) -> Callable[[Task], bool]:
    """The training-task predicate of the cache at `path`: measured, and 0 < correct < n."""
    table = read_curriculum(path, key)

    def keep(task: Task) -> bool:
        n, c = table.get((task.source, task.id), (0, 0))
        return informative_counts(n, c)

    return keep
