"""What a reward is, and what a workflow scores its episodes with.

A reward function reads the completion and the task's ground truth, never the prompt:

    fn(completion: str, task: Task, **ctx) -> float | RewardResult      (sync, or async)

`ctx` holds what the rollout knows about the sample: `num_tokens` (sampled length),
`max_tokens` (the budget), `finish_reason`, and from the tool agent `turns` (one `TurnContext`
per engine call: the turn's sampled text, the tools it called with what they returned, and the
observation inserted after it as the policy read it, `shown`); a
function ignores the keys it does not use. A `RewardResult` carries named parts next to its
total (search_r1's em / valid_format / retrieved_gold), logged as `reward/<name>/<part>`.

Per-turn rewards: a function may also return `RewardResult(total, turn_rewards=[r_0, ...])`,
one value per turn of `ctx["turns"]` (e.g. `retrieved_gold_turn`: 1 on the first search turn
whose results hold a gold answer). The Rubric weighs them like the totals and stores their sum
per turn on the Trajectory (`turn_rewards`); `algo.turn_advantage` turns them into per-turn
advantages (algo/advantages.py `turn_advantages`). By convention `total` is their sum (the
episode's return), so the outcome reward counts them once. A function that gives them sets the
attribute `per_turn = True`, which lets a run with `algo.turn_advantage` check its rubric before
the model loads.

A reward that depends on a service (the LLM `judge`, rewards/judge.py) raises
`RewardUnavailable` when the service cannot answer; the Rubric then returns a result with
`unavailable` set (the reason) instead of raising, and the workflow gives the trajectory the
status `reward_unavailable`: an infrastructure failure, left out of the update and counted
(`rollout/excluded/reward_unavailable`), never scored 0. Workflows pass the trajectory's
`status` in `ctx`, so a paid reward can skip trajectories that are left out anyway.

A `Scorer` is what workflows call: `Rubric` (rewards/rubric.py, weighted reward functions by
name) is the one seekrl ships; anything with the same two methods and `names` can stand in for it
(an LLM judge, a reward model).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from seekrl.types import Task

__all__ = ["RewardResult", "RewardFn", "Scorer", "TurnContext"]


@dataclass
class RewardResult:
    """A reward with its named parts (unweighted), and optionally one reward per turn."""

    total: float
    parts: dict[str, float] = field(default_factory=dict)
    turn_rewards: list[float] | None = None  # one per turn of ctx["turns"] (module docstring)
    unavailable: str | None = None  # why a reward's service (a judge) could not score it; total is then 0.0 and meaningless


@dataclass(frozen=True)
class TurnContext:
    """One engine call of an episode, as a reward function sees it (`ctx["turns"]`)."""

    text: str  # the turn's sampled text (decoded, special tokens skipped)
    tools: tuple[str, ...] = ()  # the tools it called, in order (none for an answer or a malformed turn)
    outputs: tuple[str, ...] = ()  # what each of those calls returned (the tool's text, before any truncation)
    shown: str | None = None  # the observation inserted after the turn as the policy read it (decoded, cut to
    #                           max_obs_tokens); None where the workflow does not say


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
