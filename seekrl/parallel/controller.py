"""Rank 0 is the controller: it rolls out; the other ranks receive each step's batch from it.

The RL loop (train/rl.py) runs on every rank and asks `run.rollout.next_batch(step)` and
`run.rollout.publish(model, step)` as in one process. With several ranks the rollout is wrapped,
both sides being `RolloutSource`s (rollout/base.py):

- rank 0, `LeaderRollout`: the real rollout (sync or async, in-process engine or servers); each
  batch is broadcast to the other ranks (JSON), and `publish` gathers the sharded policy's full
  weights (a collective every rank joins) into rank 0's full copy that the engine samples from
  (or writes to disk for the engine servers) before the engine's usual weight update.
- ranks > 0, `FollowerRollout`: `next_batch` receives rank 0's batch; `publish` joins the gather.

So every rank holds the whole batch and computes rewards' advantages identically; the log-prob
and gradient work is split by train/plan.py. Only rank 0 writes anything (run folder, metrics,
trajectories, checkpoint files except its own optimizer shard).
"""

from __future__ import annotations

import asyncio
import dataclasses

import torch

from seekrl.parallel.fsdp import copy_into, full_state_dict
from seekrl.parallel.ranks import Ranks
from seekrl.rollout.base import RolloutBatch, RolloutSource
from seekrl.types import Task, Trajectory, TrajectoryGroup

__all__ = ["LeaderRollout", "FollowerRollout", "encode_batch", "decode_batch"]


def encode_batch(batch: RolloutBatch) -> dict:
    return {"groups": [{"task": dataclasses.asdict(g.task), "trajectories": [
        {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "task"} for t in g.trajectories]}
        for g in batch.groups], "metrics": batch.metrics}


def decode_batch(data: dict) -> RolloutBatch:
    groups = []
    for g in data["groups"]:
        task = Task(**g["task"])
        groups.append(TrajectoryGroup(task, [Trajectory(task=task, **t) for t in g["trajectories"]]))
    return RolloutBatch(groups, data["metrics"])


class LeaderRollout:
    """Rank 0's rollout: the real one, plus the broadcast of each batch and the weight gather."""

    def __init__(self, inner: RolloutSource, ranks: Ranks, engine_model: torch.nn.Module) -> None:
        self.inner, self.ranks, self.engine_model = inner, ranks, engine_model

    def start(self, step: int) -> None:
        self.inner.start(step)

    async def next_batch(self, step: int) -> RolloutBatch:
        batch = await self.inner.next_batch(step)
        await asyncio.to_thread(self.ranks.broadcast_json, encode_batch(batch))
        return batch

    async def publish(self, model: torch.nn.Module, version: int) -> None:
        weights = await asyncio.to_thread(full_state_dict, model, self.ranks)
        if self.engine_model is not model:
            copy_into(self.engine_model, weights)
        await self.inner.publish(self.engine_model, version)

    def data_state(self, step: int) -> dict:
        return self.inner.data_state(step)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FollowerRollout:
    """A rank > 0: each step's batch comes from rank 0; it joins the weight gather at publish."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def start(self, step: int) -> None:
        pass

    async def next_batch(self, step: int) -> RolloutBatch:
        return decode_batch(await asyncio.to_thread(self.ranks.broadcast_json, None))

    async def publish(self, model: torch.nn.Module, version: int) -> None:
        await asyncio.to_thread(full_state_dict, model, self.ranks)

    def data_state(self, step: int) -> dict:
        return {}

    async def aclose(self) -> None:
        pass
