"""`seekrl curriculum` then `seekrl train` with data.curriculum (tiny models, CPU).

A tiny model trained briefly on tiny:copy (the "SFT" starting point) answers one-token copies
sometimes: with rollout.max_new_tokens=1 some questions are solved in some but not all of 8
samples. The curriculum job measures that with `seekrl eval`'s evaluator, caches it, reuses the
cache, measures the same again from the same seed, and the RL run trains only on those tasks
(also under another train.seed, with data.curriculum_seed naming the measurement's)."""

from __future__ import annotations

import json

import pytest

from seekrl import jobs
from seekrl.config import load_config
from seekrl.errors import DataError

COMMON = ["model.max_context=64", "data.train=tiny:copy", "data.max_train=32", "rollout.max_prompt_tokens=32",
          "reward.functions=[qa_f1]", "log.progress=false", "log.tensorboard=false"]


def test_curriculum_measures_caches_and_filters_training(tmp_path, monkeypatch):
    start = jobs.train(load_config(None, COMMON + [
        "model.path=tiny", "model.tiny_hidden=64", "rollout.group_size=8", "rollout.batch_size=64", "rollout.max_new_tokens=4",
        "train.lr=2e-3", "train.steps=120", "train.save_every=0", f"log.dir={tmp_path}", "log.name=start", "log.samples_every=0"]))
    model = start / "checkpoints" / "step_120" / "model"
    cache = tmp_path / "curriculum.json"

    def cfg(*overrides):
        return load_config(None, COMMON + [f"model.path={model}", "rollout.group_size=2", "rollout.batch_size=4",
                                           "rollout.max_new_tokens=1", "data.curriculum_k=8", f"data.curriculum={cache}",
                                           f"log.dir={tmp_path}", *overrides])

    assert jobs.curriculum(cfg("log.name=measure")) == cache
    saved = json.loads(cache.read_text())
    assert saved["key"]["model"] == str(model) and saved["key"]["k"] == 8 and saved["key"]["max_new_tokens"] == 1
    assert len(saved["tasks"]) == 32 and all(e["n"] == 8 and 0 <= e["correct"] <= 8 for e in saved["tasks"])
    kept = {e["id"] for e in saved["tasks"] if 0 < e["correct"] < 8}
    assert len(kept) >= 2 and len(kept) < 32, saved["tasks"]

    # the same config again: the cache is reused, nothing is measured
    monkeypatch.setattr(jobs, "build_curriculum", lambda cfg: pytest.fail("measured again"))
    assert jobs.curriculum(cfg("log.name=measure")) == cache
    monkeypatch.undo()
    # measured again from the same seed (another file): the same counts
    again = tmp_path / "again.json"
    jobs.curriculum(cfg("log.name=measure", f"data.curriculum={again}"))
    assert json.loads(again.read_text())["tasks"] == saved["tasks"]

    run = jobs.train(cfg("log.name=rl", "train.steps=3", "log.samples_every=1", "train.save_every=0"))
    for step in (1, 2, 3):
        rows = [json.loads(line) for line in (run / "trajectories" / f"step_{step}.jsonl").read_text().splitlines()]
        assert rows and {r["task_id"] for r in rows} <= kept

    with pytest.raises(DataError, match="data.curriculum_k|k: 8 -> 4"):  # measured for another k: stops, names the command
        jobs.train(cfg("log.name=rl2", "data.curriculum_k=4", "train.steps=1"))

    # a run with another train.seed checks the measurement's seed: data.curriculum_seed names it
    with pytest.raises(DataError, match="seed"):
        jobs.train(cfg("log.name=rl3", "train.seed=1", "train.steps=1"))
    run = jobs.train(cfg("log.name=rl4", "train.seed=1", "data.curriculum_seed=0", "train.steps=1", "log.samples_every=1",
                         "train.save_every=0"))
    rows = [json.loads(line) for line in (run / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    assert rows and {r["task_id"] for r in rows} <= kept
