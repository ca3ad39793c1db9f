"""The rank-splitting pieces that need no process group: shards, micro-batch padding, stats merge,
the batch codec, and the safe reader of DCP's pickled index."""

from __future__ import annotations

import os
import pickle
import random

import pytest
import torch

from seekrl.errors import CheckpointError
from seekrl.observe.stats import StatsTracker
from seekrl.parallel.controller import decode_batch, encode_batch
from seekrl.parallel.ranks import Ranks
from seekrl.rollout.base import RolloutBatch
from seekrl.train.batch import TokenBatch
from seekrl.train.plan import MicroBatchPlan, shard_rows
from seekrl.types import Task, Trajectory, TrajectoryGroup


def trajs(n_prompts=5, g=4, seed=0):
    rng = random.Random(seed)
    out = []
    for k in range(n_prompts):
        task = Task(id=f"t{k}", prompt=[{"role": "user", "content": str(k)}], answer=["a", "b"], meta={"k": k})
        prompt = [rng.randrange(1, 50) for _ in range(rng.randint(2, 20))]
        for _ in range(g):
            n = rng.randint(1, 30)
            out.append(Trajectory(task, prompt, [rng.randrange(1, 50) for _ in range(n)], [1] * n, [-0.5] * n, [0] * n,
                                  reward=rng.random(), metrics={"turns": 1.0}))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_shard_rows_partition_balanced_and_keep_groups(world):
    ts = trajs()
    batch = TokenBatch.from_trajectories(ts)
    idx = list(range(len(ts)))[::-1]
    parts = shard_rows(batch, idx, world)
    assert sorted(i for p in parts for i in p) == sorted(idx) and len(parts) == world
    assert parts == shard_rows(batch, idx, world)  # deterministic: every rank computes every rank's share
    for p in parts:
        assert p == [i for i in idx if i in p]  # in idx order
    if world <= 5:  # enough prompts: the G rows of a prompt stay on one rank
        owner = {i: r for r, p in enumerate(parts) for i in p}
        for k in range(5):
            assert len({owner[i] for i in range(4 * k, 4 * k + 4)}) == 1
    cost = [sum(len(ts[i].prompt_ids) // 4 + len(ts[i].completion_ids) for i in p) for p in parts]
    if world == 2:
        assert max(cost) - min(cost) <= max(len(t.prompt_ids) + 4 * 30 for t in ts)  # within one unit


def test_rank_micro_batches_pad_to_the_longest_plan():
    batch = TokenBatch.from_trajectories(trajs())
    idx = list(range(len(batch)))

    def plan(ranks):
        return MicroBatchPlan(64, 0, torch.device("cpu"), share_prefix=True, ranks=ranks)

    counts, real_rows = [], []
    for rank in range(3):
        mbs = list(plan(Ranks(rank=rank, world=3)).micro_batches(batch, idx))
        counts.append(len(mbs))
        real_rows += [i for mb in mbs if not mb.dummy for i in mb.index]
        assert all(mb.prompt_ids_UP is not None for mb in mbs)  # every micro-batch takes the two-pass layout
    assert len(set(counts)) == 1  # the same number of passes on every rank
    assert sorted(real_rows) == idx  # every row exactly once, over the ranks
    one = list(plan(Ranks()).micro_batches(batch, idx))
    assert not any(mb.dummy for mb in one) and sorted(i for mb in one for i in mb.index) == idx


def test_stats_merge_equals_one_tracker():
    one, parts = StatsTracker(), [StatsTracker() for _ in range(3)]
    rng = random.Random(1)
    for k in range(9):
        w, v, xs = rng.random(), rng.uniform(-1, 1), [rng.random() for _ in range(5)]
        for t in (one, parts[k % 3]):
            t.add_weighted(w, loss=v)
            t.add_max(ratio_max=v)
            t.add_dist("reward", xs)
            t.add_masked("entropy", torch.tensor(xs), torch.tensor([1, 0, 1, 1, 0]))
    merged = StatsTracker()
    merged.merge([p.state() for p in parts])
    a, b = one.export(), merged.export()
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) < 1e-12, k


def test_batch_codec_round_trip():
    ts = trajs(2, 2)
    batch = RolloutBatch([TrajectoryGroup(ts[0].task, ts[:2]), TrajectoryGroup(ts[2].task, ts[2:])], {"rollout/queue": 3.0})
    back = decode_batch(encode_batch(batch))
    assert back.metrics == batch.metrics
    assert [[t.__dict__ for t in g.trajectories] for g in back.groups] == [[t.__dict__ for t in g.trajectories] for g in batch.groups]


def test_dcp_metadata_reader_refuses_code(tmp_path):
    """DCP's index is a pickle: the reader admits DCP's classes and refuses anything else."""
    from seekrl.train.checkpoint_dcp import read_dcp_metadata

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError) as e:
        read_dcp_metadata(tmp_path)
    assert "system" in e.value.reason
    assert not (tmp_path / "pwned").exists()
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(6.0).reshape(2, 3)}, checkpoint_id=str(tmp_path / "ok"))
    meta = read_dcp_metadata(tmp_path / "ok")  # a real index loads
    assert "w" in meta.state_dict_metadata


def test_rank_errors_one_line_naming_the_rank(monkeypatch, capsys):
    from seekrl.errors import ConfigError
    from seekrl.parallel.ranks import rank_errors

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as e, rank_errors():
        raise RuntimeError("Connection closed by peer [127.0.0.1]:4242\nmore detail")
    assert e.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "seekrl: error: rank 1 of 2 failed: RuntimeError: Connection closed by peer [127.0.0.1]:4242"
    with pytest.raises(SystemExit) as e, rank_errors():
        raise ConfigError("train.fsdp: 'x' is not one of full, hybrid, none")
    assert e.value.code == 2 and "Traceback" not in capsys.readouterr().err  # bad input: the line only
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError), rank_errors():  # one process: unchanged
        raise RuntimeError("x")
