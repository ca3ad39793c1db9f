"""Evaluation with the same workflow as training: EM / F1 / accuracy, pass@k, tool use, per source and kind.

    seekrl eval examples/hotpotqa_search_grpo_smollm2.yaml model.path=runs/x/checkpoints/step_3/model
    # -> runs/<name>/eval/eval.json, eval.md (the table below) and trajectories.jsonl (every sample)

`summarize` scores every trajectory against `task.answer` on its own, whatever reward trained it:

- **QA tasks** (the answer is a list of aliases or a string, and the task is not math): `em` and
  `f1` of the final answer against the gold aliases (max over aliases), with the normalisation
  of rewards/qa.py. The final answer is read as the qa rewards read it: the last
  `<answer>...</answer>`, or the whole completion for `answer_format: "plain"` tasks; no answer
  scores 0.
- **Math tasks** — `is_math_task`: the source name contains gsm8k, math, aime or amc
  (`gsm8k`, `math500`, `aime24`, verl's `openai/gsm8k`, `math_dapo`, ...), or the answer is a
  number. `accuracy` is `math_accuracy` (math-verify equivalence) of the last `<answer>` if
  there is one, else of the completion (its last `\\boxed{}`, else math-verify's extraction).
- For QA (non-math) tasks `accuracy` keeps its old meaning: a sample is correct when its first reward part (the
  rubric's primary reward, e.g. `qa_em`) is at least 0.5. Tasks with rubric items (rewards/judge.py) have
  no gold aliases: no `em` / `f1`, correct by that rule. `em` / `f1` average over the QA
  samples of a scope, `accuracy` over all of them.
- `pass@k` is the unbiased estimator of Chen et al. 2021, 1 - C(n-c, k) / C(n, k), averaged
  over tasks, for k = 1, the powers of two below n, and n (n = 8: 1, 2, 4, 8). A sample is
  correct when its `em` is 1 (QA), its math `accuracy` is 1 (math), or — when the answer cannot
  be scored (e.g. no gold) — by the primary-reward rule above.
- `tool_calls` (mean of `metrics["tool_calls"]`, 0 when absent), `invalid_actions` (mean, when
  the workflow counts them), `answer_rate`: the tool workflow's episode ended with an answer
  (`finish_reason == "answered"`), and `well_formed`: it ended with an answer and every turn
  before it was a well-formed tool call (no invalid action); for a single-turn workflow (no `turns` metric), a final answer
  can be extracted (an `<answer>` tag; for math also a `\\boxed{}`; for plain tasks a non-empty
  completion).
- `reward`, `response_len` and every reward part are means; `count` is the number of tasks.
- `evaluate` leaves out the samples whose status is not ok (an engine, tool server or judge
  failure: `engine_error`, `tool_unavailable`, `reward_unavailable`): they are not scored, not
  even 0, and are counted in `excluded/<status>` and `excluded_frac` (of all samples); a task
  all of whose samples were left out is not in `count`. trajectories.jsonl still has them,
  with their status.

Keys are `{prefix}/{metric}` for all tasks, `{prefix}/{source}/{metric}` per source when there is
more than one, and `{prefix}/{kind}/{metric}` per `task.meta["kind"]` (the synthetic world's
1hop / 2hop / comparison). `eval_table_markdown` renders them one row per scope.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Annotated, Any

from seekrl.engines.base import InferenceEngine
from seekrl.errors import ConfigError
from seekrl.memory import peak_resident_gib
from seekrl.rewards.judge import has_rubric
from seekrl.rewards.math import extract_boxed, math_accuracy
from seekrl.rewards.qa import exact_match, extract_answer, f1_score, gold_list
from seekrl.rollout import collect
from seekrl.rollout.base import Workflow
from seekrl.schema import Range
from seekrl.types import MIN_TEMPERATURE, SamplingParams, Task, Trajectory, TrajectoryGroup

__all__ = ["EvalConfig", "EvalRun", "run", "evaluate", "summarize", "score_trajectory", "final_answer", "is_math_task",
           "pass_at_k", "pass_ks", "eval_table_markdown", "write_eval", "pass_counts", "MATH_SOURCE_MARKERS"]

MATH_SOURCE_MARKERS = ("gsm8k", "math", "aime", "amc")


@dataclass
class EvalConfig:
    """The `eval:` config section: when and how the RL loop (and `seekrl eval`) evaluates."""

    every: int = 0
    """Evaluate every N steps (0: only before and after training when data.eval is set)."""
    temperature: Annotated[float, Range(ge=0, hint="0: greedy")] = 0.0
    """Evaluation sampling temperature (0: greedy)."""
    n: Annotated[int, Range(ge=1)] = 1
    """Samples per eval task (pass@k uses them)."""

    def check(self) -> None:
        if 0 < self.temperature < MIN_TEMPERATURE:  # float32 cannot sample there: NaN log-probs
            raise ConfigError(f"eval.temperature: {self.temperature} is too small to sample with; use 0 (greedy) or at least {MIN_TEMPERATURE}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for n samples of which c are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_ks(n: int) -> list[int]:
    """k = 1, the powers of two below n, and n: pass_ks(8) == [1, 2, 4, 8], pass_ks(5) == [1, 2, 4, 5]."""
    return sorted({1, n} | {2**i for i in range(n.bit_length()) if 2**i < n})


def is_math_task(task: Task) -> bool:
    """Math when the source names a math benchmark (gsm8k, math, aime, amc) or the answer is a number."""
    if any(m in task.source.lower() for m in MATH_SOURCE_MARKERS):
        return True
    return isinstance(task.answer, (int, float)) and not isinstance(task.answer, bool)


def final_answer(traj: Trajectory) -> str | None:
    """The answer the completion gives (see the module docstring), or None."""
    tagged = extract_answer(traj.text)
    if is_math_task(traj.task):
        return tagged if tagged is not None else extract_boxed(traj.text)
    if traj.task.meta.get("answer_format") == "plain":
        return traj.text.strip() or None
    return tagged


def score_trajectory(traj: Trajectory, primary: str) -> dict[str, float]:
    """One sample's metrics: em and f1 (QA), accuracy, correct, answered, tool_calls, invalid_actions."""
    task, pred = traj.task, final_answer(traj)
    by_reward = float(traj.reward_parts.get(primary, traj.reward) >= 0.5)
    out = {"accuracy": by_reward, "correct": by_reward}
    if is_math_task(task):
        if task.answer is not None:
            tagged = extract_answer(traj.text)  # an <answer> tag is the answer; else math_accuracy's own extraction
            out["accuracy"] = out["correct"] = math_accuracy(traj.text if tagged is None else f"\\boxed{{{tagged}}}", task)
    else:
        try:  # a rubric task (rewards/judge.py) has no gold aliases either: the judge's reward decides
            golds = None if has_rubric(task) else gold_list(task.answer)
        except (TypeError, ValueError):  # no gold aliases: keep the primary-reward rule
            golds = None
        if golds is not None:
            out["em"] = out["correct"] = 0.0 if pred is None else exact_match(pred, golds)
            out["f1"] = 0.0 if pred is None else f1_score(pred, golds)
    out["answered"] = float(traj.finish_reason == "answered" if "turns" in traj.metrics else pred is not None)
    out["tool_calls"] = float(traj.metrics.get("tool_calls", 0.0))
    if "invalid_actions" in traj.metrics:
        out["invalid_actions"] = float(traj.metrics["invalid_actions"])
    if "turns" in traj.metrics:  # the tool workflow: every turn a well-formed call or the answer
        out["well_formed"] = float(out["answered"] == 1.0 and traj.metrics.get("invalid_actions", 0.0) == 0.0)
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _scope_metrics(gs: list[TrajectoryGroup], scores: dict[int, dict[str, float]], p: str) -> dict[str, float]:
    trajs = [t for g in gs for t in g.trajectories]
    per = [scores[id(t)] for t in trajs]
    out: dict[str, float] = {f"{p}count": len(gs)}
    out[f"{p}reward"] = _mean([t.reward for t in trajs])
    out[f"{p}accuracy"] = _mean([s["accuracy"] for s in per])
    for key in ("em", "f1", "invalid_actions", "well_formed"):
        vals = [s[key] for s in per if key in s]
        if vals:
            out[f"{p}{key}"] = _mean(vals)
    out[f"{p}tool_calls"] = _mean([s["tool_calls"] for s in per])
    out[f"{p}answer_rate"] = _mean([s["answered"] for s in per])
    out[f"{p}response_len"] = _mean([len(t.completion_ids) for t in trajs])
    for k in pass_ks(min(len(g.trajectories) for g in gs)):
        out[f"{p}pass@{k}"] = _mean(
            [pass_at_k(len(g.trajectories), int(sum(scores[id(t)]["correct"] for t in g.trajectories)), k) for g in gs]
        )
    for part in sorted({q for t in trajs for q in t.reward_parts}):
        out[f"{p}{part}"] = _mean([t.reward_parts.get(part, 0.0) for t in trajs])
    return out


