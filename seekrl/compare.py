"""`seekrl compare`: is a policy's gain over another real? The paired bootstrap of two evals.

    seekrl compare runs/sft/eval runs/grpo/eval [runs/grpo_s1/eval ...] [--metric em] [--per-source] [--json FILE]

Each argument is an eval folder (`seekrl eval` writes `<run>/eval/trajectories.jsonl`; a folder
holding one nested `eval/` is followed) or a trajectories file. A task's score is the mean over
its samples of `metrics["score/<metric>"]` (em, f1, accuracy, ...; `reward` reads the episode's
reward), so an eval with eval.n > 1 compares per task, not per sample. A task is its data set
(`source`) and id, so data sets whose ids overlap stay apart. The evals are compared on the tasks
they all scored; the others are counted, not silently dropped. `--per-source` adds the same
comparison for each data set of a multi-source eval (Search-R1's table: NQ, HotpotQA, ...).

For each later eval: the mean score before and after, the gain, its 95% percentile interval from
resampling the tasks (the paired bootstrap: each resample draws tasks with replacement and keeps
both evals' scores of a task together), and how many tasks went up and down. With two or more
later evals (seeds of one configuration) it also gives the gain of their mean, task by task:
the seeds' mean gain with an interval that counts every seed's answers.

Pure functions of the trajectory files (`task_scores`, `compare_scores`, `paired_bootstrap`), so
a recipe's report and the command agree; an eval that cannot be compared (no trajectories, a
malformed line, a metric it lacks) is one `DataError` line naming its file and line (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from seekrl.errors import DataError

__all__ = ["paired_bootstrap", "trajectory_file", "task_scores", "compare_scores", "compare_evals",
           "compare_markdown"]


def paired_bootstrap(before: list[float], after: list[float], n: int = 10_000, seed: int = 0) -> dict:
    """Mean of after - before over paired tasks, and its 95% percentile interval from `n`
    resamples of the tasks."""
    import numpy as np

    if len(before) != len(after) or not before:
        raise ValueError(f"paired bootstrap needs two equal, non-empty lists, got {len(before)} and {len(after)}")
    d = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(d.mean()), "ci95": [float(lo), float(hi)], "n": len(d), "resamples": n}


def trajectory_file(path: str | Path) -> Path:
    """The trajectories.jsonl of an eval folder (its own, or the one of the single eval/ folder
    nested in it: `log.dir=X log.name=eval` writes X/eval/eval/), or `path` itself when a file."""
    p = Path(path)
    if p.is_file():
        return p
    here = p
    while here.is_dir():
        if (here / "trajectories.jsonl").is_file():
            return here / "trajectories.jsonl"
        here = here / "eval"
    raise DataError(f"{path}: no trajectories.jsonl in it or its eval/ folders; give an eval folder (seekrl eval writes "
                    "runs/<log.name>/eval/) or a trajectories.jsonl")


def task_scores(path: str | Path, metric: str = "em") -> dict[tuple[str, str], float]:
    """(source, task id) -> the mean over its samples of `score/<metric>` (`reward`: the episode's reward)."""
    from seekrl.data.loaders import read_rows  # JSON lines, a bad one named by file:line

    f = trajectory_file(path)
    sums: dict[tuple[str, str], list[float]] = {}
    for line_no, rec in read_rows(f, "jsonl"):
        try:
            task_id = (str(rec.get("source") or ""), str(rec["task_id"]))
            value = float(rec["reward"] if metric == "reward" else rec["metrics"][f"score/{metric}"])
        except (KeyError, TypeError, ValueError):
            metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
            have = sorted(k.removeprefix("score/") for k in metrics if k.startswith("score/"))
            raise DataError(f"{f}:{line_no}: no task_id or no score/{metric}; --metric is one of "
                            f"{', '.join(['reward', *have])}") from None
        s = sums.setdefault(task_id, [0.0, 0.0])
        s[0] += value
        s[1] += 1
    if not sums:
        raise DataError(f"{f}: no episodes; run seekrl eval first")
    return {t: total / n for t, (total, n) in sums.items()}


def compare_scores(base: dict, afters: dict[str, dict], resamples: int = 10_000, seed: int = 0) -> dict:
    """Each later eval's gain over `base` on the tasks every eval scored (module docstring), and
    with two or more, the gain of their task-by-task mean."""
    common = set(base).intersection(*afters.values()) if afters else set(base)
    if not common:
        raise DataError("the evals share no task (data set and id); compare evals of the same data.eval")
    ids = sorted(common)
    before = [base[i] for i in ids]
    rows = {}
    for name, scores in afters.items():
        after = [scores[i] for i in ids]
        rows[name] = {"before": sum(before) / len(ids), "after": sum(after) / len(ids),
                      "up": sum(a > b for a, b in zip(after, before)), "down": sum(a < b for a, b in zip(after, before)),
                      **paired_bootstrap(before, after, resamples, seed)}
    res = {"n": len(ids), "left_out": {"base": len(base) - len(ids), **{k: len(v) - len(ids) for k, v in afters.items()}},
           "gains": rows}
    if len(afters) > 1:
        mean_after = [sum(s[i] for s in afters.values()) / len(afters) for i in ids]
        res["mean"] = {"before": sum(before) / len(ids), "after": sum(mean_after) / len(ids), "evals": len(afters),
                       **paired_bootstrap(before, mean_after, resamples, seed)}
    return res


def compare_evals(base: str | Path, afters: list[str | Path], metric: str = "em", resamples: int = 10_000, seed: int = 0,
                  per_source: bool = False) -> dict:
    """`compare_scores` of eval folders or trajectory files; with `per_source`, also of each data
    set that every eval scored (`by_source`)."""
    if not afters:
        raise DataError("give the eval to compare against and at least one later eval")
    names = [str(a) for a in afters]
    if len(set(names)) != len(names):
        raise DataError("the same later eval is given twice; give each seed's eval once")
    before, after = task_scores(base, metric), {n: task_scores(n, metric) for n in names}
    res = {"metric": metric, "base": str(base), **compare_scores(before, after, resamples, seed)}
    if per_source:
        def of(scores: dict, src: str) -> dict:
            return {k: v for k, v in scores.items() if k[0] == src}

        shared = {k[0] for k in set(before).intersection(*after.values())}  # the data sets with a task every eval scored
        res["by_source"] = {src: compare_scores(of(before, src), {n: of(s, src) for n, s in after.items()}, resamples, seed)
                            for src in sorted(shared)}
    return res


def compare_markdown(res: dict) -> str:
    """The comparison as a markdown table (scores and gains in points: x 100), then one a data set
    with `by_source`."""
    text = _table(res, res.get("metric", "em"))
    for src, sub in res.get("by_source", {}).items():
        text += f"\n{src or '(no source)'}:\n\n" + _table(sub, res.get("metric", "em"))
    return text


def _table(res: dict, metric: str) -> str:
    head = f"| eval | {metric} before | {metric} after | gain (points) | 95% CI | up / down |"
    lines = [head, "|---|---|---|---|---|---|"]
    for name, g in res["gains"].items():
        lines.append(f"| {name} | {g['before']:.3f} | {g['after']:.3f} | {100 * g['mean']:+.1f} | "
                     f"[{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}] | {g['up']} / {g['down']} |")
    if "mean" in res:
        g = res["mean"]
        lines.append(f"| mean of {g['evals']} | {g['before']:.3f} | {g['after']:.3f} | {100 * g['mean']:+.1f} | "
                     f"[{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}] | |")
    left = {k: v for k, v in res["left_out"].items() if v}
    note = f"{res['n']} tasks scored by every eval (paired bootstrap, {next(iter(res['gains'].values()))['resamples']:,} resamples)"
    if left:
        note += "; left out, scored by only some: " + ", ".join(f"{k} {v}" for k, v in left.items())
    return "\n".join(lines) + "\n\n" + note + "\n"
