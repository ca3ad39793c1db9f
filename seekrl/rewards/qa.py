"""Question-answering rewards: exact match, token F1 and substring match over answer aliases.

Normalisation is SQuAD's (lower-case, drop punctuation, drop the articles a/an/the, squeeze
whitespace); scores take the max over the gold aliases. Gold answers may be a string, a list
of aliases, or Search-R1's ground-truth dict `{"target": [...]}`.

The reward functions read the answer from the LAST `<answer>...</answer>` in the completion
(Search-R1's format) and score 0 when there is none. Departures from Search-R1: the
completion holds only generated text, so there is no "skip the example tag in the prompt"
rule (Search-R1 required two or more tags because its string included the prompt);
`answer_format: "plain"` in `task.meta` scores the whole completion instead; `subem` ignores
gold aliases that normalise to the empty string (they would match every prediction).

    from seekrl.rewards.qa import qa_em
    qa_em("<answer>The Eiffel Tower</answer>", Task("t", [], answer=["eiffel tower"]))  # 1.0
"""

from __future__ import annotations

import functools
import numbers
import re
import string
from collections import Counter
from collections.abc import Iterable
from typing import Any

from seekrl.types import Task

__all__ = ["qa_em", "qa_f1", "subem", "exact_match", "f1_score", "substring_match", "extract_answer", "normalize_answer",
           "gold_list"]

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower, remove punctuation, remove articles, squeeze whitespace."""
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def gold_list(golds: Any) -> list[str]:
    """Gold aliases as a list of strings: from a str, a number, a list/tuple/array, or `{"target": [...]}`."""
    if isinstance(golds, dict):
        if "target" not in golds:
            raise ValueError(f"gold answer dict needs a 'target' key (Search-R1 format), got keys {sorted(golds)}")
        golds = golds["target"]
    if isinstance(golds, (str, bytes, numbers.Number)):
        return [golds.decode() if isinstance(golds, bytes) else str(golds)]
    if isinstance(golds, Iterable):  # list, tuple, numpy array (parquet rows)
        return [str(g) for g in golds]
    raise TypeError(f"cannot read gold answers from {type(golds).__name__}: {golds!r}")


def exact_match(pred: str, golds: Any) -> float:
    """1.0 if the normalised prediction equals any normalised gold alias."""
    p = normalize_answer(pred)
    return 1.0 if any(p == normalize_answer(g) for g in gold_list(golds)) else 0.0


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # SQuAD v2: both empty counts as a match
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str, golds: Any) -> float:
    """SQuAD token F1 between the normalised prediction and the best gold alias."""
    p = normalize_answer(pred).split()
    return max((_f1(p, normalize_answer(g).split()) for g in gold_list(golds)), default=0.0)


def substring_match(pred: str, golds: Any) -> float:
    """1.0 if any normalised gold alias is a substring of the normalised prediction (Search-R1 subem_check)."""
    p = normalize_answer(pred)
    return 1.0 if any(g and g in p for g in map(normalize_answer, gold_list(golds))) else 0.0


@functools.lru_cache(maxsize=1)
def _feedback_texts() -> tuple[str, ...]:
    """The invalid-action notices the tool loop inserts. They spell out the tags ("put the
    answer between <answer> and </answer>"), and they are not the model's words."""
    from seekrl.tools.parsers import FORMATS

    return tuple(cls.invalid_text.strip() for cls in FORMATS.values())


def extract_answer(completion: str, tag: str = "answer") -> str | None:
    """Stripped content of the LAST `<tag>...</tag>` in the completion, or None. The tool loop's
    invalid-action notices are skipped: their "<answer> and </answer>" is no answer."""
    for notice in _feedback_texts():
        completion = completion.replace(notice, " ")
    t = re.escape(tag)
    matches = re.findall(rf"<{t}>(.*?)</{t}>", completion, re.DOTALL)
    return matches[-1].strip() if matches else None


def _prediction(completion: str, task: Task) -> str | None:
    if task.meta.get("answer_format") == "plain":
        return completion.strip()
    return extract_answer(completion)


def qa_em(completion: str, task: Task, **ctx: Any) -> float:
    """Exact match of the last `<answer>` against `task.answer` aliases; 0 without an answer tag."""
    pred = _prediction(completion, task)
    return 0.0 if pred is None else exact_match(pred, task.answer)


def qa_f1(completion: str, task: Task, **ctx: Any) -> float:
    """Token F1 of the last `<answer>` against `task.answer` aliases; 0 without an answer tag."""
    pred = _prediction(completion, task)
    return 0.0 if pred is None else f1_score(pred, task.answer)


def subem(completion: str, task: Task, **ctx: Any) -> float:
    """Substring exact match of the last `<answer>` against `task.answer` aliases; 0 without an answer tag."""
    pred = _prediction(completion, task)
    return 0.0 if pred is None else substring_match(pred, task.answer)
