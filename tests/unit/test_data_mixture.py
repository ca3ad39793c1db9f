"""data.train as a weighted mixture of sources (seekrl/data/mixture.py, data/sets.py, data/config.py):
draws by weight, reproducible from the seed, exact resume, per-source metrics, and one-line errors;
the plain string form unchanged."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from seekrl.config import load_config
from seekrl.data import TaskIterator
from seekrl.data.config import DataConfig, DataSource
from seekrl.data.mixture import MixtureIterator
from seekrl.data.sets import load_split, load_task_sets
from seekrl.errors import ConfigError, DataError
from seekrl.observe.metrics import undocumented
from seekrl.observe.stats import StatsTracker
from seekrl.train.rl import log_rollout_stats
from seekrl.types import Task, Trajectory


def write_rows(path, n, prefix):
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "question": f"{prefix} question {i}?",
                                        "answer": f"{prefix}{i}"}) + "\n" for i in range(n)))
    return str(path)


@pytest.fixture
def files(tmp_path):
    return {"hotpotqa": write_rows(tmp_path / "hotpotqa.jsonl", 20, "h"), "nq": write_rows(tmp_path / "nq.jsonl", 7, "n")}


def mixture(files, wh=0.7, wn=0.3, **kw) -> DataConfig:
    return DataConfig(train=[DataSource(files["hotpotqa"], wh), DataSource(files["nq"], wn)], **kw)


def ids(batches):
    return [[t.id for t in b] for b in batches]


def test_steps_follow_the_weights_and_tasks_keep_their_source(files):
    sets = load_task_sets(mixture(files), seed=0, tasks_per_step=8)
    assert isinstance(sets.iterator, MixtureIterator) and len(sets.train) == 27
    batches = [sets.iterator.next_batch() for _ in range(200)]
    for b in batches:  # 0.7 * 8 = 5.6: every step has 5 or 6 hotpotqa tasks, 3 or 2 nq tasks
        per_source = Counter(t.source for t in b)
        assert len(b) == 8 and per_source["hotpotqa"] in (5, 6) and per_source["hotpotqa"] + per_source["nq"] == 8
    share = sum(t.source == "hotpotqa" for b in batches for t in b) / (8 * 200)
    assert abs(share - 0.7) < 0.01
    # each source goes through all its tasks before any repeats
    nq = [t.id for b in batches for t in b if t.source == "nq"]
    assert sorted(nq[:7]) == [f"n{i}" for i in range(7)] and sorted(nq[7:14]) == sorted(nq[:7]) and nq[7:14] != nq[:7]
    assert {k: v for k, v in sets.iterator.counts(0).items()} in ({files["hotpotqa"]: 5, files["nq"]: 3},
                                                                  {files["hotpotqa"]: 6, files["nq"]: 2})


def test_reproducible_from_the_seed(files):
    def draw(seed):
        it = load_task_sets(mixture(files), seed=seed, tasks_per_step=4).iterator
        return ids(it.next_batch() for _ in range(30))

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    one = load_task_sets(mixture(files, 1.0, 0.0), seed=0, tasks_per_step=4).iterator  # weight 0: never drawn
    assert {t.source for _ in range(20) for t in one.next_batch()} == {"hotpotqa"}


@pytest.mark.parametrize("cut", [1, 4, 9, 17])
def test_resume_draws_what_the_uninterrupted_run_draws(files, cut):
    full = load_task_sets(mixture(files), seed=7, tasks_per_step=5).iterator
    expected = ids(full.next_batch() for _ in range(25))

    first = load_task_sets(mixture(files), seed=7, tasks_per_step=5).iterator
    done = ids(first.next_batch() for _ in range(cut))
    state = json.loads(json.dumps(first.state_dict()))  # what state.json holds
    assert state["kind"] == "mixture" and state["batches"] == cut

    resumed = load_task_sets(mixture(files), seed=0, tasks_per_step=5).iterator  # the saved seed wins
    resumed.load_state_dict(state)
    assert done + ids(resumed.next_batch() for _ in range(25 - cut)) == expected
    assert resumed.epoch == full.epoch == 25 * 5 // 27


def test_plain_string_is_unchanged(files):
    d = DataConfig(train=files["nq"])
    sets = load_task_sets(d, seed=5, tasks_per_step=3)
    assert type(sets.iterator) is TaskIterator
    ref = TaskIterator(load_split(files["nq"], d, "train", None), 3, seed=5)
    assert ids(sets.iterator.next_batch() for _ in range(12)) == ids(ref.next_batch() for _ in range(12))
    assert sets.iterator.state_dict() == {"epoch": 5, "index": 6, "seed": 5}
    # the two kinds of state do not mix
    mix = load_task_sets(mixture(files), seed=0, tasks_per_step=3).iterator
    with pytest.raises(ValueError, match="not a mixture: data.train was a single source"):
        mix.load_state_dict(sets.iterator.state_dict())
    with pytest.raises(ValueError, match="the saved data state is of a mixture"):
        sets.iterator.load_state_dict(mix.state_dict())
    other = load_task_sets(DataConfig(train=[DataSource(files["nq"], 1.0)]), seed=0, tasks_per_step=3).iterator
    with pytest.raises(ValueError, match="resume with the same sources"):
        other.load_state_dict(mix.state_dict())


def test_generate_and_long_prompts_see_every_source(files):
    d = mixture(files)
    assert [t.source for t in load_split(d.train, d, "train", 5)] == ["hotpotqa"] * 5 + ["nq"] * 5
    sets = load_task_sets(d, seed=0, tasks_per_step=4)
    sets.drop_long_prompts(lambda t: [0] * (50 if t.id in ("h0", "h1", "n3") else 5), max_tokens=10)
    assert sets.dropped == 3 and isinstance(sets.iterator, MixtureIterator)
    drawn = {t.id for _ in range(40) for t in sets.iterator.next_batch()}
    assert drawn.isdisjoint({"h0", "h1", "n3"}) and len(drawn) == 24
    with pytest.raises(ValueError, match=f"source '{files['nq']}' has no task left"):
        load_task_sets(d, seed=0, tasks_per_step=4).drop_long_prompts(lambda t: [0] * (50 if t.source == "nq" else 5), 10)


def test_yaml_and_command_line_forms(files, tmp_path):
    config = tmp_path / "mix.yaml"
    config.write_text(f"data:\n  train: [{{name: {files['hotpotqa']}, weight: 0.7}}, {{name: {files['nq']}, weight: 0.3}}]\n")
    cfg = load_config(config)
    assert cfg.data.train == [DataSource(files["hotpotqa"], 0.7), DataSource(files["nq"], 0.3)]
    again = tmp_path / "saved.yaml"  # the run's config.yaml reads back the same
    again.write_text(cfg.to_yaml())
    assert load_config(again).data.train == cfg.data.train
    line = load_config(None, [f"data.train=[{{name: {files['nq']}}}]"])
    assert line.data.train == [DataSource(files["nq"], 1.0)]
    assert load_config(None, [f"data.train={files['nq']}"]).data.train == files["nq"]


def config_error(value: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"data.train={value}"])
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_mixtures_are_one_line_config_errors():
    assert config_error("[{name: a.jsonl, weight: -0.3}, {name: b.jsonl}]") == (
        "data.train[0].weight: must be a finite number >= 0, got -0.3 ('a.jsonl'); weights are relative shares of each "
        "step's tasks (e.g. 0.7 and 0.3)")
    assert config_error("[{name: a.jsonl, weight: 0}, {name: b.jsonl, weight: 0.0}]") == (
        "data.train: every weight is 0, so no task can be drawn; give at least one source a weight > 0")
    assert "data.train[1].weight: must be a finite number >= 0, got nan" in config_error("[{name: a}, {name: b, weight: .nan}]")
    assert config_error("[{name: a.jsonl, wieght: 0.5}]") == "unknown key 'data.train[0].wieght'; did you mean 'data.train[0].weight'?"
    assert config_error("[{name: a.jsonl, weight: lots}]") == "data.train[0].weight: expected a number, got 'lots'"
    assert "data.train[0]: expected a mapping of key: value" in config_error("[a.jsonl, b.jsonl]")
    assert config_error("[{weight: 1}]").startswith("data.train[0].name is empty")
    assert config_error("[]").startswith("data.train is an empty list")
    assert config_error("[{name: a.jsonl}, {name: a.jsonl}]") == (
        "data.train[1]: 'a.jsonl' is listed twice (also data.train[0]); list it once, with the weights added")
    assert config_error("[{name: a.jsonl}, {name: 'tiny:cpy'}]").startswith("data.train[1]: unknown tiny task 'cpy'")
    assert config_error("[{name: 'tiny:copy[5:2]'}]").startswith("data.train[0]: 'tiny:copy[5:2]' selects no rows")


def test_unknown_sources_and_bad_rows_name_the_entry(files, tmp_path):
    with pytest.raises(DataError) as e:
        load_task_sets(DataConfig(train=[DataSource(files["nq"]), DataSource("nope.jsonl")]), seed=0, tasks_per_step=2)
    assert str(e.value).startswith("data.train[1]: nope.jsonl: no such file or folder, and not a builtin data set")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q?", "answer": "a"}\n{"question": \n')
    with pytest.raises(DataError) as e:
        load_task_sets(DataConfig(train=[DataSource(files["nq"]), DataSource(str(bad))]), seed=0, tasks_per_step=2)
    assert str(e.value).startswith(f"data.train[1]: {bad}:2: row is not valid JSON")
    with pytest.raises(ValueError, match="every mixture weight is 0"):
        MixtureIterator({"a": [Task("x", [], "")]}, {"a": 0.0}, 1)


def traj(source: str, reward: float, parts: dict) -> Trajectory:
    task = Task(id=f"{source}-{reward}", prompt=[], answer="a", source=source)
    return Trajectory(task, [1], [2], [1], [0.0], [0], reward=reward, reward_parts=parts)


def test_per_source_reward_and_em_metrics():
    trajs = [traj("hotpotqa", 1.0, {"qa_em": 1.0, "qa_f1": 1.0}), traj("hotpotqa", 0.5, {"qa_em": 0.0, "qa_f1": 0.5}),
             traj("nq", 0.0, {"qa_em": 0.0, "qa_f1": 0.0})]
    stats = StatsTracker()
    log_rollout_stats(stats, trajs)
    out = stats.export()
    assert (out["reward/hotpotqa/mean"], out["reward/hotpotqa/em"]) == (0.75, 0.5)
    assert (out["reward/nq/mean"], out["reward/nq/em"]) == (0.0, 0.0)
    assert undocumented(out) == []
    # a RewardResult's <name>/em part counts; without an EM part, or with one source, no per-source EM
    stats = StatsTracker()
    log_rollout_stats(stats, [traj("a", 1.0, {"search_r1": 1.0, "search_r1/em": 1.0}), traj("b", 0.2, {"search_r1/em": 0.0})])
    out = stats.export()
    assert (out["reward/a/em"], out["reward/b/em"]) == (1.0, 0.0)
    stats = StatsTracker()
    log_rollout_stats(stats, [traj("a", 1.0, {"qa_f1": 1.0}), traj("b", 0.2, {"qa_f1": 0.2})])
    out = stats.export()
    assert "reward/a/em" not in out and out["reward/a/mean"] == 1.0
    stats = StatsTracker()
    log_rollout_stats(stats, [traj("a", 1.0, {"qa_em": 1.0})])
    assert not any(k.startswith("reward/a/") for k in stats.export())


def test_reward_part_spread_is_measured_per_group():
    # group 0: F1 differs, retrieval equal; group 1: retrieval differs, F1 equal; group 2 (one member): no spread
    parts = [{"qa_f1": 0.0, "ret": 1.0}, {"qa_f1": 0.5, "ret": 1.0},
             {"qa_f1": 0.2, "ret": 0.0}, {"qa_f1": 0.2, "ret": 0.5}, {"qa_f1": 0.2, "ret": 0.5},
             {"qa_f1": 1.0, "ret": 0.0}]
    trajs = [traj("s", p["qa_f1"] + 0.5 * p["ret"], p) for p in parts]
    stats = StatsTracker()
    log_rollout_stats(stats, trajs, [0, 0, 1, 1, 1, 2])
    out = stats.export()
    assert out["reward/qa_f1/spread_frac"] == pytest.approx(2 / 6)
    assert out["reward/ret/spread_frac"] == pytest.approx(3 / 6)
    assert undocumented(out) == []
    # without group ids (an evaluation's trajectories) there is no spread to measure
    stats = StatsTracker()
    log_rollout_stats(stats, trajs)
    assert not any(k.endswith("/spread_frac") for k in stats.export())
