"""Reward functions: `fn(completion, task, **ctx) -> float | RewardResult`, sync or async.

math.py (math-verify equivalence, GSM8K numbers), qa.py (EM / F1 / substring over aliases),
shaping.py (format, tag count, reasoning steps, cosine length, repetition, overlong) and
rubric.py (the name registry and the weighted `Rubric`), judge.py (an LLM judge over an
OpenAI-compatible endpoint, and rubric items; judge_client.py its HTTP, retries and cache).
base.py holds the contract (`RewardFn`, `RewardResult`, and `Scorer`, what workflows score with).
"""

from seekrl.rewards.base import RewardFn, RewardResult, Scorer, TurnContext
from seekrl.rewards.judge import make_judge_reward, rubric_items
from seekrl.rewards.math import extract_boxed, gsm8k_accuracy, gsm8k_answer, math_accuracy
from seekrl.rewards.qa import (
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
    qa_em,
    qa_f1,
    subem,
    substring_match,
)
from seekrl.rewards.rubric import (
    REWARD_FACTORIES,
    REWARD_FUNCTIONS,
    Rubric,
    register_reward,
    resolve_reward,
)
from seekrl.rewards.shaping import (
    format_reward,
    make_cosine_length_reward,
    make_format_reward,
    make_repetition_penalty_reward,
    make_soft_overlong_reward,
    make_tag_count_reward,
    reasoning_steps_reward,
    tag_count_reward,
)

__all__ = [
    "REWARD_FACTORIES",
    "REWARD_FUNCTIONS",
    "RewardFn",
    "RewardResult",
    "Rubric",
    "Scorer",
    "TurnContext",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "f1_score",
    "format_reward",
    "gsm8k_accuracy",
    "gsm8k_answer",
    "make_cosine_length_reward",
    "make_format_reward",
    "make_judge_reward",
    "make_repetition_penalty_reward",
    "make_soft_overlong_reward",
    "make_tag_count_reward",
    "math_accuracy",
    "normalize_answer",
    "qa_em",
    "qa_f1",
    "reasoning_steps_reward",
    "register_reward",
    "resolve_reward",
    "rubric_items",
    "subem",
    "substring_match",
    "tag_count_reward",
]
