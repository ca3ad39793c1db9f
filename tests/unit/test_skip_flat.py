"""data.skip_flat (data/skip.py, TaskIterator, MixtureIterator, SyncRollout): the online
curriculum that leaves out of later epochs the tasks whose recent groups had no reward spread.

A fake workflow gives a group reward spread iff its task is in a table, so which tasks an epoch
must leave out is known in advance; the tests check the counts, the epochs' orders, the floor of
one batch, the kept fraction (`data.skip_flat_keep`), the probability, failures left unrecorded, exact resume (also across an epoch boundary
and for a mixture), checkpoints written before the option existed, and the config errors."""

from __future__ import annotations

import asyncio

import pytest

from seekrl.config import load_config
from seekrl.data.iterator import TaskIterator
from seekrl.data.config import DataConfig
from seekrl.data.mixture import MixtureIterator
from seekrl.data.sets import load_task_sets
from seekrl.data.skip import FlatHistory
from seekrl.errors import ConfigError
from seekrl.rollout.executor import SyncRollout
from seekrl.types import SamplingParams, Task, Trajectory, TrajectoryGroup

G = 4


def _task(i: int, source: str = "s") -> Task:
    return Task(id=f"t{i}", prompt=[{"role": "user", "content": f"q{i}"}], answer="a", source=source)


