"""Math answer rewards: symbolic equivalence with math-verify, and a cheap GSM8K number check.

`math_accuracy` parses the gold answer (`task.answer`: a string, a number, or a list of
aliases) and the completion's final answer with `math_verify` and returns 1.0 when they are
equivalent (1/2 == 0.5 == \\frac{1}{2}), else 0.0. The prediction is the content of the last
`\\boxed{...}` when there is one, else whatever math-verify extracts from the whole completion
(it prefers "final answer is ..." anchors, then the rightmost expression or number).

Timeouts: math-verify guards sympy with `signal.alarm`, which raises outside the main thread.
We pass its timeout only when running on the main thread (asyncio on the main thread is fine)
and `None` elsewhere, so the functions are safe from worker threads; there a pathological
expression can run long, so the prediction is also capped at `MAX_PRED_CHARS`.

`gsm8k_accuracy` needs no sympy: it compares the completion's final number (after `####`,
after "answer is", in the last `\\boxed{}`, else the last number) with the gold number.

    from seekrl.rewards.math import math_accuracy
    math_accuracy("so x = \\\\boxed{\\\\frac{1}{2}}", Task("t", [], answer="0.5"))  # 1.0
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from seekrl.types import Task

__all__ = ["math_accuracy", "gsm8k_accuracy", "extract_boxed", "gsm8k_answer", "extract_final_number", "parse_gold",
           "parse_prediction", "MATH_TIMEOUT_S", "MAX_PRED_CHARS"]

MATH_TIMEOUT_S = 5  # math-verify's per-call timeout, used on the main thread only
MAX_PRED_CHARS = 2000  # a \boxed{} answer longer than this is not an answer; scores 0

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


@functools.cache
def _math_verify():
    # Imported lazily: math_verify pulls in sympy and the LaTeX parser (~0.5 s). One symbolic
    # comparison here pays sympy's own first-use cost (0.1-0.8 s alone, past the 5 s timeout on a
    # loaded CPU), so it does not count against the first timed call and mark a right answer
    # wrong; it is bounded at 60 s where the calls are timed (no hang), unbounded where they are not.
    import math_verify

    bound = None if _timeout() is None else 60
    math_verify.verify(math_verify.parse("$1+x^2$", parsing_timeout=bound), math_verify.parse("$x^2+1$", parsing_timeout=bound),
                       timeout_seconds=bound)
    return math_verify


def _timeout() -> int | None:
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, else None.

    >>> extract_boxed("a \\\\boxed{1} b \\\\boxed{\\\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
        # unbalanced (truncated) box: try the one before it
    return None


def gsm8k_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after the last `####`, without commas or spaces.

    A bare number ("1,234") is accepted as well; anything else without `####` is an error.
    """
    text = str(solution)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    ans = re.sub(r"[,\s]", "", text)
    if "####" not in str(solution) and not re.fullmatch(r"[-+]?\$?\d*\.?\d+", ans):
        raise ValueError(f"no '####' final answer in GSM8K solution: {str(solution)[-80:]!r}")
    return ans


def _to_float(s: str) -> float | None:
    s = s.replace(",", "").replace("$", "").strip()
    try:
        return float(s)
    except ValueError:
        return None


def _last_number(text: str) -> str | None:
    nums = _NUMBER_RE.findall(text)
    return nums[-1] if nums else None


def extract_final_number(completion: str) -> float | None:
    """The number a completion gives as its answer, by the first rule that finds one:
    after the last `####`; after the last "answer is"; in the last `\\boxed{}`; the last number."""
    for marker in (r"####", r"answer is"):
        hits = list(re.finditer(marker, completion, re.IGNORECASE))
        if hits:
            num = _NUMBER_RE.search(completion, hits[-1].end())
            if num is not None:
                return _to_float(num.group())
    boxed = extract_boxed(completion)
    if boxed is not None:
        num = _last_number(boxed)
        if num is not None:
            return _to_float(num)
    num = _last_number(completion)
    return _to_float(num) if num is not None else None


def _gold_number(answer: Any) -> float:
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    value = _to_float(gsm8k_answer(str(answer)))
    if value is None:
        raise ValueError(f"GSM8K gold answer is not a number: {answer!r}")
    return value


def gsm8k_accuracy(completion: str, task: Task, **ctx: Any) -> float:
    """1.0 if the completion's final number equals the gold number (`task.answer`: a number,
    a numeric string, or a full GSM8K solution with `####`), else 0.0. No sympy."""
    gold = _gold_number(task.answer)
    pred = extract_final_number(completion)
    if pred is None:
        return 0.0
    return 1.0 if abs(pred - gold) <= 1e-6 * max(1.0, abs(gold)) else 0.0


def _golds(answer: Any) -> list[str]:
    if isinstance(answer, (list, tuple)):
        return [str(a) for a in answer]
    return [str(answer)]


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> tuple:
    """Parse one gold answer; plain LaTeX ("\\frac{1}{2}", "x^2+1") is read as math.

    Falls back to the raw string (compared verbatim by math-verify) when nothing parses."""
    mv = _math_verify()
    text = gold.strip()
    parsed: list = []
    if "$" not in text and "\\boxed" not in text:
        parsed = mv.parse(f"${text}$", parsing_timeout=_timeout())
    if not parsed:
        parsed = mv.parse(text, parsing_timeout=_timeout())
    return tuple(parsed) if parsed else (text,)


def parse_prediction(completion: str) -> list:
    """Parse the completion's answer: the last `\\boxed{}` if any, else math-verify's extraction."""
    mv = _math_verify()
    boxed = extract_boxed(completion)
    if boxed is not None:
        if len(boxed) > MAX_PRED_CHARS:
            return []
        return mv.parse(f"\\boxed{{{boxed}}}", parsing_timeout=_timeout())
    return mv.parse(completion, parsing_timeout=_timeout())


def math_accuracy(completion: str, task: Task, **ctx: Any) -> float:
    """1.0 if the completion's final answer is equivalent to any gold alias, else 0.0."""
    pred = parse_prediction(completion)
    if not pred:
        return 0.0
    verify = _math_verify().verify
    for gold in _golds(task.answer):
        if verify(list(parse_gold(gold)), pred, timeout_seconds=_timeout()):
            return 1.0
    return 0.0
