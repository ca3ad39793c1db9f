"""What a reward is, and what a workflow scores its episodes with.

A reward function reads the completion and the task's ground truth, never the prompt:

    fn(completion: str, task: Task, **ctx) -> float | RewardResult      (sync, or async)

`ctx` holds what the rollout knows about the sample: `num_tokens` (sampled length),
`max_tokens` (the budget), `finish_reason`; a function ignores the keys it does not use. A
`RewardResult` carries named parts next to its total (search_r1's em / valid_format /
retrieved_gold), logged as `reward/<name>/<part>`.

A `Scorer` is what workflows call: `Rubric` (rewards/rubric.py, weighted reward functions by
name) is the one seekrl ships; anything with the same two methods and `names` can stand in for it
(an LLM judge, a reward model).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from seekrl.types import Task

__all__ = ["RewardResult", "RewardFn", "Scorer"]


@dataclass
class RewardResult:
    """A reward with its named parts (unweighted)."""

    total: float
    parts: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class RewardFn(Protocol):
    """A reward function (module docstring)."""

    def __call__(self, completion: str, task: Task, **ctx: Any) -> float | RewardResult | Awaitable[float | RewardResult]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores completions of tasks: every part unweighted, by name, and the total."""

    names: list[str]  # the parts it reports, the first being the primary reward (evaluation's accuracy rule)

    async def score(self, completion: str, task: Task, **ctx: Any) -> RewardResult: ...

    async def score_many(self, items: Iterable[tuple]) -> list[RewardResult]: ...
