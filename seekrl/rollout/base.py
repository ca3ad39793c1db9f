"""The two protocols of the rollout: what it runs (`Workflow`) and what the trainer asks it for
(`RolloutSource`).

Workflow: how an agent plays one task's episodes against an engine.

    group = await workflow.run(task, engine, n, params)     # n episodes of `task`, scored

A workflow turns a task into `n` trajectories (a TrajectoryGroup), sampling every token through
`engine.generate` (tokens in, tokens out: seekrl/engines/base.py) and scoring each episode
with its Scorer (seekrl/rewards/base.py). Each episode runs in its own asyncio task, so a
batching engine sees the episodes of a whole step together. With `params.seed` set, episode i
of a task samples with `stable_seed(params.seed, task.id, i)` (rollout/__init__.py), whatever
else shares the engine. `prompt_ids` is the token prompt of a task's first turn (the trainer
drops tasks whose prompt is longer than rollout.max_prompt_tokens). SingleTurnWorkflow
(workflows/single_turn.py: one completion per episode, RLVR) and ToolAgentWorkflow
(workflows/tool_agent.py: the multi-turn tool loop) are seekrl's own, AgentWorkflow
(workflows/agent.py) runs an agent written against the OpenAI API; a custom agent implements
these methods (`close()` releases what it started, e.g. the agent endpoint; the run calls it once). A multi-turn agent appends each engine call with
`Trajectory.append_turn` (its span; the turn level of rewards and advantages); to be trained one
sample per turn (rollout.trajectory=stepwise) it creates its trajectories with `turn_prompts=[]`
and passes each call's prompt ids to `append_turn`.

RolloutSource: where the trainer's batch of each step comes from.

    rollout.start(step)                       # after resume: the step the run continues from
    batch = await rollout.next_batch(step)    # RolloutBatch: the step's TrajectoryGroups in task order + metrics
    await rollout.publish(model, step)        # the new weights to the engine
    rollout.data_state(step)                  # the data order's position after `step`, for checkpoints
    await rollout.aclose()

`SyncRollout` and `AsyncRollout` (executor.py) sample on the engine; with several trainer ranks,
`LeaderRollout` (rank 0) wraps one of them and broadcasts its batches, and `FollowerRollout`
(ranks > 0) receives them (parallel/controller.py). The RL loop (train/rl.py) sees only this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from seekrl.engines.base import InferenceEngine
from seekrl.types import SamplingParams, Task, TrajectoryGroup

__all__ = ["Workflow", "RolloutBatch", "RolloutSource"]


@runtime_checkable
class Workflow(Protocol):
    """Plays one task `n` times on an engine. A workflow may also have `metrics() -> dict[str,
    float]`, run-level counters the rollout adds to every step's metrics (the tool agent's
    `tools/<tool>/<counter>`); it is optional, so not part of the protocol."""

    def prompt_ids(self, task: Task) -> list[int]: ...

    async def run(self, task: Task, engine: InferenceEngine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup: ...

    def close(self) -> None: ...


@dataclass
class RolloutBatch:
    """One step's groups, in the data order, and the rollout metrics of the step."""

    groups: list[TrajectoryGroup]
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class RolloutSource(Protocol):
    def start(self, step: int) -> None: ...

    async def next_batch(self, step: int) -> RolloutBatch: ...

    async def publish(self, model: torch.nn.Module, version: int) -> None: ...

    def data_state(self, step: int) -> dict: ...

    async def aclose(self) -> None: ...