def summarize(groups: list[TrajectoryGroup], primary: str, prefix: str = "eval",
              scores: dict[int, dict[str, float]] | None = None) -> dict[str, float]:
    """Metrics over evaluated groups: overall, per source (when several) and per task kind.
    `scores` (id(trajectory) -> `score_trajectory`) when the caller has them already."""
    groups = [g for g in groups if g.trajectories]
    if scores is None:
        scores = {id(t): score_trajectory(t, primary) for g in groups for t in g.trajectories}
    by_source: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    by_kind: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    for g in groups:
        by_source[g.task.source].append(g)
        if isinstance(g.task.meta.get("kind"), str):
            by_kind[g.task.meta["kind"]].append(g)
    scopes = [("", groups)] if groups else []
    if len(by_source) > 1:
        scopes += [(f"{s}/", gs) for s, gs in sorted(by_source.items())]
    scopes += [(f"{k}/", gs) for k, gs in sorted(by_kind.items())]
    out: dict[str, float] = {}
    for scope, gs in scopes:
        out.update(_scope_metrics(gs, scores, f"{prefix}/{scope}"))
    return out


_COLUMNS = [("count", "count"), ("reward", "reward"), ("em", "EM"), ("f1", "F1"), ("accuracy", "accuracy")]
_TAIL_COLUMNS = [("tool_calls", "tool calls"), ("answer_rate", "answer rate"), ("well_formed", "well-formed")]


