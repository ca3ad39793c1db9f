"""Where the trainer's batches come from: `SyncRollout` (roll out, then train) or `AsyncRollout`
(episodes keep running on the engine while the trainer steps; AReaL's asynchronous RL).

    rollout = make_rollout(cfg.rollout, workflow, engine, iterator, params, seed=cfg.train.seed, decode=decode)
    rollout.start(step)                       # after resume: the step the run continues from
    batch = await rollout.next_batch(step)    # RolloutBatch: the step's TrajectoryGroups in task order + metrics
    await rollout.publish(model, step)        # the new weights to the engine
    rollout.data_state(step)                  # the data order's position after `step`, for checkpoints
    await rollout.aclose()

Both hand the trainer, for step s, the groups of the s-th batch of the data order (the tasks
`TaskIterator.next_batch()` gives the s-th time), sampled with `params` and the seed
`stable_seed(train.seed, "rollout", s)`; they differ only in *when* the episodes run. Both are
`RolloutSource`s (rollout/base.py).

SyncRollout with `rollout.refill` (DAPO dynamic sampling, rollout/refill.py): when fewer than
tasks_per_step of the step's groups have reward spread, it rolls out the next batches of the
data order (refill round r seeded `stable_seed(train.seed, "rollout", s, "refill", r)`, at most
`rollout.max_refill_rounds`) until they do; the data order then moves on by every batch drawn,
so step s's tasks are no longer the s-th batch, and `data_state` (the iterator's position)
includes the extra tasks. With `data.skip_flat` the sync rollout tells the iterator, for every
group it scored (refill rounds and their surplus included), whether it had spread by the run's
signal; later epochs leave out the tasks that recently had none (data/skip.py).

AsyncRollout. Groups (a task's G episodes) are admitted one by one, in the data order; group k
(0-based over the run) belongs to step s(k) = k // B + 1, B tasks per step. A background task
admits groups while

    capacity = min(max_concurrent - running, (η + version + 1)·B - (accepted + running)) > 0

(AReaL's rule; counted in groups, max_concurrent in episodes / G; `accepted` counts finished
groups, `running` those in flight, `version` is the engine's). Every group's episodes run as
asyncio tasks on an `InterruptibleEngine`: when the trainer publishes new weights, the turns in
flight are cut and continue under them (interrupt.py). `next_batch(s)` waits until every group
of step s has finished and returns them in admission order.

The bound. A group admitted while the engine is at version w has k = accepted + running < (η +
w + 1)·B, so s(k) - 1 = k // B <= η + w: step s(k) trains version s(k) - 1, at most η past w, and
no token of the group is older than w (later turns and continued turns only get newer weights).
So every batch satisfies `rollout/staleness/max <= η` by construction, nothing finished is ever
dropped, and the trainer sees the data order of the sync loop. With η = 0 each step's groups are
admitted only once the previous step's weights are in, and the results are the sync loop's.
Consuming by step (rather than in finish order) costs nothing in wait: a finish-order batch
would still have to include the slowest group of its step to keep the bound.

Resume: the checkpoint stores the data position of the first step not trained (`data_state`),
and `start(step)` sets accepted = step·B (as AReaL does after a restore), so admission, the
bound and the data order continue; groups that were in flight at the kill are sampled again.
Which tokens an episode samples depends on timing (which weights were in when), so async runs
are not bit-exact across runs the way sync runs are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import torch

from seekrl.data.iterator import TaskIterator
from seekrl.engines.base import InferenceEngine
from seekrl.rollout import collect, stable_seed
from seekrl.rollout.base import RolloutBatch, Workflow
from seekrl.rollout.config import RolloutConfig
from seekrl.rollout.interrupt import InterruptibleEngine
from seekrl.rollout.refill import informative, refill
from seekrl.types import SamplingParams, Task, TrajectoryGroup

__all__ = ["make_rollout", "SyncRollout", "AsyncRollout", "staleness", "batch_metrics"]


def staleness(groups: list[TrajectoryGroup], trained_version: int) -> tuple[float, float]:
    """(mean, max) over trajectories of trained_version minus the version of their oldest sampled token."""
    gaps = []
    for g in groups:
        for t in g.trajectories:
            sampled = [v for v, m in zip(t.versions, t.loss_mask) if m and v >= 0]
            if sampled:
                gaps.append(trained_version - min(sampled))
    if not gaps:
        return 0.0, 0.0
    return sum(gaps) / len(gaps), float(max(gaps))


def batch_metrics(groups, trained_version: int, *, interrupted: int, queue: int, wait_s: float,
                  workflow: Workflow | None = None) -> dict[str, float]:
    """The step's rollout metrics, and the workflow's own run-level counters when it has a
    `metrics()` (the tool agent's `tools/<name>/<counter>`)."""
    mean, worst = staleness(groups, trained_version)
    counters = getattr(workflow, "metrics", None)
    return {
        "rollout/staleness/mean": mean, "rollout/staleness/max": worst, "rollout/interrupted": float(interrupted),
        "rollout/queue": float(queue), "time/wait_s": wait_s, **(counters() if counters is not None else {}),
    }


class SyncRollout:
    """Roll out step s's tasks when the trainer asks for them (the trainer waits for the whole rollout);
    `refill_rounds` > 0: rollout.refill, at most that many more batches for groups without reward spread
    (`signal`: which groups are informative, the run's `GroupSignal`, rollout/refill.py)."""

    mode = "sync"

    def __init__(self, workflow: Workflow, engine: InferenceEngine, iterator: TaskIterator, params: SamplingParams, *,
                 group_size: int, seed: int, refill_rounds: int = 0, signal: Callable[[TrajectoryGroup], bool] = informative):
        self.workflow, self.engine, self.iterator, self.params = workflow, engine, iterator, params
        self.group_size, self.seed, self.refill_rounds, self.signal = group_size, seed, refill_rounds, signal

    def start(self, step: int) -> None:
        pass

    async def next_batch(self, step: int) -> RolloutBatch:
        t0 = time.perf_counter()
        tasks = self.iterator.next_batch()
        params = dataclasses.replace(self.params, seed=stable_seed(self.seed, "rollout", step))
        groups = self._record(await collect(self.workflow, self.engine, tasks, self.group_size, params))
        refilled: dict[str, float] = {}
        if self.refill_rounds:
            async def roll(more: list[Task], round_: int) -> list[TrajectoryGroup]:
                seeded = dataclasses.replace(self.params, seed=stable_seed(self.seed, "rollout", step, "refill", round_))
                return self._record(await collect(self.workflow, self.engine, more, self.group_size, seeded))

            groups, refilled = await refill(groups, draw=self.iterator.next_batch, roll=roll, max_rounds=self.refill_rounds,
                                           signal=self.signal)
        metrics = batch_metrics(groups, step - 1, interrupted=0, queue=0, wait_s=time.perf_counter() - t0, workflow=self.workflow)
        return RolloutBatch(groups, {**metrics, **refilled, **self.iterator.metrics()})

    def _record(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """data.skip_flat: tell the data order which of the groups just scored had spread (the run's
        signal), every group whose episodes all ran (a refill's surplus too); returns `groups`."""
        for g in groups:
            if g.trajectories and all(t.status == "ok" for t in g.trajectories):
                self.iterator.record(g.task, self.signal(g))
        return groups

    async def publish(self, model: torch.nn.Module, version: int) -> None:
        await self.engine.update_weights(model, version)

    def data_state(self, step: int) -> dict:
        return self.iterator.state_dict()

    async def aclose(self) -> None:
        pass


class AsyncRollout:
    """Admit groups under the staleness bound while the trainer steps (module docstring)."""

    mode = "async"

    def __init__(self, workflow: Workflow, engine: InferenceEngine, iterator: TaskIterator, params: SamplingParams, *,
                 group_size: int, tasks_per_step: int, max_staleness: int, max_concurrent: int, seed: int, decode=None):
        self.workflow, self.iterator, self.params = workflow, iterator, params
        self.engine = InterruptibleEngine(engine, decode)
        self.G, self.B, self.eta, self.seed = group_size, tasks_per_step, max_staleness, seed
        self.max_groups = max(1, max_concurrent // group_size)  # groups in flight at once
        self.version = 0
        self.accepted = self.running = self.next_index = 0
        self.done: dict[int, TrajectoryGroup] = {}
        self.tasks: dict[int, list[Task]] = {}  # step -> its tasks (pulled from the iterator when its first group is admitted)
        self.states: dict[int, dict] = {}  # step -> the iterator's state before that step's tasks were pulled
        self.error: BaseException | None = None
        self._interrupted_seen = 0
        self._episodes: set[asyncio.Task] = set()
        self._admitter: asyncio.Task | None = None
        self._changed: asyncio.Event | None = None

    # ---- admission
    def capacity(self) -> int:
        """Groups that may be admitted now (AReaL's rule, module docstring)."""
        by_concurrency = self.max_groups - self.running
        by_staleness = (self.eta + self.version + 1) * self.B - (self.accepted + self.running)
        return min(by_concurrency, by_staleness)

    def start(self, step: int) -> None:
        """Begin admitting at step `step + 1` (0: a fresh run) with the engine at version `step`."""
        self.version = step
        self.accepted = self.next_index = step * self.B
        self._changed = asyncio.Event()
        self._admitter = asyncio.get_running_loop().create_task(self._admit_loop(), name="seekrl-rollout-admit")

    async def _admit_loop(self) -> None:
        while True:
            while self.error is None and self.capacity() > 0:
                self._admit()
            self._changed.clear()
            await self._changed.wait()

    def _admit(self) -> None:
        k = self.next_index
        step, j = k // self.B + 1, k % self.B
        if j == 0:
            self.states[step] = self.iterator.state_dict()
            self.tasks[step] = self.iterator.next_batch()
        task = self.tasks[step][j]
        params = dataclasses.replace(self.params, seed=stable_seed(self.seed, "rollout", step))
        self.next_index += 1
        self.running += 1
        episode = asyncio.get_running_loop().create_task(self._run(k, task, params), name=f"seekrl-group-{k}")
        self._episodes.add(episode)
        episode.add_done_callback(self._episodes.discard)

    async def _run(self, k: int, task: Task, params) -> None:
        try:
            group = (await collect(self.workflow, self.engine, [task], self.G, params))[0]
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # reaches the trainer at its next next_batch
            if self.error is None:
                self.error = e
            group = None
        self.running -= 1
        if group is not None:
            self.done[k] = group
            self.accepted += 1
        self._changed.set()

    # ---- the trainer's side
    async def next_batch(self, step: int) -> RolloutBatch:
        t0 = time.perf_counter()
        window = range((step - 1) * self.B, step * self.B)
        while not all(k in self.done for k in window):
            if self.error is not None:
                raise self.error
            if self._admitter is not None and self._admitter.done():
                self._admitter.result()  # an admission error (the data iterator) surfaces here
            self._changed.clear()
            await self._changed.wait()
        groups = [self.done.pop(k) for k in window]
        self.tasks.pop(step, None)
        for old in [s for s in self.states if s <= step]:
            del self.states[old]
        cut = self.engine.interrupted - self._interrupted_seen
        self._interrupted_seen = self.engine.interrupted
        wait_s = time.perf_counter() - t0
        return RolloutBatch(groups, batch_metrics(groups, step - 1, interrupted=cut, queue=len(self.done), wait_s=wait_s,
                                                  workflow=self.workflow))

    async def publish(self, model: torch.nn.Module, version: int) -> None:
        """New weights: cut the turns in flight, load, continue them; admission may go on."""
        await self.engine.update_weights(model, version)
        self.version = int(version)
        if self._changed is not None:
            self._changed.set()

    def data_state(self, step: int) -> dict:
        """The iterator's position after step `step`'s tasks (its later tasks may be pulled already)."""
        return self.states.get(step + 1, self.iterator.state_dict())

    async def aclose(self) -> None:
        """Cancel the admission task and the episodes in flight, and wait for them (no task outlives the run)."""
        pending = [t for t in (self._admitter, *self._episodes) if t is not None and not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=30)


def make_rollout(r: RolloutConfig, workflow: Workflow, engine: InferenceEngine, iterator: TaskIterator, params: SamplingParams,
                 *, seed: int, decode=None, signal: Callable[[TrajectoryGroup], bool] = informative) -> SyncRollout | AsyncRollout:
    """The rollout `rollout.mode` names, on `engine` over the data order of `iterator`; `params`
    sample every turn, with the seed `stable_seed(seed, "rollout", step)` of each step; `signal`:
    which groups the refill counts as informative (the run's `GroupSignal`)."""
    if r.mode == "sync":
        return SyncRollout(workflow, engine, iterator, params, group_size=r.group_size, seed=seed,
                           refill_rounds=r.max_refill_rounds if r.refill else 0, signal=signal)
    return AsyncRollout(
        workflow, engine, iterator, params, group_size=r.group_size, tasks_per_step=r.tasks_per_step,
        max_staleness=r.max_staleness, max_concurrent=r.max_concurrent or r.batch_size, seed=seed, decode=decode,
    )
