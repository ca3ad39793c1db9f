"""rollout.refill through the RL loop (tiny model, CPU): each step hands the trainer its draw of the
data order up to tasks_per_step groups with reward spread, no task twice; the metrics match the
trajectory files; a run cut after refills and resumed samples the same tasks and tokens and ends
with the same metrics as an uninterrupted one; the first batch of a step is the one without refill.

With a random tiny policy and the word-F1 reward most groups score 0 throughout, so the four
steps below refill (some fill the batch with a surplus, one crosses the epoch boundary and skips
repeats, one runs out of rounds)."""

from __future__ import annotations

import json
from itertools import groupby

import torch

from seekrl.algo.advantages import zero_std_group_mask
from seekrl.config import load_config
from seekrl.jobs import train
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import reproducible, undocumented

G, B = 8, 4


def cfg(tmp_path, name, *overrides):
    base = [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy", "data.max_train=40",
        f"rollout.group_size={G}", f"rollout.batch_size={G * B}", "rollout.max_new_tokens=6", "rollout.max_prompt_tokens=32",
        "reward.functions=[qa_f1]", "train.lr=1e-3", "train.steps=4", "train.save_every=1", f"log.dir={tmp_path}",
        f"log.name={name}", "log.progress=false", "log.tensorboard=false", "log.samples_every=1", "log.samples_groups=1000",
        "algo.filter_zero_std=true", "rollout.refill=true", "rollout.max_refill_rounds=3",
    ]
    return load_config(None, base + list(overrides))


def _comparable(rows):
    return [reproducible(r) for r in rows]


def _groups(run, step):
    rows = [json.loads(line) for line in (run / "trajectories" / f"step_{step}.jsonl").read_text().splitlines()]
    return [(task, [(r["reward"], r["status"], r["completion"]) for r in members])
            for task, members in ((k, list(v)) for k, v in groupby(rows, key=lambda r: r["task_id"]))]


def _informative(group) -> bool:
    rewards = [r for r, status, _ in group[1] if status == "ok"]
    return len(rewards) > 1 and bool(zero_std_group_mask(torch.tensor(rewards), torch.zeros(len(rewards), dtype=torch.long)).all())


def test_refill_run_fills_batches_and_resumes_to_the_same_tasks_tokens_and_metrics(tmp_path):
    full = train(cfg(tmp_path, "full"))
    rows = [r for r in read_metrics(full) if r["step"] > 0]
    assert undocumented({k for r in rows for k in r}) == []
    drawn = 0
    for r in rows:
        groups = _groups(full, r["step"])
        assert all(len(members) == G for _, members in groups)
        assert len({task for task, _ in groups}) == len(groups)  # no task twice in a step
        informative = [_informative(g) for g in groups]
        assert sum(informative) == B - r["rollout/refill/short"]  # the batch size, unless the rounds ran out
        if r["rollout/refill/short"] == 0:
            assert informative[-1]  # the draw is cut right after the B-th informative group
        assert r["rollout/refill/dropped_groups"] == informative.count(False)
        assert r["rollout/refill/dropped_frac"] == informative.count(False) / len(groups)
        assert r["rollout/kept_frac"] == sum(informative) / len(groups)  # the filter dropped exactly those
        assert len(groups) + r["rollout/refill/surplus"] == B + r["rollout/refill/tasks"]
        assert r["rollout/refill/rounds"] <= 3
        drawn += B * (1 + r["rollout/refill/rounds"])
    # the constructed run exercises every branch: a full batch with a surplus, a skipped repeat, rounds run out
    assert any(r["rollout/refill/surplus"] for r in rows) and any(r["rollout/refill/repeats"] for r in rows)
    assert any(r["rollout/refill/short"] for r in rows) and any(r["rollout/refill/short"] == 0 for r in rows)
    # `seekrl compare --by-run` reads the same files: a task "rewards differed" iff some step trained on its group
    from seekrl.compare import run_labels

    label, counts = run_labels(full)
    spread: dict[str, bool] = {}
    for r in rows:
        for task, members in _groups(full, r["step"]):
            spread[task] = spread.get(task, False) or _informative((task, members))
    assert counts["tasks"] == len(spread) and counts["rewards differed"] == sum(spread.values()) > 0
    assert {t: label(("", t)) for t in spread} == {t: "rewards differed" if v else "rewards equal" for t, v in spread.items()}
    state = json.loads((full / "checkpoints" / "step_4" / "state.json").read_text())["data"]
    assert state["epoch"] * 40 + state["index"] == drawn  # every task drawn counts (drop_last: 40 = 10 batches)

    train(cfg(tmp_path, "cut", "train.max_steps_this_run=2"))
    cut_state = json.loads((tmp_path / "cut" / "checkpoints" / "step_2" / "state.json").read_text())["data"]
    assert cut_state["index"] == B * sum(1 + r["rollout/refill/rounds"] for r in rows[:2]) > 2 * B
    resumed = train(cfg(tmp_path, "cut"))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))
    assert [_groups(resumed, s) for s in range(1, 5)] == [_groups(full, s) for s in range(1, 5)]  # tasks and tokens


def test_refill_round_zero_is_the_step_without_refill(tmp_path):
    on = train(cfg(tmp_path, "refilled", "train.steps=1"))
    off = train(cfg(tmp_path, "plain", "train.steps=1", "rollout.refill=false"))
    assert _groups(on, 1)[:B] == _groups(off, 1)
    assert not any("refill" in k for r in read_metrics(off) for k in r)
    assert json.loads((off / "checkpoints" / "step_1" / "state.json").read_text())["data"]["index"] == B


def test_skip_flat_run_leaves_out_tasks_without_spread_and_resumes_exactly(tmp_path):
    """data.skip_flat=1 at probability 1: a task whose logged group had no spread is never drawn
    again (its next epoch leaves it out), unless an epoch had to keep every task to fill a batch;
    a run cut mid-way resumes to the same tasks, tokens and metrics."""
    skip = ["data.skip_flat=1", "data.skip_flat_prob=1.0", "data.max_train=24", "train.steps=5"]
    full = train(cfg(tmp_path, "full", *skip))
    rows = [r for r in read_metrics(full) if r["step"] > 0]
    assert undocumented({k for r in rows for k in r}) == []
    flat_seen: set[str] = set()
    for r in rows:
        groups = _groups(full, r["step"])
        assert not flat_seen & {task for task, _ in groups}
        flat_seen |= {task for task, members in groups if not _informative((task, members))}
    assert flat_seen
    assert rows[-1]["epoch"] >= 2 and max(r["data/skip_flat/skipped"] for r in rows) > 0
    assert all(r["data/skip_flat/full_epochs"] == 0 for r in rows)
    state = json.loads((full / "checkpoints" / "step_5" / "state.json").read_text())["data"]
    assert state["skip_flat"]["flat"] and len(state["skipped"]) == rows[-1]["data/skip_flat/skipped"]

    train(cfg(tmp_path, "cut", *skip, "train.max_steps_this_run=3"))
    resumed = train(cfg(tmp_path, "cut", *skip))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))
    assert [_groups(resumed, s) for s in range(1, 6)] == [_groups(full, s) for s in range(1, 6)]