def eval_table_markdown(metrics: dict[str, float], prefix: str = "eval") -> str:
    """A markdown table of `summarize`'s metrics: one row per scope (all, each source, each kind)."""
    scopes = [k[len(prefix) + 1 : -len("count")].rstrip("/") for k in metrics if k.startswith(f"{prefix}/") and k.endswith("/count")]

    def key(scope: str, metric: str) -> str:
        return f"{prefix}/{scope}/{metric}" if scope else f"{prefix}/{metric}"

    ks = sorted({int(m.group(1)) for k in metrics if (m := re.fullmatch(rf"{re.escape(prefix)}/pass@(\d+)", k))})
    columns = _COLUMNS + [(f"pass@{k}", f"pass@{k}") for k in ks] + _TAIL_COLUMNS
    columns = [(m, name) for m, name in columns if any(key(s, m) in metrics for s in scopes)]
    lines = ["| scope | " + " | ".join(name for _, name in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for s in scopes:
        cells = []
        for m, _ in columns:
            v = metrics.get(key(s, m))
            cells.append("-" if v is None else str(int(v)) if m == "count" else f"{v:.3f}")
        lines.append(f"| {s or 'all'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_eval(metrics: dict[str, float], folder: str | Path, prefix: str = "eval") -> tuple[Path, Path]:
    """Write `eval.json` (every metric) and `eval.md` (the table) into `folder`; return both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "eval.json", folder / "eval.md"
    json_path.write_text(json.dumps(metrics, indent=2))
    md_path.write_text(eval_table_markdown(metrics, prefix))
    return json_path, md_path


async def evaluate(workflow: Workflow, engine: InferenceEngine, tasks: list[Task], n: int, params: SamplingParams, primary: str,
                   progress: bool = False, max_in_flight: int | None = None) -> tuple[dict, list[TrajectoryGroup]]:
    """Run `n` samples per task with the training workflow; return (`summarize`'s metrics, the groups,
    each trajectory's `score_trajectory` added to its metrics as `score/<name>`)."""
    from tqdm import tqdm

    counters = getattr(workflow, "metrics", None)  # the workflow's run-level counters (tools/<name>/<counter>)
    before = counters() if counters is not None else {}
    with tqdm(total=len(tasks), desc="eval", unit="task", disable=not progress) as bar:
        groups = await collect(workflow, engine, tasks, n, params, progress=bar, max_in_flight=max_in_flight)
    # An infrastructure failure (engine, tool server, judge) says nothing of the model: left out of
    # the scores (not counted wrong), counted by status.
    kept = [TrajectoryGroup(g.task, [t for t in g.trajectories if t.status == "ok"]) for g in groups]
    excluded = Counter(t.status for g in groups for t in g.trajectories if t.status != "ok")
    scores = {id(t): score_trajectory(t, primary) for g in kept for t in g.trajectories}
    for g in kept:  # each sample's own scores in its metrics (its record; paired comparisons of two evals)
        for t in g.trajectories:
            t.metrics.update({f"score/{k}": v for k, v in scores[id(t)].items()})
    metrics = summarize(kept, primary, scores=scores)
    metrics.update({f"eval/excluded/{s}": float(c) for s, c in sorted(excluded.items())})
    metrics["eval/excluded_frac"] = sum(excluded.values()) / max(1, sum(len(g.trajectories) for g in groups))
    if counters is not None:  # what this eval added (an eval during RL shares the training workflow's counters)
        metrics.update({f"eval/{k}": v - before.get(k, 0.0) for k, v in counters().items()})
    return metrics, groups


def pass_counts(groups: list[TrajectoryGroup]) -> list[tuple[Task, int, int]]:
    """Per task of `evaluate`'s groups: (task, samples that ran (status ok), samples correct by
    `score_trajectory`), the n and c of pass@k; `seekrl curriculum` keeps 0 < c < n."""
    out = []
    for g in groups:
        ok = [t for t in g.trajectories if t.status == "ok"]
        out.append((g.task, len(ok), int(sum(t.metrics["score/correct"] for t in ok))))
    return out


@dataclass
class EvalRun:
    """What `seekrl eval` runs on, assembled by seekrl.build.build_eval: no optimizer, no critic."""

    run_dir: Path  # runs/<name>/eval/
    tasks: list[Task]
    workflow: Workflow
    engine: InferenceEngine
    tokenizer: Any
    n: int  # samples per task (eval.n)
    params: SamplingParams  # eval.temperature, seeded by stable_seed(train.seed, "eval")
    primary_reward: str
    progress: bool
    max_in_flight: int | None = None  # episodes at once (build.eval_in_flight); None: every task at once

    def close(self) -> None:
        self.workflow.close()
        self.engine.close()


def run(ev: EvalRun) -> dict[str, float]:
    """`seekrl eval`: evaluate with the training workflow; write eval.json, eval.md and
    trajectories.jsonl (every sample, to read the failures) into the run's eval/ folder, print the
    markdown table and return the metrics."""
    import asyncio
    import sys

    from seekrl.observe.samples import write_trajectories

    metrics, groups = asyncio.run(evaluate(ev.workflow, ev.engine, ev.tasks, ev.n, ev.params, ev.primary_reward,
                                           progress=ev.progress, max_in_flight=ev.max_in_flight))
    peak = peak_resident_gib()  # what an eval beside other runs needs (BENCHMARKS.md, "the in-process eval's memory")
    if peak is not None:
        metrics["memory/peak_rss_gib"] = peak
    json_path, md_path = write_eval(metrics, ev.run_dir)
    samples = ev.run_dir / "trajectories.jsonl"
    write_trajectories(samples, groups, ev.tokenizer)
    print(eval_table_markdown(metrics), end="")
    print(f"wrote {json_path}, {md_path} and {samples}", file=sys.stderr)
    return metrics
