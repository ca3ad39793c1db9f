"""A data mixture through the RL loop (tiny model, CPU): each step's tasks follow the weights, the
per-source metrics are logged, and a run cut and resumed draws the same tasks and ends with the
same metrics as an uninterrupted one."""

from __future__ import annotations

import json
from collections import Counter

from seekrl.config import load_config
from seekrl.jobs import train
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import reproducible, undocumented

MIXTURE = "data.train=[{name: 'tiny:copy', weight: 3}, {name: 'tiny:add', weight: 1}]"


def cfg(tmp_path, name, *overrides):
    base = [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", MIXTURE, "data.max_train=10",
        "rollout.group_size=2", "rollout.batch_size=8", "rollout.max_new_tokens=6", "rollout.max_prompt_tokens=32",
        "reward.functions=[qa_f1, qa_em]", "train.lr=1e-3", "train.steps=5", "train.save_every=1", f"log.dir={tmp_path}",
        f"log.name={name}", "log.progress=false", "log.tensorboard=false", "log.samples_every=1",
    ]
    return load_config(None, base + list(overrides))


def _comparable(rows):
    return [reproducible(r) for r in rows]


def _step_tasks(run, step):
    rows = [json.loads(line) for line in (run / "trajectories" / f"step_{step}.jsonl").read_text().splitlines()]
    return [r["task_id"] if "task_id" in r else r["task"]["id"] for r in rows]


def test_mixture_run_resumes_to_the_same_tasks_and_metrics(tmp_path):
    full = train(cfg(tmp_path, "full"))
    rows = read_metrics(full)
    assert undocumented({k for r in rows for k in r}) == []
    for r in rows:
        if r["step"] > 0:  # 4 tasks a step, 3 of them tiny:copy (weight 3 of 4)
            assert {"reward/tiny_copy/mean", "reward/tiny_add/mean", "reward/tiny_copy/em", "reward/tiny_add/em"} <= set(r)
    tasks = [_step_tasks(full, s) for s in range(1, 6)]
    for step in tasks:
        kinds = Counter(t.split("-")[1] for t in step)  # G=2 samples per task
        assert kinds == {"copy": 6, "add": 2}, step

    train(cfg(tmp_path, "cut", "train.max_steps_this_run=2"))
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["data"]["kind"] == "mixture" and state["data"]["batches"] == 2
    resumed = train(cfg(tmp_path, "cut"))
    assert _comparable(read_metrics(resumed)) == _comparable(rows)
    assert [_step_tasks(resumed, s) for s in range(1, 6)] == tasks


def test_async_rollout_draws_the_sync_data_order(tmp_path):
    sync = train(cfg(tmp_path, "sync", "train.steps=3"))
    asynchronous = train(cfg(tmp_path, "async", "train.steps=3", "rollout.mode=async", "rollout.max_staleness=1"))
    assert [sorted(_step_tasks(asynchronous, s)) for s in (1, 2, 3)] == [sorted(_step_tasks(sync, s)) for s in (1, 2, 3)]
    state = json.loads((asynchronous / "checkpoints" / "step_3" / "state.json").read_text())
    assert state["data"]["batches"] == 3  # the first step not trained, though later tasks may have been pulled
