"""Shaping rewards: format, tag count, reasoning steps, cosine length, repetition, overlong.

The first five follow open-r1's `rewards.py` (DeepSeek-R1 recipe; cosine and repetition from
"Demystifying Long Chain-of-Thought Reasoning in LLMs", arXiv 2502.03373); the overlong
penalty is DAPO's soft overlong punishment (arXiv 2503.14476). Each is a plain reward function
`fn(completion, task, **ctx) -> float`; the configurable ones come from `make_*` factories.

Departures from open-r1, each deliberate:
- `format_reward` allows any whitespace around and between the blocks (open-r1 requires exact
  newlines); `tag_count_reward` likewise counts each tag appearing exactly once, newlines or not.
- `reasoning_steps_reward` matches numbered lists at the start of every line (open-r1's `^\\d+\\.`
  has no MULTILINE flag, so it only ever matched at the start of the text).
- cosine length is measured in tokens (`ctx["num_tokens"]`), not characters; without it we
  estimate len(completion) / 4 tokens. Lengths past `max_len` are clipped to `max_len` (open-r1
  lets the cosine swing back up). Defaults put wrong answers in [-0.5, 0.0].
- the overlong penalty needs `ctx["num_tokens"]` and raises without it; `max_tokens` defaults to
  the rollout's budget `ctx["max_tokens"]` and `buffer` to a fifth of it (DAPO: 4096 of 20480).

    from seekrl.rewards.shaping import make_soft_overlong_reward
    overlong = make_soft_overlong_reward(max_tokens=1024, buffer=256)
    overlong("...", task, num_tokens=900)  # -(900 - 768) / 256 = -0.515625
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from seekrl.rewards.math import extract_boxed, math_accuracy
from seekrl.types import Task

__all__ = ["format_reward", "make_format_reward", "tag_count_reward", "make_tag_count_reward", "boxed_reward",
           "reasoning_steps_reward", "completion_length", "make_cosine_length_reward", "make_repetition_penalty_reward",
           "make_soft_overlong_reward"]


def make_format_reward(think_tag: str = "think", answer_tag: str = "answer") -> Callable[..., float]:
    """1.0 if the whole completion is `<think>...</think>` then `<answer>...</answer>`, else 0.0."""
    th, an = re.escape(think_tag), re.escape(answer_tag)
    pattern = re.compile(rf"\s*<{th}>.*?</{th}>\s*<{an}>.*?</{an}>\s*", re.DOTALL)

    def format_reward(completion: str, task: Task, **ctx: Any) -> float:
        return 1.0 if pattern.fullmatch(completion) else 0.0

    return format_reward


def make_tag_count_reward(think_tag: str = "think", answer_tag: str = "answer") -> Callable[..., float]:
    """0.25 for each of the four tags `<think> </think> <answer> </answer>` that appears exactly once."""
    tags = [f"<{think_tag}>", f"</{think_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]

    def tag_count_reward(completion: str, task: Task, **ctx: Any) -> float:
        return 0.25 * sum(completion.count(t) == 1 for t in tags)

    return tag_count_reward


format_reward = make_format_reward()
tag_count_reward = make_tag_count_reward()

# "Step 1:", "1." at a line start, "- " / "* " bullets, and transition words.
_STEP_RE = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)", re.MULTILINE)


def boxed_reward(completion: str, task: Task, **ctx: Any) -> float:
    """1.0 if the completion puts a non-empty final answer in \\boxed{...}, else 0.0 (format only)."""
    answer = extract_boxed(completion)
    return 1.0 if answer is not None and answer.strip() else 0.0


def reasoning_steps_reward(completion: str, task: Task, **ctx: Any) -> float:
    """min(1, steps / 3): rewards visible step-by-step reasoning, full marks from 3 steps."""
    return min(1.0, len(_STEP_RE.findall(completion)) / 3)


def completion_length(completion: str, ctx: dict) -> float:
    """Completion length in tokens: `ctx["num_tokens"]`, else the estimate len(chars) / 4."""
    n = ctx.get("num_tokens")
    return float(n) if n is not None else len(completion) / 4


def make_cosine_length_reward(
    min_value_wrong: float = -0.5,
    max_value_wrong: float = 0.0,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    max_len: int = 1000,
    correct_fn: Callable[..., Any] = math_accuracy,
) -> Callable[..., float]:
    """Correctness scaled by length on a half cosine (arXiv 2502.03373, open-r1).

    Correct answers get max_value_correct at length 0 falling to min_value_correct at max_len
    (shorter is better); wrong answers get min_value_wrong at length 0 rising to max_value_wrong
    at max_len (a long wrong attempt is penalised less than a short guess). `correct_fn` is a
    sync reward function; a score >= 0.5 counts as correct.
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")

    def cosine_length_reward(completion: str, task: Task, **ctx: Any) -> float:
        score = correct_fn(completion, task, **ctx)
        score = getattr(score, "total", score)  # a RewardResult counts by its total
        progress = min(1.0, completion_length(completion, ctx) / max_len)
        cosine = math.cos(progress * math.pi)  # 1 at length 0, -1 at max_len
        if score >= 0.5:
            lo, hi = min_value_correct, max_value_correct
        else:  # swapped: short wrong answers get the lowest value
            lo, hi = max_value_wrong, min_value_wrong
        return lo + 0.5 * (hi - lo) * (1.0 + cosine)

    return cosine_length_reward


def make_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable[..., float]:
    """max_penalty × (1 − unique n-grams / n-grams) over lower-cased whitespace words (open-r1).

    0 for completions shorter than one n-gram.
    """
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    if ngram_size < 1:
        raise ValueError(f"ngram_size must be >= 1, got {ngram_size}")

    def repetition_penalty_reward(completion: str, task: Task, **ctx: Any) -> float:
        words = completion.lower().split()
        if len(words) < ngram_size:
            return 0.0
        ngrams = list(zip(*(words[i:] for i in range(ngram_size))))
        return (1.0 - len(set(ngrams)) / len(ngrams)) * max_penalty

    return repetition_penalty_reward


def make_soft_overlong_reward(max_tokens: int | None = None, buffer: int | None = None) -> Callable[..., float]:
    """DAPO soft overlong punishment on the sampled length L = ctx["num_tokens"]:

        0                                    if L <= max_tokens - buffer
        -(L - (max_tokens - buffer)) / buffer  if max_tokens - buffer < L <= max_tokens
        -1                                   if L > max_tokens

    `max_tokens=None` reads the rollout's budget from ctx["max_tokens"]; `buffer=None` is
    max_tokens // 5.
    """
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if buffer is not None and (buffer < 0 or (max_tokens is not None and buffer > max_tokens)):
        raise ValueError(f"buffer must be in [0, max_tokens], got buffer={buffer}, max_tokens={max_tokens}")

    def soft_overlong_reward(completion: str, task: Task, **ctx: Any) -> float:
        if ctx.get("num_tokens") is None:
            raise ValueError("the overlong reward needs ctx num_tokens (the sampled completion length)")
        budget = max_tokens if max_tokens is not None else ctx.get("max_tokens")
        if budget is None:
            raise ValueError("the overlong reward needs max_tokens, as a parameter or in ctx")
        buf = buffer if buffer is not None else budget // 5
        if buf > budget:
            raise ValueError(f"overlong buffer {buf} exceeds max_tokens {budget}")
        length = ctx["num_tokens"]
        if length > budget:
            return -1.0
        start = budget - buf
        if length <= start:
            return 0.0
        return -(length - start) / buf

    return soft_overlong_reward
