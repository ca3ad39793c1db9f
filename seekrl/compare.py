"""`seekrl compare`: is a policy's gain over another real? The paired bootstrap of two evals.

    seekrl compare runs/sft/eval runs/grpo/eval [runs/grpo_s1/eval ...] [--metric em] [--per-source] [--by FIELD]
                   [--by-run RUN] [--json FILE]

Each argument is an eval folder (`seekrl eval` writes `<run>/eval/trajectories.jsonl`; a folder
holding one nested `eval/` is followed) or a trajectories file. A task's score is the mean over
its samples of `metrics["score/<metric>"]` (em, f1, accuracy, ...; `reward` reads the episode's
reward), so an eval with eval.n > 1 compares per task, not per sample. A task is its data set
(`source`) and id, so data sets whose ids overlap stay apart. The evals are compared on the tasks
they all scored; the others are counted, not silently dropped (`--match id` pairs by id alone:
the same questions read from files of different names). `--per-source` adds the same
comparison for each data set of a multi-source eval (Search-R1's table: NQ, HotpotQA, ...);
`--by FIELD` adds it for each value of a field of the tasks' rows (HotpotQA's `type`: bridge and
comparison questions; `level`; a dotted path such as `extra_info.split`), read from the data the
evals ran on (the base eval's config.yaml `data.eval`, or `--tasks SPEC`). `--by-run RUN` adds it
for what an RL run did with each task (`run_labels`): the tasks whose group's rewards differed in
some step (what GRPO trained on), those sampled with equal rewards, and those never sampled; evals
of a run's training questions then tell a gain on what it trained on from one that carries.

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
from typing import Any, Callable

from seekrl.errors import DataError
from seekrl.types import Task

__all__ = ["paired_bootstrap", "trajectory_file", "task_scores", "task_labels", "run_labels", "compare_scores",
           "compare_evals", "compare_markdown"]

TaskKey = tuple[str, str]  # (data set, task id)


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


def task_scores(path: str | Path, metric: str = "em", match: str = "task") -> dict[tuple[str, str], float]:
    """(source, task id) -> the mean over its samples of `score/<metric>` (`reward`: the episode's
    reward). `match="id"`: keyed ("", task id), for evals of the same questions read from files of
    different names (an id in two data sets of one eval is then a DataError)."""
    from seekrl.data.loaders import read_rows  # JSON lines, a bad one named by file:line

    f = trajectory_file(path)
    sums: dict[tuple[str, str], list[float]] = {}
    sources: dict[str, str] = {}
    for line_no, rec in read_rows(f, "jsonl"):
        try:
            task_id = (str(rec.get("source") or ""), str(rec["task_id"]))
            value = float(rec["reward"] if metric == "reward" else rec["metrics"][f"score/{metric}"])
        except (KeyError, TypeError, ValueError):
            metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
            have = sorted(k.removeprefix("score/") for k in metrics if k.startswith("score/"))
            raise DataError(f"{f}:{line_no}: no task_id or no score/{metric}; --metric is one of "
                            f"{', '.join(['reward', *have])}") from None
        if match == "id":
            if sources.setdefault(task_id[1], task_id[0]) != task_id[0]:
                raise DataError(f"{f}:{line_no}: task id {task_id[1]!r} is in data sets {sources[task_id[1]]!r} and "
                                f"{task_id[0]!r}; --match id needs ids unique across an eval's data sets")
            task_id = ("", task_id[1])
        s = sums.setdefault(task_id, [0.0, 0.0])
        s[0] += value
        s[1] += 1
    if not sums:
        raise DataError(f"{f}: no episodes; run seekrl eval first")
    return {t: total / n for t, (total, n) in sums.items()}


def task_labels(tasks: list[Task], field: str) -> Callable[[TaskKey], str | None]:
    """(data set, task id) -> the value of `field` in the task's row (`Task.meta`; dotted for a
    nested field) as text, "(none)" where the row lacks it, None for a task not in `tasks`. A task
    is found by its data set and id, else by its id alone where that id is unique in `tasks` (a
    data file given under another name than the eval's)."""

    def value(meta: dict) -> Any:
        for part in field.split("."):
            if not isinstance(meta, dict) or part not in meta:
                return None
            meta = meta[part]
        return meta

    by_key = {(t.source, t.id): value(t.meta) for t in tasks}
    if all(v is None for v in by_key.values()):
        have = sorted({k for t in tasks for k in t.meta})
        raise DataError(f"no task has a field {field!r}; --by is one of the rows' fields: {', '.join(have) or '(none)'}")
    find = _finder(by_key)

    def label(key: TaskKey) -> str | None:
        found, v = find(key)
        return None if not found else "(none)" if v is None else str(v)

    return label


def _finder(by_key: dict[TaskKey, Any]) -> Callable[[TaskKey], tuple[bool, Any]]:
    """key -> (found, value): by data set and id, else by id alone where that id is unique."""
    ids: dict[str, list[Any]] = {}
    for (_, tid), v in by_key.items():
        ids.setdefault(tid, []).append(v)

    def find(key: TaskKey) -> tuple[bool, Any]:
        if key in by_key:
            return True, by_key[key]
        if len(ids.get(key[1], ())) == 1:
            return True, ids[key[1]][0]
        return False, None

    return find


RUN_LABELS = ("rewards differed", "rewards equal", "not sampled")  # run_labels' groups, in this order


def run_labels(run_dir: str | Path) -> tuple[Callable[[TaskKey], str], dict]:
    """(data set, task id) -> what an RL run did with the task, from the groups its steps logged
    (RUN/trajectories/step_<N>.jsonl): "rewards differed" (in some step its group's rewards were not
    all equal, so GRPO's advantages moved it), "rewards equal" (sampled, never a spread), "not
    sampled" (never in a logged group; a refill's surplus groups are rolled out but neither trained
    nor logged). A task is found by data set and id, else by id where unique in the run. Also
    returns counts {steps, tasks, per label}. The run must have logged every group of every step
    (log.samples_every=1, log.samples_groups above a step's groups), else a DataError says so."""
    from seekrl.data.loaders import read_rows
    from seekrl.observe.loggers import SAMPLES_DIR, read_metrics

    run = Path(run_dir)
    files = {int(f.stem.removeprefix("step_")): f for f in (run / SAMPLES_DIR).glob("step_*.jsonl")
             if f.stem.removeprefix("step_").isdigit()}
    steps = sorted({int(r["step"]) for r in read_metrics(run) if r.get("step", 0) > 0})  # 0: the eval before training
    if not files or not steps:
        raise DataError(f"{run}: no {SAMPLES_DIR}/step_<N>.jsonl and metrics.jsonl; give an RL run folder (runs/<log.name>) "
                        "trained with log.samples_every=1")
    if missing := [s for s in steps if s not in files]:
        raise DataError(f"{run}: steps {missing[:5]} logged no trajectories (log.samples_every > 1?); the run's groups "
                        "are known only with log.samples_every=1")
    cap = _samples_groups(run)
    spread: dict[TaskKey, bool] = {}
    for step in steps:
        groups: dict[int, tuple[TaskKey, set]] = {}
        for line_no, rec in read_rows(files[step], "jsonl"):
            try:
                key = (str(rec.get("source") or ""), str(rec["task_id"]))
                rewards = groups.setdefault(int(rec["group"]), (key, set()))[1]
                if rec.get("status", "ok") == "ok":  # what the trainer kept (an engine or tool failure is left out)
                    rewards.add(float(rec["reward"]))
            except (KeyError, TypeError, ValueError):
                raise DataError(f"{files[step]}:{line_no}: no task_id, group or reward; not a step's trajectories") from None
        if cap is not None and len(groups) >= cap:
            raise DataError(f"{files[step]}: {len(groups)} groups, log.samples_groups={cap}: the step may have sampled more "
                            "than it logged; train with log.samples_groups above a step's groups (e.g. 1000)")
        for key, rewards in groups.values():
            spread[key] = spread.get(key, False) or len(rewards) > 1
    find = _finder(spread)

    def label(key: TaskKey) -> str:
        found, v = find(key)
        return RUN_LABELS[2] if not found else RUN_LABELS[0] if v else RUN_LABELS[1]

    counts = {"steps": len(steps), "tasks": len(spread), RUN_LABELS[0]: sum(spread.values()),
              RUN_LABELS[1]: sum(not v for v in spread.values())}
    return label, counts


def _samples_groups(run: Path) -> int | None:
    """log.samples_groups of the run's config.yaml (None: no config, or no cap)."""
    import yaml

    cfg = run / "config.yaml"
    if not cfg.is_file():
        return None
    log = (yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}).get("log") or {}
    return log.get("samples_groups")


