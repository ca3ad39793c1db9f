"""rollout.refill (rollout/refill.py, SyncRollout): DAPO dynamic sampling that keeps the batch size.

A fake workflow scores each task by a table (or by its seed), so which groups have reward spread
is known in advance; the tests check the batch handed to the trainer, the data position, the
seeds of each refill round, the metrics on hand-worked cases, infrastructure failures, the
option off, and the config errors."""

from __future__ import annotations

import asyncio

import pytest

from seekrl.config import load_config
from seekrl.data.iterator import TaskIterator
from seekrl.errors import ConfigError
from seekrl.rollout import stable_seed
from seekrl.rollout.executor import SyncRollout, batch_metrics
from seekrl.rollout.refill import GroupSignal, informative
from seekrl.types import SamplingParams, Task, Trajectory, TrajectoryGroup

G = 4


def _task(i: int) -> Task:
    return Task(id=f"t{i}", prompt=[{"role": "user", "content": f"q{i}"}], answer="a")


def _traj(task: Task, reward: float, status: str = "ok", token: int = 0) -> Trajectory:
    return Trajectory(task=task, prompt_ids=[1], completion_ids=[token], loss_mask=[1], logprobs=[-0.5], versions=[0],
                      reward=reward, status=status)


class TableWorkflow:
    """Group of `task` has reward spread iff its id is in `spread`; records every call's (task id, seed)."""

    def __init__(self, spread: set[str] | None = None):
        self.spread = spread
        self.calls: list[tuple[str, int | None]] = []

    def prompt_ids(self, task: Task) -> list[int]:
        return [1]

    async def run(self, task: Task, engine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup:
        seed = params.seed if params else None
        self.calls.append((task.id, seed))
        if self.spread is not None:
            rewards = [float(i % 2) if task.id in self.spread else 0.0 for i in range(n)]
        else:  # by the episode seeds, as a sampling engine would: reproducible from the seed alone
            rewards = [float(stable_seed(seed, task.id, i) % 3 == 0) for i in range(n)]
        token = stable_seed(seed, task.id) % 1000
        return TrajectoryGroup(task, [_traj(task, r, token=token) for r in rewards])


class NoEngine:
    async def update_weights(self, model, version):
        pass


def _rollout(wf, tasks, batch, rounds, seed=0, shuffle=False):
    it = TaskIterator(tasks, batch, seed=seed, shuffle=shuffle)
    return SyncRollout(wf, NoEngine(), it, SamplingParams(max_new_tokens=2), group_size=G, seed=seed, refill_rounds=rounds), it


def _ids(batch):
    return [g.task.id for g in batch.groups]


def _refill_metrics(batch):
    return {k.removeprefix("rollout/refill/"): v for k, v in batch.metrics.items() if k.startswith("rollout/refill/")}


def test_refill_fills_the_batch_cuts_after_the_last_needed_group_and_counts():
    tasks = [_task(i) for i in range(12)]
    wf = TableWorkflow(spread={"t1", "t4", "t5", "t6", "t7", "t9"})
    rollout, it = _rollout(wf, tasks, 4, rounds=3)
    batch = asyncio.run(rollout.next_batch(1))
    # first batch t0..t3 has one informative group (t1); round 1 draws t4..t7, t4 t5 t6 complete the four
    assert _ids(batch) == ["t0", "t1", "t2", "t3", "t4", "t5", "t6"]
    assert [g.task.id for g in batch.groups if informative(g)] == ["t1", "t4", "t5", "t6"]
    assert _refill_metrics(batch) == {"rounds": 1.0, "tasks": 4.0, "repeats": 0.0, "dropped_groups": 3.0,
                                      "dropped_frac": 3 / 7, "surplus": 1.0, "short": 0.0}
    assert it.state_dict() == {"epoch": 0, "index": 8, "seed": 0}  # the data position includes the round's tasks (t7 too)
    assert rollout.data_state(1) == it.state_dict()
    # the refill round is seeded with the round in the key; the first batch keeps the step's seed
    step_seed, round_seed = stable_seed(0, "rollout", 1), stable_seed(0, "rollout", 1, "refill", 1)
    assert wf.calls == [(f"t{i}", step_seed) for i in range(4)] + [(f"t{i}", round_seed) for i in range(4, 8)]
    # step 2 continues the data order after t7: t8..t11 (t9), then epoch 1's t0..t3 (t1) and t4..t7 (t4, t5)
    batch = asyncio.run(rollout.next_batch(2))
    assert _ids(batch) == ["t8", "t9", "t10", "t11", "t0", "t1", "t2", "t3", "t4", "t5"]
    assert [g.task.id for g in batch.groups if informative(g)] == ["t9", "t1", "t4", "t5"]
    assert _refill_metrics(batch) == {"rounds": 2.0, "tasks": 8.0, "repeats": 0.0, "dropped_groups": 6.0,
                                      "dropped_frac": 0.6, "surplus": 2.0, "short": 0.0}
    assert it.state_dict() == {"epoch": 1, "index": 8, "seed": 0}


def test_refill_never_reuses_a_task_in_a_step_and_stops_after_max_rounds():
    # 6 tasks, 4 a batch (drop_last): epoch 0 gives t0..t3, and every later epoch (unshuffled) t0..t3 again
    wf = TableWorkflow(spread={"t1"})
    rollout, it = _rollout(wf, [_task(i) for i in range(6)], 4, rounds=2)
    batch = asyncio.run(rollout.next_batch(1))
    assert _ids(batch) == ["t0", "t1", "t2", "t3"]  # nothing rolled out twice
    assert len(wf.calls) == 4
    assert _refill_metrics(batch) == {"rounds": 2.0, "tasks": 0.0, "repeats": 8.0, "dropped_groups": 3.0,
                                      "dropped_frac": 0.75, "surplus": 0.0, "short": 3.0}
    assert it.state_dict()["epoch"] == 2  # the two rounds' draws moved the data order on


def test_refill_with_a_shuffled_order_keeps_the_batch_and_unique_tasks_over_epochs():
    tasks = [_task(i) for i in range(10)]
    wf = TableWorkflow()  # by seed: about 1 - (2/3)^4 = 80% of groups have spread
    rollout, it = _rollout(wf, tasks, 4, rounds=4, seed=3, shuffle=True)
    draws = 0
    for step in range(1, 16):
        batch = asyncio.run(rollout.next_batch(step))
        keys = [(g.task.source, g.task.id) for g in batch.groups]
        assert len(keys) == len(set(keys)), step
        m = _refill_metrics(batch)
        assert sum(informative(g) for g in batch.groups) == 4 - m["short"]
        assert m["short"] == 0  # reachable with these rewards: the batch size is kept
        assert informative(batch.groups[-1])  # the cut is right after the last needed group
        assert m["dropped_groups"] == len(batch.groups) - 4
        draws += 1 + m["rounds"]
        assert it.state_dict()["epoch"] * 8 + it.state_dict()["index"] == draws * 4  # 2 batches an epoch (drop_last)


def test_refill_is_reproducible_from_the_seed():
    tasks = [_task(i) for i in range(10)]

    def run():
        wf = TableWorkflow()
        rollout, it = _rollout(wf, tasks, 4, rounds=3, seed=7, shuffle=True)
        out = []
        for step in range(1, 8):
            batch = asyncio.run(rollout.next_batch(step))
            out.append([(g.task.id, g.rewards, [t.completion_ids for t in g.trajectories]) for g in batch.groups])
        return out, wf.calls, it.state_dict()

    first, second = run(), run()
    assert first == second
    assert any(s for _, s in first[1] if s not in {stable_seed(7, "rollout", k) for k in range(1, 8)})  # refills happened


def test_resumed_rollout_continues_the_data_order_after_refills():
    tasks = [_task(i) for i in range(10)]

    def rollout():
        return _rollout(TableWorkflow(), tasks, 4, rounds=3, seed=5, shuffle=True)

    full, _ = rollout()
    uninterrupted = [_ids(asyncio.run(full.next_batch(s))) for s in range(1, 9)]
    cut, _ = rollout()
    for s in range(1, 4):
        asyncio.run(cut.next_batch(s))
    state = cut.data_state(3)
    resumed, it = rollout()
    it.load_state_dict(state)
    assert [_ids(asyncio.run(resumed.next_batch(s))) for s in range(4, 9)] == uninterrupted[3:]


def test_an_infrastructure_failure_neither_makes_nor_breaks_a_group():
    task = _task(0)
    assert not informative(TrajectoryGroup(task, [_traj(task, 1.0), _traj(task, 0.0, "engine_error")]))  # one usable sample
    assert not informative(TrajectoryGroup(task, [_traj(task, 0.0), _traj(task, 0.0), _traj(task, 1.0, "tool_unavailable")]))
    assert not informative(TrajectoryGroup(task, [_traj(task, 0.0, "reward_unavailable")] * 3))
    assert informative(TrajectoryGroup(task, [_traj(task, 1.0), _traj(task, 0.0), _traj(task, 0.0, "engine_error")]))
    assert not informative(TrajectoryGroup(task, [_traj(task, 0.5), _traj(task, 0.5 + 1e-8)]))  # zero_std_group_mask's eps


def _set_traj(task: Task, reward: float, branch_set, status: str = "ok") -> Trajectory:
    t = _traj(task, reward, status)
    t.branch_set = branch_set
    return t


def test_under_local_credit_a_group_is_informative_only_through_a_set_with_spread():
    """algo.branch_credit=local trains an answer against its own set's mean: a group whose sets each
    scored alike trains nothing, though its rewards differ (by_set=False still keeps it)."""
    task = _task(0)
    alike = TrajectoryGroup(task, [_set_traj(task, r, s) for r, s in ((1.0, 0), (1.0, 0), (0.0, 1), (0.0, 1))])
    assert informative(alike) and not informative(alike, by_set=True)
    one_set = TrajectoryGroup(task, [_set_traj(task, r, s) for r, s in ((1.0, 0), (1.0, 0), (1.0, 1), (0.0, 1))])
    assert informative(one_set) and informative(one_set, by_set=True)
    # a set whose spread is only in a failed row has none; an unbranched episode is credited against the group
    failed = TrajectoryGroup(task, [_set_traj(task, 1.0, 0), _set_traj(task, 0.0, 0, "engine_error"), _set_traj(task, 0.0, 1)])
    assert informative(failed) and not informative(failed, by_set=True)
    loose = TrajectoryGroup(task, [_set_traj(task, 1.0, None), _set_traj(task, 0.0, 0), _set_traj(task, 0.0, 0)])
    assert informative(loose, by_set=True)
    # a group without any set is judged by its spread, as without the option
    plain = TrajectoryGroup(task, [_traj(task, 1.0), _traj(task, 0.0)])
    assert informative(plain, by_set=True) and not informative(TrajectoryGroup(task, [_traj(task, 1.0)] * 2), by_set=True)


def test_group_signal_follows_the_algo_config():
    """GroupSignal.of(cfg.algo): the one predicate of the refill and the filter, by the credit."""
    def algo(*overrides):
        return load_config(None, ["model.path=tiny", *overrides]).algo

    assert GroupSignal.of(algo()) == GroupSignal()
    assert GroupSignal.of(algo("algo.branch_credit=local")) == GroupSignal(by_set=True)
    assert GroupSignal.of(algo("algo.turn_advantage=true", "algo.turn_gamma=0.9")) == GroupSignal(turn_gamma=0.9)
    task = _task(0)
    # equal outcomes, different per-turn rewards: informative only when the turn rewards train
    turns = []
    for r, tr in ((1.0, [0.0, 1.0]), (1.0, [1.0, 0.0])):
        t = _traj(task, r)
        t.turn_rewards = tr
        turns.append(t)
    group = TrajectoryGroup(task, turns)
    assert not GroupSignal()(group) and GroupSignal(turn_gamma=1.0)(group)
    turns[1].turn_rewards = [0.0, 1.0]
    assert not GroupSignal(turn_gamma=1.0)(group)


class SetWorkflow(TableWorkflow):
    """Two sets of two rows a group: t-ids in `spread` have spread inside set 1; the others have
    sets that each score alike, but differ from each other (a whole-group spread)."""

    async def run(self, task: Task, engine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup:
        self.calls.append((task.id, params.seed if params else None))
        rewards = (1.0, 1.0, 1.0, 0.0) if task.id in self.spread else (1.0, 1.0, 0.0, 0.0)
        return TrajectoryGroup(task, [_set_traj(task, r, i // 2) for i, r in enumerate(rewards)])


def test_refill_by_set_refills_for_groups_whose_sets_scored_alike():
    tasks = [_task(i) for i in range(12)]
    wf = SetWorkflow(spread={"t1", "t4", "t5", "t6", "t9"})
    it = TaskIterator(tasks, 4, seed=0, shuffle=False)
    by_set = SyncRollout(wf, NoEngine(), it, SamplingParams(max_new_tokens=2), group_size=G, seed=0, refill_rounds=3,
                         signal=GroupSignal(by_set=True))
    batch = asyncio.run(by_set.next_batch(1))
    assert _ids(batch) == ["t0", "t1", "t2", "t3", "t4", "t5", "t6"]
    assert _refill_metrics(batch)["dropped_groups"] == 3.0 and _refill_metrics(batch)["rounds"] == 1.0
    whole, _ = _rollout(SetWorkflow(spread={"t1"}), tasks, 4, rounds=3)  # by whole-group spread every group counts
    assert _refill_metrics(asyncio.run(whole.next_batch(1)))["rounds"] == 0.0


def test_refill_off_is_the_plain_sync_rollout():
    tasks = [_task(i) for i in range(12)]
    wf = TableWorkflow(spread={"t1"})
    rollout, it = _rollout(wf, tasks, 4, rounds=0)
    batch = asyncio.run(rollout.next_batch(1))
    assert _ids(batch) == ["t0", "t1", "t2", "t3"] and it.state_dict()["index"] == 4
    assert set(batch.metrics) == set(batch_metrics([], 0, interrupted=0, queue=0, wait_s=0.0))
    assert wf.calls == [(f"t{i}", stable_seed(0, "rollout", 1)) for i in range(4)]


def test_refill_on_with_a_full_first_batch_is_the_step_without_refill():
    tasks = [_task(i) for i in range(12)]
    spread = {f"t{i}" for i in range(8)}  # steps 1 and 2 (t0..t7) are informative, step 3 (t8..t11) is not
    off, it_off = _rollout(TableWorkflow(spread), tasks, 4, rounds=0)
    on, it_on = _rollout(TableWorkflow(spread), tasks, 4, rounds=3)
    for step in (1, 2):
        a, b = asyncio.run(off.next_batch(step)), asyncio.run(on.next_batch(step))
        assert [(g.task.id, g.rewards) for g in a.groups] == [(g.task.id, g.rewards) for g in b.groups]
        assert {k: v for k, v in b.metrics.items() if not k.startswith(("rollout/refill/", "time/"))} == \
            {k: v for k, v in a.metrics.items() if not k.startswith("time/")}
        assert _refill_metrics(b)["rounds"] == 0 and it_off.state_dict() == it_on.state_dict()
    a, b = asyncio.run(off.next_batch(3)), asyncio.run(on.next_batch(3))
    assert _ids(a) == ["t8", "t9", "t10", "t11"] and _refill_metrics(b)["rounds"] == 1
    assert _ids(b) == ["t8", "t9", "t10", "t11", "t0", "t1", "t2", "t3"]  # epoch 1 refills it


BASE = ["model.path=tiny", "rollout.group_size=2", "rollout.batch_size=4", "algo.filter_zero_std=true", "rollout.refill=true"]


@pytest.mark.parametrize("overrides, words", [
    (["rollout.mode=async"], "rollout.mode=sync"),
    (["rollout.group_size=1", "algo.name=reinforce_pp"], "group_size >= 2"),
    (["algo.filter_zero_std=false"], "algo.filter_zero_std=true"),
    (["rollout.max_refill_rounds=0"], "max_refill_rounds"),
])
def test_refill_config_errors(overrides, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        load_config(None, BASE + overrides)


def test_refill_config_defaults_and_accepts():
    cfg = load_config(None, BASE + ["rollout.max_refill_rounds=2"])
    assert cfg.rollout.refill and cfg.rollout.max_refill_rounds == 2
    assert load_config(None, ["model.path=tiny"]).rollout.refill is False
