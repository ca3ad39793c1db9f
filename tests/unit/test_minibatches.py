"""Minibatches (train.minibatches) are made of whole groups: a task's rows, which share a prompt
(and with answer branches an episode's history), stay in one optimizer step, as verl counts its
mini-batch in prompts; every row trains once an epoch."""

from __future__ import annotations

import pytest
import torch

from seekrl.build import policy_trainer
from seekrl.config import load_config
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.optim import minibatch_indices
from seekrl.types import Task, Trajectory

from tests.unit.test_nonfinite import _model


def _steps(n, epochs, minibatches, groups, seed=0):
    return list(minibatch_indices(n, epochs, minibatches, torch.Generator().manual_seed(seed), groups))


def test_each_minibatch_is_whole_groups_and_every_row_trains_once_an_epoch():
    groups = [g for g in (5, 1, 4, 0, 3, 2) for _ in range(4)]  # 6 groups of 4 rows, not in id order
    steps = _steps(24, 2, 3, groups)
    assert [e for e, _ in steps] == [0, 0, 0, 1, 1, 1]
    for epoch in (0, 1):
        minis = [idx for e, idx in steps if e == epoch]
        assert sorted(i for idx in minis for i in idx) == list(range(24))  # every row once
        assert [len(idx) for idx in minis] == [8, 8, 8]  # two groups each
        for idx in minis:
            assert idx == sorted(idx)
            for g in {groups[i] for i in idx}:  # a group it holds, it holds whole
                assert {i for i, h in enumerate(groups) if h == g} <= set(idx)
    dealt = {tuple(tuple(idx) for _, idx in _steps(24, 1, 3, groups, seed=s)) for s in range(6)}
    assert len(dealt) > 1  # the groups are shuffled, not dealt in a fixed order
    assert _steps(24, 2, 3, groups) == steps  # the trainer's generator decides: reproducible
    # uneven: 5 groups into 2 minibatches -> 2 and 3 groups; fewer groups than minibatches -> rows
    uneven = _steps(10, 1, 2, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert sorted(len(idx) for _, idx in uneven) == [4, 6]
    few = _steps(8, 1, 4, [0] * 4 + [1] * 4)
    assert [len(idx) for _, idx in few] == [2, 2, 2, 2] and sorted(i for _, idx in few for i in idx) == list(range(8))
    # one minibatch: every row in order, and no draw from the generator (runs without minibatches are unchanged)
    gen = torch.Generator().manual_seed(7)
    assert list(minibatch_indices(6, 2, 1, gen, [0, 0, 1, 1, 2, 2])) == [(0, list(range(6))), (1, list(range(6)))]
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(7).get_state())
    # no groups: rows, as before
    assert sorted(len(idx) for _, idx in _steps(10, 1, 2, None)) == [5, 5]


def test_minibatch_size_counts_tasks_per_step_and_is_checked_against_the_batch():
    """train.minibatch_size (verl's ppo_mini_batch_size, in tasks): ceil(groups / size) optimizer
    steps, fewer when groups were filtered out; one of the two keys; it divides the batch's tasks."""
    from seekrl.config import ConfigError
    from seekrl.train.optim import minibatch_count

    t = load_config(None, ["rollout.batch_size=16", "rollout.group_size=2", "train.minibatch_size=2"]).train
    assert minibatch_count(t, [g for g in range(8) for _ in range(2)]) == 4  # 8 tasks of 2 rows
    assert minibatch_count(t, [0, 0, 3, 3, 5, 5]) == 2 and minibatch_count(t, [4, 4]) == 1  # filtered batches
    assert minibatch_count(load_config(None, ["train.minibatches=4"]).train, [0, 0]) == 4  # the count, as before
    with pytest.raises(ConfigError, match=r"train.minibatch_size \(3\) must divide the batch's 8 tasks"):
        load_config(None, ["rollout.batch_size=16", "rollout.group_size=2", "train.minibatch_size=3"])
    with pytest.raises(ConfigError, match="both split the batch; keep one"):
        load_config(None, ["rollout.batch_size=16", "rollout.group_size=2", "train.minibatch_size=2", "train.minibatches=2"])


@pytest.mark.parametrize("split", [["train.minibatches=2"], ["train.minibatch_size=4"]])
def test_the_policy_update_splits_the_batch_by_task(monkeypatch, split):
    cfg = load_config(None, ["train.lr=1e-2", *split, "rollout.batch_size=16", "rollout.group_size=2",
                             "train.micro_batch_tokens=64"])
    trainer = policy_trainer(cfg, _model(), 0, total_steps=10)
    g = torch.Generator().manual_seed(0)
    trajs, group_ids = [], []
    for task in range(8):  # 8 tasks of 2 rows, interleaved as the rows of a refilled batch can be
        prompt = torch.randint(1, 32, (5,), generator=g).tolist()
        for _ in range(2):
            t = Trajectory(Task(str(task), [], ""), list(prompt), [], [], [], [])
            t.append(torch.randint(1, 32, (4,), generator=g).tolist(), sampled=True, logprobs=[-3.0] * 4, version=0)
            trajs.append(t)
            group_ids.append(task)
    order = list(range(0, 16, 2)) + list(range(1, 16, 2))
    trajs, group_ids = [trajs[i] for i in order], [group_ids[i] for i in order]
    batch = TokenBatch.from_trajectories(trajs, group_ids)
    batch.old_logp_BC, batch.adv_BC = batch.behav_logp_BC, pad_completion([[1.0, -1.0, 0.5, 0.0]] * 16, batch.width)
    seen = []
    plan_rows = type(trainer.plan).micro_batches

    def record(plan, b, idx):
        seen.append(list(idx))
        return plan_rows(plan, b, idx)

    monkeypatch.setattr(type(trainer.plan), "micro_batches", record)
    trainer.update(batch, StatsTracker())
    assert len(seen) == 2 and sorted(i for idx in seen for i in idx) == list(range(16))
    for idx in seen:
        tasks = [group_ids[i] for i in idx]
        assert len(set(tasks)) == 4 and all(tasks.count(t) == 2 for t in tasks)  # both rows of each of four tasks
