"""DAPO dynamic sampling with refill (`rollout.refill`): a sync step rolls out more tasks of the
data order until it has `tasks_per_step` groups with reward spread.

    groups, metrics = await refill(groups, draw=iterator.next_batch, roll=roll, max_rounds=4)

`algo.filter_zero_std` drops the groups whose rewards are all equal: they carry no GRPO signal,
so a step trains on fewer groups than it sampled. DAPO (Yu et al. 2025) keeps the batch size by
sampling more. Here, after the step's first batch is scored, while fewer than `need` (the first
batch's size) groups are informative and fewer than `max_rounds` refill rounds have run, round
r = 1, 2, ... draws the next batch of the data order (`draw`: the iterator's `next_batch`, so a
mixture keeps its weights and the checkpointed data position includes every task drawn) and
rolls it out (`roll(tasks, r)`; the sync rollout samples round r with the seed
`stable_seed(train.seed, "rollout", step, "refill", r)`; round 0 is the step's usual seed, so
a step whose first batch is informative enough is the step without refill, bit for bit).
A task the step already holds (`(source, id)`: a small data set's next epoch, a small mixture
source) is skipped, never rolled out twice in one step.

What the trainer gets is the draw order cut right after the `need`-th informative group: every
group up to there, informative or not (rl.py's `algo.filter_zero_std` then drops the
uninformative ones, and `reward/*`, `rollout/excluded/*` and the trajectory files see all of
them), and none after: the rest of the last round is rolled out but neither trained on nor
logged (`rollout/refill/surplus`), as DAPO's trimming to the batch size. After `max_rounds`
rounds the step trains on the informative groups it has (`rollout/refill/short` > 0).

A group is informative when its usable trajectories (status "ok"; rl.py leaves the others out
before the filter) have reward spread, by the filter's own `informative_mask`: an infrastructure
failure neither makes a group informative nor uninformative by its reward of 0. With
algo.branch_credit=local only the answer-branch sets train, each against its own mean, so the
group is informative when one of its sets (`Trajectory.branch_set`) has spread: a group whose
sets each scored alike trains nothing, however its sets differ from one another. With
algo.turn_advantage a spread of the per-turn returns makes a group informative too. Both follow
from the run's `GroupSignal` (`GroupSignal.of(cfg.algo)`), the one predicate rl.py's filter
asks. The refill costs up to `max_rounds` more rollouts per step.

Metrics, every step with the key on: `rollout/refill/rounds`, `rollout/refill/tasks` (tasks
rolled out beyond the first batch), `rollout/refill/repeats`, `rollout/refill/dropped_groups`
and `rollout/refill/dropped_frac` (among the groups handed over: those the filter drops),
`rollout/refill/surplus`, `rollout/refill/short`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from seekrl.algo.advantages import informative_mask
from seekrl.algo.config import AlgoConfig
from seekrl.types import Task, TrajectoryGroup

__all__ = ["refill", "informative", "GroupSignal"]


@dataclass(frozen=True)
class GroupSignal:
    """When a group trains something under the run's credit: `algo.filter_zero_std` keeps it, and
    the refill counts it (one predicate for both, `GroupSignal.of(cfg.algo)`). `by_set`:
    algo.branch_credit=local, spread inside an answer-branch set; `turn_gamma` (not None with
    algo.turn_advantage): a spread of the per-turn returns counts too."""

    by_set: bool = False
    turn_gamma: float | None = None

    @classmethod
    def of(cls, algo: AlgoConfig) -> GroupSignal:
        return cls(by_set=algo.branch_credit == "local", turn_gamma=algo.turn_gamma if algo.turn_advantage else None)

    def __call__(self, group: TrajectoryGroup) -> bool:
        return informative(group, self.by_set, self.turn_gamma)


def informative(group: TrajectoryGroup, by_set: bool = False, turn_gamma: float | None = None) -> bool:
    """The group has reward spread among its usable (status "ok") trajectories, or with `by_set`
    (algo.branch_credit=local) one of its answer-branch sets has, or with `turn_gamma` (algo.
    turn_advantage) their per-turn returns differ at some turn (`informative_mask`): what the
    trainer's `algo.filter_zero_std` keeps (a group of one usable trajectory, or none, has no spread)."""
    usable = [t for t in group.trajectories if t.status == "ok"]
    if len(usable) < 2:
        return False
    rewards = torch.tensor([t.reward for t in usable])
    sets = torch.tensor([-1 if t.branch_set is None else t.branch_set for t in usable]) if by_set else None
    turns = None
    if turn_gamma is not None and all(t.turn_rewards is not None for t in usable):
        turns = [list(t.turn_rewards) for t in usable]
    return bool(informative_mask(rewards, torch.zeros(len(usable), dtype=torch.long), sets, turns,
                                 turn_gamma if turn_gamma is not None else 1.0).all())


def _key(task: Task) -> tuple[str, str]:
    return task.source, task.id


async def refill(groups: list[TrajectoryGroup], *, draw: Callable[[], list[Task]],
                 roll: Callable[[list[Task], int], Awaitable[list[TrajectoryGroup]]],
                 max_rounds: int, signal: Callable[[TrajectoryGroup], bool] = informative
                 ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """The step's groups after refill rounds, and the `rollout/refill/*` metrics (module docstring).
    `groups`: the first batch's, scored; `draw()`: the next tasks of the data order; `roll(tasks,
    r)`: their groups, sampled with refill round r's seed; `signal`: which groups are informative
    (the run's `GroupSignal`; by default reward spread)."""
    need = len(groups)
    seen = {_key(g.task) for g in groups}
    drawn = list(groups)
    flags = [signal(g) for g in groups]
    rounds = extra = repeats = 0
    while sum(flags) < need and rounds < max_rounds:
        rounds += 1
        fresh = []
        for task in draw():
            if _key(task) in seen:
                repeats += 1
            else:
                seen.add(_key(task))
                fresh.append(task)
        if not fresh:
            continue
        more = await roll(fresh, rounds)
        extra += len(more)
        drawn += more
        flags += [signal(g) for g in more]
    # the draw order, cut right after the need-th informative group
    cut, found = len(drawn), 0
    for i, flag in enumerate(flags):
        found += flag
        if found == need:
            cut = i + 1
            break
    kept, kept_flags = drawn[:cut], flags[:cut]
    dropped = len(kept) - sum(kept_flags)
    return kept, {
        "rollout/refill/rounds": float(rounds),
        "rollout/refill/tasks": float(extra),
        "rollout/refill/repeats": float(repeats),
        "rollout/refill/dropped_groups": float(dropped),
        "rollout/refill/dropped_frac": dropped / max(1, len(kept)),
        "rollout/refill/surplus": float(len(drawn) - cut),
        "rollout/refill/short": float(need - sum(kept_flags)),
    }
