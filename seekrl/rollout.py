"""Run the episodes of one step concurrently and return their groups, in task order.

All G × tasks episodes are in flight at once, so a batching engine sees them together. (The
asynchronous mode with bounded staleness admits new episodes while training runs; it changes
only *when* `collect` is called, not what it returns.)
"""

from __future__ import annotations

import asyncio

from seekrl.types import Task, TrajectoryGroup


async def collect(workflow, engine, tasks: list[Task], n: int, params=None, progress=None) -> list[TrajectoryGroup]:
    """`progress`: a tqdm-like bar, advanced by one as each task's group finishes."""

    async def one(task: Task) -> TrajectoryGroup:
        group = await workflow.run(task, engine, n, params)
        if progress is not None:
            progress.update(1)
        return group

    return list(await asyncio.gather(*(one(task) for task in tasks)))

