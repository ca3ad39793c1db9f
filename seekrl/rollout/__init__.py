"""Run the episodes of one step concurrently and return their groups, in task order.

All G × tasks episodes are in flight at once, so a batching engine sees them together. (The
asynchronous mode with bounded staleness admits new episodes while training runs; it changes
only *when* `collect` is called, not what it returns.)

Reproducible sampling: when `params.seed` is set, the workflows give episode i of a task the
seed `stable_seed(params.seed, task.id, i)` and its turn t that seed + t, so what an episode
samples does not depend on which other episodes share the engine's batches, on tool latency, or
on the order they finish in. The trainer sets `stable_seed(train.seed, "rollout", step)` per step
(a resumed run samples what an uninterrupted one would), the evaluation `stable_seed(train.seed,
"eval")`; `seekrl generate` sends `stable_seed(train.seed, task id, sample)` to its endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib

from seekrl.engines.base import InferenceEngine
from seekrl.rollout.base import Workflow
from seekrl.types import SamplingParams, Task, TrajectoryGroup

__all__ = ["collect", "stable_seed", "episode_params", "turn_seed", "SEED_MASK"]

SEED_MASK = 0x7FFFFFFF


def stable_seed(*parts) -> int:
    """A 31-bit seed from `parts` (str() of each), the same in every process (not Python's `hash`)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & SEED_MASK


def episode_params(params: SamplingParams, task: Task, n: int) -> list[SamplingParams]:
    """The params of each of a task's n episodes: their own seeds when `params.seed` is set."""
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=stable_seed(params.seed, task.id, i)) for i in range(n)]


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The seed of an episode's turn `turn` (0-based), given the episode's seed."""
    return None if seed is None else (seed + turn) & SEED_MASK


async def collect(workflow: Workflow, engine: InferenceEngine, tasks: list[Task], n: int, params: SamplingParams | None = None,
                  progress=None, max_in_flight: int | None = None) -> list[TrajectoryGroup]:
    """`progress`: a tqdm-like bar, advanced by one as each task's group finishes. `max_in_flight`:
    at most this many episodes run at once (whole groups, at least one); None: every task at once."""
    gate = asyncio.Semaphore(max(1, max_in_flight // n)) if max_in_flight else contextlib.nullcontext()

    async def one(task: Task) -> TrajectoryGroup:
        async with gate:
            group = await workflow.run(task, engine, n, params)
        if progress is not None:
            progress.update(1)
        return group

    return list(await asyncio.gather(*(one(task) for task in tasks)))

