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
before the filter) have reward spread, by `zero_std_group_mask` itself: an infrastructure
failure neither makes a group informative nor uninformative by its reward of 0. The refill
costs up to `max_rounds` more rollouts per step.

Metrics, every step with the key on: `rollout/refill/rounds`, `rollout/refill/tasks` (tasks
rolled out beyond the first batch), `rollout/refill/repeats`, `rollout/refill/dropped_groups`
and `rollout/refill/dropped_frac` (among the groups handed over: those the filter drops),
`rollout/refill/surplus`, `rollout/refill/short`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import torch

from seekrl.algo.advantages import zero_std_group_mask
from seekrl.types import Task, TrajectoryGroup

__all__ = ["refill", "informative"]


def informative(group: TrajectoryGroup) -> bool:
    """The group has reward spread among its usable (status "ok") trajectories: what the trainer's
    `algo.filter_zero_std` keeps (a group of one usable trajectory, or none, has no spread)."""
    rewards = [t.reward for t in group.trajectories if t.status == "ok"]
    if len(rewards) < 2:
        return False
    return bool(zero_std_group_mask(torch.tensor(rewards), torch.zeros(len(rewards), dtype=torch.long)).all())


def _key(task: Task) -> tuple[str, str]:
    return task.source, task.id


async def refill(groups: list[TrajectoryGroup], *, draw: Callable[[], list[Task]],
                 roll: Callable[[list[Task], int], Awaitable[list[TrajectoryGroup]]],
                 max_rounds: int) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """The step's groups after refill rounds, and the `rollout/refill/*` metrics (module docstring).
    `groups`: the first batch's, scored; `draw()`: the next tasks of the data order; `roll(tasks,
    r)`: their groups, sampled with refill round r's seed."""
    need = len(groups)
    seen = {_key(g.task) for g in groups}
    drawn = list(groups)
    flags = [informative(g) for g in groups]
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
        flags += [informative(g) for g in more]
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
