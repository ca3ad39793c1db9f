"""data.curriculum (data/curriculum.py, evaluate.pass_counts, build._task_sets): the cache file, its
key, the 0 < pass rate < 1 filter over one source and a mixture, and the errors that name the fix."""

from __future__ import annotations

import json

import pytest

from seekrl.build import build_rl, curriculum_cache_key
from seekrl.config import load_config
from seekrl.data.config import DataConfig, DataSource
from seekrl.data.curriculum import keep_filter, read_curriculum, write_curriculum
from seekrl.data.sets import load_task_sets
from seekrl.data.tiny import make_tiny_tasks
from seekrl.errors import ConfigError, DataError
from seekrl.evaluate import pass_counts
from seekrl.types import Task, Trajectory, TrajectoryGroup

KEY = {"model": "m", "data": {"train": "tiny:copy"}, "k": 4, "seed": 0, "temperature": 1.0, "max_new_tokens": 8}


def _counts(tasks, table):
    return [(t, 4, table.get(t.id, 0)) for t in tasks]


def test_cache_round_trip_and_filter(tmp_path):
    tasks = make_tiny_tasks("copy", n=6)
    path = write_curriculum(tmp_path / "c.json", KEY, _counts(tasks, {tasks[0].id: 1, tasks[1].id: 4, tasks[2].id: 3}))
    assert read_curriculum(path, KEY)[(tasks[2].source, tasks[2].id)] == (4, 3)
    keep = keep_filter(path, KEY)
    assert [t.id for t in tasks if keep(t)] == [tasks[0].id, tasks[2].id]  # 4 of 4 and 0 of 4 are dropped
    assert not keep(Task(id="unmeasured", prompt=[], answer="x", source=tasks[0].source))
    assert not keep(Task(id=tasks[0].id, prompt=[], answer="x", source="other"))  # (source, id) is the identity


def test_cache_errors_name_the_fix(tmp_path):
    with pytest.raises(DataError, match="does not exist.*seekrl curriculum"):
        read_curriculum(tmp_path / "missing.json", KEY)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not a curriculum file"):
        read_curriculum(tmp_path / "bad.json", KEY)
    path = write_curriculum(tmp_path / "c.json", KEY, [])
    with pytest.raises(DataError, match=r"k: 4 -> 8.*seekrl curriculum"):
        read_curriculum(path, {**KEY, "k": 8})
    with pytest.raises(DataError, match="model: 'm' -> 'other'"):
        keep_filter(path, {**KEY, "model": "other"})


def test_load_task_sets_filters_one_source_and_a_mixture(tmp_path):
    copy, add = make_tiny_tasks("copy", n=8), make_tiny_tasks("add", n=8)
    kept = {copy[1].id, copy[3].id, copy[6].id, add[2].id}
    path = write_curriculum(tmp_path / "c.json", KEY, [(t, 4, 2 if t.id in kept else 0) for t in copy + add])
    keep = keep_filter(path, KEY)
    d = DataConfig(train="tiny:copy", max_train=8)
    sets = load_task_sets(d, seed=0, tasks_per_step=2, tiny=True, keep=keep)
    assert [t.id for t in sets.train] == [copy[1].id, copy[3].id, copy[6].id]
    assert {t.id for _ in range(6) for t in sets.iterator.next_batch()} <= kept
    unfiltered = load_task_sets(d, seed=0, tasks_per_step=2, tiny=True)
    assert sets.tiny_texts == unfiltered.tiny_texts  # the tiny tokenizer is the one the measurement used
    with pytest.raises(DataError, match="keeps 3 tasks.*fewer than the 4 needed"):
        load_task_sets(d, seed=0, tasks_per_step=4, keep=keep)
    mix = DataConfig(train=[DataSource("tiny:copy", 1.0), DataSource("tiny:add", 1.0)], max_train=8)
    sets = load_task_sets(mix, seed=0, tasks_per_step=2, keep=keep)
    assert {t.id for t in sets.train} == kept
    assert {t.id for _ in range(6) for t in sets.iterator.next_batch()} <= kept
    only_copy = {t.id for t in copy}
    path = write_curriculum(tmp_path / "d.json", KEY, [(t, 4, 2 if t.id in only_copy else 0) for t in copy + add])
    with pytest.raises(DataError, match="source 'tiny:add' keeps 0"):
        load_task_sets(mix, seed=0, tasks_per_step=2, keep=keep_filter(path, KEY))


def _traj(task, status="ok", correct=None):
    t = Trajectory(task=task, prompt_ids=[1], completion_ids=[2], loss_mask=[1], logprobs=[0.0], versions=[0], status=status)
    if correct is not None:
        t.metrics["score/correct"] = correct
    return t


def test_pass_counts_leave_infrastructure_failures_out():
    task = make_tiny_tasks("copy", n=1)[0]
    group = TrajectoryGroup(task, [_traj(task, correct=1.0), _traj(task, correct=0.0), _traj(task, "engine_error"),
                                   _traj(task, correct=1.0)])
    assert pass_counts([group]) == [(task, 3, 2)]


BASE = ["model.path=tiny", "data.train=tiny:copy", "data.max_train=16", "rollout.group_size=2", "rollout.batch_size=4"]


def test_curriculum_config_and_key(tmp_path):
    with pytest.raises(ConfigError, match="curriculum_k"):
        load_config(None, BASE + ["data.curriculum_k=1"])
    cfg = load_config(None, BASE + [f"data.curriculum={tmp_path / 'c.json'}", "data.curriculum_k=4"])
    key = curriculum_cache_key(cfg)
    assert (key["model"], key["k"], key["seed"], key["data"]["train"], key["data"]["max_train"]) == ("tiny", 4, 0, "tiny:copy", 16)
    assert curriculum_cache_key(load_config(None, BASE + ["data.curriculum_k=4", "train.seed=1"]))["seed"] == 1
    assert json.loads(json.dumps(key)) == key


def test_build_rl_stops_before_the_model_on_a_stale_cache(tmp_path, monkeypatch):
    import seekrl.build as build

    def no_model(*a, **k):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(build, "_policy", no_model)
    cfg = load_config(None, BASE + [f"data.curriculum={tmp_path / 'c.json'}", f"log.dir={tmp_path}"])
    with pytest.raises(DataError, match="does not exist"):
        build_rl(cfg)
    write_curriculum(tmp_path / "c.json", {**curriculum_cache_key(cfg), "seed": 5}, [])
    with pytest.raises(DataError, match="seed: 5 -> 0"):
        build_rl(cfg)