class TableWorkflow:
    """A group has reward spread iff its task id is in `spread`; `fail` ids get an engine error."""

    def __init__(self, spread: set[str], fail: frozenset[str] = frozenset()):
        self.spread, self.fail = spread, fail
        self.calls: list[str] = []

    def prompt_ids(self, task: Task) -> list[int]:
        return [1]

    async def run(self, task: Task, engine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup:
        self.calls.append(task.id)
        rewards = [float(i % 2) if task.id in self.spread else 0.0 for i in range(n)]
        status = "engine_error" if task.id in self.fail else "ok"
        return TrajectoryGroup(task, [Trajectory(task=task, prompt_ids=[1], completion_ids=[0], loss_mask=[1], logprobs=[-0.5],
                                                 versions=[0], reward=r, status=status if i == 0 else "ok")
                                      for i, r in enumerate(rewards)])


class NoEngine:
    async def update_weights(self, model, version):
        pass


def _rollout(wf, it, rounds=0):
    return SyncRollout(wf, NoEngine(), it, SamplingParams(max_new_tokens=2), group_size=G, seed=0, refill_rounds=rounds)


def _steps(rollout, steps, start=1):
    return [[g.task.id for g in asyncio.run(rollout.next_batch(s)).groups] for s in range(start, start + steps)]


def test_history_counts_flat_rollouts_in_a_row_and_an_informative_one_resets():
    h = FlatHistory(after=2, prob=1.0)
    a, b = _task(0), _task(1)
    h.record(a, False)
    assert h.count(a) == 1 and h.flat_tasks() == 0
    h.record(a, False)
    h.record(b, False)
    assert (h.count(a), h.count(b), h.flat_tasks()) == (2, 1, 1)
    assert h.left_out([a, b, _task(2)], seed=0, epoch=1, keep_at_least=1) == [0]  # only a reached after=2
    h.record(a, True)
    assert h.count(a) == 0 and h.left_out([a, b], seed=0, epoch=1, keep_at_least=1) == []
    # the same task of another source is another task
    assert h.count(_task(1, source="other")) == 0
    with pytest.raises(ValueError, match="after >= 1"):
        FlatHistory(after=0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        FlatHistory(after=1, prob=0.0)


def test_an_epoch_keeps_at_least_one_batch():
    h = FlatHistory(after=1, prob=1.0)
    tasks = [_task(i) for i in range(6)]
    for t in tasks[:4]:
        h.record(t, False)
    assert h.left_out(tasks, seed=0, epoch=1, keep_at_least=2) == [0, 1, 2, 3]
    assert h.left_out(tasks, seed=0, epoch=1, keep_at_least=3) == [] and h.full_epochs == 1


def test_the_kept_fraction_caps_the_left_out_tasks_longest_flat_runs_first():
    h = FlatHistory(after=1, prob=1.0, keep=0.5)
    tasks = [_task(i) for i in range(9)]
    for i, t in enumerate(tasks[:7]):  # t0..t6 flat, t6 the longest run, then t5, t4; t7, t8 never rolled out
        for _ in range(1 + max(0, i - 3)):
            h.record(t, False)
    out = h.left_out(tasks, seed=0, epoch=1, keep_at_least=1)
    # at most 9 - ceil(4.5) = 4 out: t6, t5, t4 by their runs, and one of t0..t3 (count 1) by the seeded tie order
    assert len(out) == 4 and out == sorted(out) and {4, 5, 6} < set(out) and h.capped_epochs == 1
    assert out == h.left_out(tasks, seed=0, epoch=1, keep_at_least=1)  # reproducible
    ties = {tuple(h.left_out(tasks, seed=0, epoch=e, keep_at_least=1)) for e in range(1, 30)}
    assert len(ties) > 1 and all(set(o) - {4, 5, 6} <= {0, 1, 2, 3} for o in ties)  # the tie broken by the epoch's seed
    # under the cap nothing changes: the same draw as without a floor, and no epoch counted capped
    low = FlatHistory(after=1, prob=0.5, keep=0.25)
    free = FlatHistory(after=1, prob=0.5)
    many = [_task(i) for i in range(400)]
    for t in many:
        low.record(t, False)
        free.record(t, False)
    assert low.left_out(many, seed=3, epoch=1, keep_at_least=1) == free.left_out(many, seed=3, epoch=1, keep_at_least=1)
    assert low.capped_epochs == 0
    assert low.metrics(0)["data/skip_flat/capped_epochs"] == 0.0
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        FlatHistory(after=1, keep=1.0)


def test_a_run_with_a_kept_fraction_trains_on_half_and_resumes_exactly():
    tasks = [_task(i) for i in range(8)]
    spread = {"t1", "t2"}

    def make():
        return TaskIterator(tasks, 2, seed=5, history=FlatHistory(after=1, prob=1.0, keep=0.5))

    full_it = make()
    full = _steps(_rollout(TableWorkflow(spread), full_it), 12)
    # every epoch after the first holds 4 of the 8 tasks: t1 and t2 (spread) and two flat ones
    assert all(len(set(step)) == 2 for step in full)
    later = full[4:6], full[6:8], full[8:10], full[10:12]
    assert all({"t1", "t2"} < {t for step in epoch for t in step} and len({t for step in epoch for t in step}) == 4
               for epoch in later)
    assert full_it.metrics()["data/skip_flat/capped_epochs"] == 4.0 and full_it.skipped == 4
    state = full_it.state_dict()
    assert state["skip_flat"]["capped_epochs"] == 4 and state["skip_flat"]["keep"] == 0.5
    for cut in (3, 5, 8):  # around the epoch boundaries
        it = make()
        first = _steps(_rollout(TableWorkflow(spread), it), cut)
        again = make()
        again.load_state_dict(it.state_dict())
        assert first + _steps(_rollout(TableWorkflow(spread), again), 12 - cut, start=cut + 1) == full
        assert again.metrics()["data/skip_flat/capped_epochs"] == 4.0


def test_the_skip_probability_is_seeded_by_seed_and_epoch():
    h = FlatHistory(after=1, prob=0.5)
    tasks = [_task(i) for i in range(400)]
    for t in tasks:
        h.record(t, False)
    e1 = h.left_out(tasks, seed=3, epoch=1, keep_at_least=1)
    assert e1 == h.left_out(tasks, seed=3, epoch=1, keep_at_least=1)  # reproducible
    assert e1 != h.left_out(tasks, seed=3, epoch=2, keep_at_least=1) != h.left_out(tasks, seed=4, epoch=1, keep_at_least=1)
    assert 160 < len(e1) < 240  # about half of 400


def test_later_epochs_leave_out_the_tasks_without_spread():
    tasks = [_task(i) for i in range(8)]
    wf = TableWorkflow(spread={"t1", "t2", "t5", "t6"})
    it = TaskIterator(tasks, 4, seed=0, shuffle=False, history=FlatHistory(after=1, prob=1.0))
    rollout = _rollout(wf, it)
    assert _steps(rollout, 2) == [["t0", "t1", "t2", "t3"], ["t4", "t5", "t6", "t7"]]  # epoch 0: every task
    batch = asyncio.run(rollout.next_batch(3))
    assert [g.task.id for g in batch.groups] == ["t1", "t2", "t5", "t6"]  # epoch 1: only those with spread
    assert batch.metrics["data/skip_flat/skipped"] == 4 and batch.metrics["data/skip_flat/flat"] == 4
    assert it.state_dict()["skipped"] == [0, 3, 4, 7]
    # without the option the rollout records nothing and the metrics are absent
    plain = TaskIterator(tasks, 4, seed=0, shuffle=False)
    assert "data/skip_flat/skipped" not in asyncio.run(_rollout(wf, plain).next_batch(1)).metrics
    assert plain.state_dict() == {"epoch": 0, "index": 4, "seed": 0}


def test_a_group_with_an_infrastructure_failure_is_not_recorded_and_a_refill_surplus_is():
    tasks = [_task(i) for i in range(8)]
    wf = TableWorkflow(spread={"t1", "t2", "t4", "t5"}, fail=frozenset({"t0"}))
    it = TaskIterator(tasks, 4, seed=0, shuffle=False, history=FlatHistory(after=1, prob=1.0))
    batch = asyncio.run(_rollout(wf, it, rounds=1).next_batch(1))
    # t1, t2 of the first batch and t4, t5 of the refill round fill the batch; t6, t7 are the surplus
    assert [g.task.id for g in batch.groups] == ["t0", "t1", "t2", "t3", "t4", "t5"] and wf.calls == [t.id for t in tasks]
    # t0's group had an engine error: no count; t3 and the surplus t6, t7 had no spread
    assert [it.history.count(t) for t in tasks] == [0, 0, 0, 1, 0, 0, 1, 1]


def test_resume_draws_what_the_uninterrupted_run_draws_across_epochs():
    tasks = [_task(i) for i in range(10)]
    spread = {"t1", "t3", "t4", "t8"}

    def make():
        return TaskIterator(tasks, 2, seed=5, history=FlatHistory(after=1, prob=0.7))

    full_it = make()
    full = _steps(_rollout(TableWorkflow(spread), full_it, rounds=2), 14)
    for cut in (3, 5, 9):  # mid-epoch and around the boundaries
        it = make()
        first = _steps(_rollout(TableWorkflow(spread), it, rounds=2), cut)
        state = it.state_dict()
        again = make()
        again.load_state_dict(state)
        assert first + _steps(_rollout(TableWorkflow(spread), again, rounds=2), 14 - cut, start=cut + 1) == full
    assert full_it.epoch >= 3 and full_it.history.flat_tasks() > 0


def test_a_checkpoint_without_skip_state_resumes_and_a_bad_one_is_refused():
    tasks = [_task(i) for i in range(6)]
    it = TaskIterator(tasks, 2, seed=0, history=FlatHistory(after=1))
    it.load_state_dict({"epoch": 1, "index": 2, "seed": 0})  # written before data.skip_flat existed
    assert len(it.next_batch()) == 2 and it.state_dict()["skipped"] == []
    with pytest.raises(ValueError, match="skipped tasks do not fit"):
        it.load_state_dict({"epoch": 1, "index": 2, "seed": 0, "skipped": [9]})
    with pytest.raises(ValueError, match=r"\[source, id, count\]"):
        it.load_state_dict({"epoch": 1, "index": 2, "seed": 0, "skip_flat": {"flat": [["s", "t0"]]}})


def test_a_mixture_shares_one_history_stored_once_and_resumes_exactly():
    a = [_task(i, "a") for i in range(6)]
    b = [_task(i, "b") for i in range(6)]  # the same ids in another source: other tasks
    spread = {"t0", "t1"}

    def make():
        return MixtureIterator({"a": a, "b": b}, {"a": 0.5, "b": 0.5}, 2, seed=1, history=FlatHistory(after=1, prob=1.0))

    full_it = make()
    wf = TableWorkflow(spread)
    full = _steps(_rollout(wf, full_it), 12)
    state = full_it.state_dict()
    assert "skip_flat" in state and not any("skip_flat" in s for s in state["sources"].values())
    # after the first pass each source's order holds only t0 and t1 (the rest had no spread)
    late = [g for step in full[8:] for g in step]
    assert set(late) <= {"t0", "t1"}
    assert full_it.metrics()["data/skip_flat/skipped"] == 8.0
    it = make()
    first = _steps(_rollout(TableWorkflow(spread), it), 7)
    again = make()
    again.load_state_dict(it.state_dict())
    assert first + _steps(_rollout(TableWorkflow(spread), again), 5, start=8) == full


def test_the_config_keys_reach_the_data_order(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(f'{{"id": "q{i}", "question": "q{i}?", "answer": "a"}}\n' for i in range(6)))
    it = load_task_sets(DataConfig(train=str(rows), skip_flat=2, skip_flat_prob=0.6, skip_flat_keep=0.5),
                        seed=0, tasks_per_step=2).iterator
    assert (it.history.after, it.history.prob, it.history.keep) == (2, 0.6, 0.5)
    assert load_task_sets(DataConfig(train=str(rows)), seed=0, tasks_per_step=2).iterator.history is None


def test_config_checks():
    cfg = load_config(None, ["model.path=tiny", "data.skip_flat=2", "data.skip_flat_prob=0.5"])
    assert (cfg.data.skip_flat, cfg.data.skip_flat_prob) == (2, 0.5)
    with pytest.raises(ConfigError, match="rollout.mode=sync"):
        load_config(None, ["model.path=tiny", "data.skip_flat=1", "rollout.mode=async"])
    with pytest.raises(ConfigError, match="skip_flat_prob"):
        load_config(None, ["model.path=tiny", "data.skip_flat=1", "data.skip_flat_prob=0"])
    with pytest.raises(ConfigError, match="data.skip_flat"):
        load_config(None, ["model.path=tiny", "data.skip_flat=-1"])
    assert load_config(None, ["model.path=tiny", "data.skip_flat=1", "data.skip_flat_keep=0.5"]).data.skip_flat_keep == 0.5
    for bad in ("1", "1.5", "-0.1"):
        with pytest.raises(ConfigError, match="skip_flat_keep"):
            load_config(None, ["model.path=tiny", "data.skip_flat=1", f"data.skip_flat_keep={bad}"])