def compare_scores(base: dict, afters: dict[str, dict], resamples: int = 10_000, seed: int = 0) -> dict:
    """Each later eval's gain over `base` on the tasks every eval scored (module docstring), and
    with two or more, the gain of their task-by-task mean."""
    common = set(base).intersection(*afters.values()) if afters else set(base)
    if not common:
        raise DataError("the evals share no task (data set and id); compare evals of the same data.eval, or give "
                        "--match id when they read the same questions from files of different names")
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


def _grouped(before: dict, after: dict[str, dict], label: Callable[[TaskKey], str | None], resamples: int,
             seed: int) -> dict[str, dict]:
    """`compare_scores` of each group (label) of the tasks every eval scored; label None: no group."""
    shared = set(before).intersection(*after.values())
    labels = {k: label(k) for k in set(before).union(*after.values())}

    def of(scores: dict, lab: str) -> dict:
        return {k: v for k, v in scores.items() if labels[k] == lab}

    return {lab: compare_scores(of(before, lab), {n: of(s, lab) for n, s in after.items()}, resamples, seed)
            for lab in sorted({labels[k] for k in shared} - {None})}


def compare_evals(base: str | Path, afters: list[str | Path], metric: str = "em", resamples: int = 10_000, seed: int = 0,
                  per_source: bool = False, by: str | None = None, tasks: list[Task] | None = None,
                  tasks_from: str = "", match: str = "task", run: str | Path | None = None) -> dict:
    """`compare_scores` of eval folders or trajectory files; with `per_source`, also of each data
    set that every eval scored (`by_source`); with `by`, of each value of that field of `tasks`'
    rows (`by_field`: `field`, `tasks` (`tasks_from`, where they were read), `groups`, and
    `not_in_tasks`: the compared tasks the rows lack); with `run` (an RL run folder), of what
    that run did with each task (`by_run`: `run`, `counts`, `groups`, by `run_labels`).
    `match="id"` pairs tasks by id alone (`task_scores`)."""
    if not afters:
        raise DataError("give the eval to compare against and at least one later eval")
    names = [str(a) for a in afters]
    if len(set(names)) != len(names):
        raise DataError("the same later eval is given twice; give each seed's eval once")
    if match not in ("task", "id"):
        raise DataError(f"--match is task or id, got {match!r}")
    if per_source and match == "id":
        raise DataError("--per-source needs the data sets, which --match id sets aside; drop one of them")
    before, after = task_scores(base, metric, match), {n: task_scores(n, metric, match) for n in names}
    res = {"metric": metric, "base": str(base), **compare_scores(before, after, resamples, seed)}
    if per_source:
        res["by_source"] = _grouped(before, after, lambda k: k[0], resamples, seed)
    if by:
        if not tasks:
            raise DataError(f"--by {by} needs the tasks' rows: give --tasks the data the evals ran on")
        label = task_labels(tasks, by)
        shared = set(before).intersection(*after.values())
        missing = sum(label(k) is None for k in shared)
        if missing == len(shared):
            raise DataError(f"none of the {len(shared)} compared tasks is in {tasks_from or 'the tasks given'}; "
                            "give --tasks the data.eval the evals ran on")
        res["by_field"] = {"field": by, "tasks": tasks_from, "not_in_tasks": missing,
                           "groups": _grouped(before, after, label, resamples, seed)}
    if run:
        label, counts = run_labels(run)
        groups = _grouped(before, after, label, resamples, seed)
        res["by_run"] = {"run": str(run), "counts": counts, "groups": {k: groups[k] for k in RUN_LABELS if k in groups}}
    return res


def compare_markdown(res: dict) -> str:
    """The comparison as a markdown table (scores and gains in points: x 100), then one a data set
    with `by_source`, one a value of the field with `by_field`, one a `run_labels` group with `by_run`."""
    metric = res.get("metric", "em")
    text = _table(res, metric)
    for src, sub in res.get("by_source", {}).items():
        text += f"\n{src or '(no source)'}:\n\n" + _table(sub, metric)
    by = res.get("by_field")
    if by:
        for value, sub in by["groups"].items():
            text += f"\n{by['field']} = {value}:\n\n" + _table(sub, metric)
        if by["not_in_tasks"]:
            text += f"\n{by['not_in_tasks']} compared tasks are not in {by['tasks'] or 'the tasks'}: in no {by['field']} table\n"
    run = res.get("by_run")
    if run:
        c = run["counts"]
        text += (f"\n{run['run']}: {c['tasks']} tasks sampled in {c['steps']} steps, {c[RUN_LABELS[0]]} with rewards that "
                 f"differed in some step\n")
        for lab, sub in run["groups"].items():
            text += f"\nrun: {lab}:\n\n" + _table(sub, metric)
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
