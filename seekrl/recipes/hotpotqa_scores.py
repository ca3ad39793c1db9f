"""How the HotpotQA recipe scores its evals (seekrl/recipes/hotpotqa.py, stage 9): the paired
bootstrap of a gain (seekrl/compare.py's, the one `seekrl compare` runs), EM by question type,
the questions with two possible answers against chance, and which search retrieved the
paragraphs a question needs. Pure functions of the split's
rows and the evals' trajectories (`<eval>/trajectories.jsonl`), so they can be run on any eval.
"""

from __future__ import annotations

import re
import typing

from seekrl.compare import paired_bootstrap
from seekrl.config import QuestionKind

__all__ = ["QUESTION_KINDS", "paired_bootstrap", "question_types", "em_by_type", "answer_options", "two_way_guesses", "search_support",
           "eval_answers"]

QUESTION_KINDS: tuple[str, ...] = typing.get_args(QuestionKind)  # the forms answer_options sorts into (demo.ptx_kinds' choices)
"""The kinds `answer_options` sorts a question into."""


def question_types(rows: list[dict]) -> dict[str, str]:
    """`_id` -> HotpotQA's question `type` (bridge | comparison) of a split's rows."""
    return {str(r["_id"]): str(r.get("type") or "unknown") for r in rows}


def em_by_type(scores: dict[str, float], kinds: dict[str, str]) -> dict[str, dict]:
    """{type: {"em", "n"}} over the questions of `scores` (task id -> EM)."""
    out: dict[str, list[float]] = {}
    for task_id, em in scores.items():
        out.setdefault(kinds.get(task_id, "unknown"), []).append(em)
    return {k: {"em": sum(v) / len(v), "n": len(v)} for k, v in sorted(out.items())}


def answer_options(row: dict) -> tuple[str, tuple[str, str] | None, int | None]:
    """A question's kind, its two possible answers (normalised) and which of them is the gold one:
    ("yes/no", ("yes", "no"), 0 | 1) for a yes/no gold; ("either-or", (first, second), 0 | 1) for an
    "X or Y?" question whose gold names exactly one option (the first option runs from the last
    comma or colon before the last " or "); ("open", None, None) otherwise."""
    from seekrl.rewards.qa import gold_list, normalize_answer

    gold = normalize_answer(gold_list(row.get("answer"))[0])
    if gold in ("yes", "no"):
        return "yes/no", ("yes", "no"), int(gold == "no")
    head, sep, tail = str(row.get("question", "")).rstrip(" ?").rpartition(" or ")
    options = (normalize_answer(re.split(r"[,:]", head)[-1]), normalize_answer(tail))
    where = [bool(gold) and gold in o for o in options]
    if not sep or sum(where) != 1:
        return "open", None, None
    return "either-or", options, where.index(True)


def two_way_guesses(rows: list[dict], predictions: dict[str, str | None], scores: dict[str, float]) -> dict[str, dict]:
    """How a model answers the questions that have two possible answers (`answer_options`),
    against chance: yes/no questions: n, EM, the share answered "yes" and the share whose gold is
    yes; either-or questions: n, EM, the share of answers naming the first option (of those naming
    exactly one) and the share whose gold is the first; for both, the share of questions whose
    answer names exactly one of the two ("named one": an answer naming neither is wrong whatever
    the evidence said, a habit GRPO can unlearn); and the EM on every other question
    ("open": the answer must be read, not picked). A policy that cannot read sits near chance on
    the first two and GRPO moves these shares, not the EM (RESULTS.md). Rows not in `scores` are
    left out."""
    from seekrl.rewards.qa import normalize_answer

    rows = [r for r in rows if str(r["_id"]) in scores]
    options = {str(r["_id"]): answer_options(r) for r in rows}
    by_kind = em_by_type(scores, {i: kind for i, (kind, _, _) in options.items()})
    out: dict[str, dict] = {"open": by_kind.get("open", {"em": None, "n": 0})}
    for kind, share, gold_share in (("yes/no", "answered yes", "gold yes"), ("either-or", "picked first", "gold first")):
        golds, picks = [], []
        for task_id, (k, two, gold) in options.items():
            if k != kind:
                continue
            golds.append(gold == 0)
            pred = normalize_answer(predictions.get(task_id) or "")
            named = [pred == o if kind == "yes/no" else bool(pred) and pred in o for o in two]
            if sum(named) == 1:
                picks.append(named[0])
        em = by_kind.get(kind, {"em": None, "n": 0})
        out[kind] = {"n": em["n"], "em": em["em"], share: sum(picks) / len(picks) if picks else None,
                     gold_share: sum(golds) / len(golds) if golds else None, "named one": len(picks) / len(golds) if golds else None}
    return {k: out[k] for k in QUESTION_KINDS}


def search_support(rows: list[dict], episodes: list[dict]) -> dict:
    """Which search of each eval episode retrieved the paragraphs its question needs (HotpotQA's
    `supporting_facts`, or `supporting_titles` where those are null: `hotpotqa_gold_titles`;
    questions without either are left out): the share of episodes that
    retrieved them all, and of the episodes that searched more than once, how many had a later
    search bring a needed paragraph the first had not, with the EM of those and of the rest. A
    second search pays only there; a reward spread between one and two searches elsewhere
    teaches the policy to stop searching (RESULTS.md)."""
    from seekrl.data.corpus import hotpotqa_gold_titles
    from seekrl.data.teacher import names_title

    gold = {str(r["_id"]): hotpotqa_gold_titles(r) for r in rows}
    n = all_found = 0
    again: dict[bool, list[float]] = {True: [], False: []}  # a later search brought a needed paragraph -> EMs
    for ep in episodes:
        titles = gold.get(str(ep["task_id"]))
        if not titles:
            continue
        blocks = re.findall(r"<information>(.*?)</information>", str(ep.get("completion", "")), re.DOTALL)
        first = [next((i for i, b in enumerate(blocks) if names_title(b, t)), None) for t in titles]
        n += 1
        all_found += None not in first
        if len(blocks) > 1:
            again[any(i is not None and i > 0 for i in first)].append(float(ep["metrics"].get("score/em", 0.0)))
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"episodes": n, "all_retrieved": all_found / n if n else None,
            "searched_again": len(again[True]) + len(again[False]), "later_search_new": len(again[True]),
            "em_later_new": mean(again[True]), "em_later_nothing_new": mean(again[False])}


def eval_answers(episodes: list[dict]) -> tuple[dict[str, float], dict[str, str | None]]:
    """An eval's per-question EM (`score/em`) and final answer (the last <answer>; None without one)."""
    from seekrl.rewards.qa import extract_answer

    scores, answers = {}, {}
    for rec in episodes:
        task_id = str(rec["task_id"])
        scores[task_id] = float(rec["metrics"].get("score/em", 0.0))
        answers[task_id] = extract_answer(str(rec.get("completion", "")))
    return scores, answers
