"""`seekrl compare` (seekrl/compare.py): per-task scores from eval trajectories, the paired
bootstrap of each later eval and of the seeds' mean, and its one-line errors."""

from __future__ import annotations

import json

import pytest

from seekrl.cli import main
from seekrl.compare import compare_evals, compare_markdown, compare_scores, paired_bootstrap, task_scores
from seekrl.errors import DataError


def write_eval(folder, scores: dict[str, list[float]], nested: bool = False, source: str = "dev"):
    """An eval folder as `seekrl eval` writes it: one record per sample, score/em and score/f1
    (a task "src:id" is of data set src)."""
    out = folder / "eval" / ("eval" if nested else "")
    out.mkdir(parents=True, exist_ok=True)
    with (out / "trajectories.jsonl").open("w") as f:
        for task, samples in scores.items():
            for k, em in enumerate(samples):
                src, _, tid = task.rpartition(":")
                f.write(json.dumps({"task_id": tid, "source": src or source, "sample": k, "reward": 2 * em, "metrics": {"score/em": em, "score/f1": em / 2}}) + "\n")
    return folder


def test_task_scores_average_each_task_s_samples_and_follow_nested_eval_folders(tmp_path):
    write_eval(tmp_path / "a", {"q1": [1.0, 0.0, 1.0, 1.0], "q2": [0.0, 0.0]}, nested=True)  # log.dir=X log.name=eval
    assert task_scores(tmp_path / "a") == {("dev", "q1"): 0.75, ("dev", "q2"): 0.0}
    assert task_scores(tmp_path / "a", "f1") == {("dev", "q1"): 0.375, ("dev", "q2"): 0.0}
    assert task_scores(tmp_path / "a" / "eval" / "eval" / "trajectories.jsonl", "reward") == {("dev", "q1"): 1.5, ("dev", "q2"): 0.0}
    # a task is its data set and its id: two data sets' "q1" stay two tasks
    write_eval(tmp_path / "b", {"nq:q1": [1.0], "hotpotqa:q1": [0.0, 0.0]})
    assert task_scores(tmp_path / "b") == {("nq", "q1"): 1.0, ("hotpotqa", "q1"): 0.0}


def test_an_eval_that_cannot_be_compared_is_one_line_naming_the_file_and_line(tmp_path):
    f = write_eval(tmp_path / "a", {"q1": [1.0], "q2": [0.0]}) / "eval" / "trajectories.jsonl"
    with pytest.raises(DataError, match="no score/xyz; --metric is one of reward, em, f1$"):
        task_scores(f, "xyz")
    f.write_text(f.read_text() + "{not json\n")
    with pytest.raises(DataError, match=rf"{f}:3: row is not valid JSON"):
        task_scores(f)
    with pytest.raises(DataError, match="no trajectories.jsonl"):
        task_scores(tmp_path / "missing")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no episodes"):
        task_scores(tmp_path / "empty.jsonl")


def test_each_gain_is_the_paired_mean_difference_with_an_interval_around_it():
    base = {f"q{i}": float(i % 2) for i in range(40)}
    after = {f"q{i}": float(i % 4 == 2 or i % 8 == 1) for i in range(40)}  # 10 tasks up (0 -> 1), 15 down (1 -> 0)
    res = compare_scores(base, {"a": after}, resamples=2000)
    g = res["gains"]["a"]
    diffs = [after[k] - base[k] for k in base]
    assert g["mean"] == pytest.approx(sum(diffs) / 40) and g["n"] == 40 == res["n"]
    assert (g["up"], g["down"]) == (10, 15) and g["mean"] == pytest.approx(-5 / 40)
    assert g["before"] == 0.5 and g["after"] == pytest.approx(sum(after.values()) / 40)
    assert g["ci95"][0] < g["mean"] < g["ci95"][1]
    assert "mean" not in res  # one later eval: no mean of several
    same = compare_scores(base, {"a": dict(base)}, resamples=500)["gains"]["a"]
    assert same["mean"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["up"] == same["down"] == 0
    allup = compare_scores({k: 0.0 for k in base}, {"a": {k: 1.0 for k in base}}, resamples=500)["gains"]["a"]
    assert allup["ci95"][0] == 1.0


def test_the_mean_of_seeds_pairs_each_task_s_mean_and_leaves_out_tasks_some_eval_lacks():
    base = {f"q{i}": 0.0 for i in range(30)}
    s0 = {f"q{i}": float(i < 12) for i in range(30)}
    s1 = {f"q{i}": float(6 <= i < 15) for i in range(29)}  # one task fewer: left out of every comparison
    res = compare_scores(base, {"s0": s0, "s1": s1}, resamples=2000, seed=3)
    assert res["n"] == 29 and res["left_out"] == {"base": 1, "s0": 1, "s1": 0}
    m = res["mean"]
    assert m["evals"] == 2
    assert m["mean"] == pytest.approx((res["gains"]["s0"]["mean"] + res["gains"]["s1"]["mean"]) / 2)
    mean_after = [(s0[t] + s1[t]) / 2 for t in sorted(s1)]  # in task-id order, as the bootstrap resamples them
    assert m == {**paired_bootstrap([0.0] * 29, mean_after, 2000, 3), "before": 0.0, "after": pytest.approx(sum(mean_after) / 29),
                 "evals": 2}
    md = compare_markdown({"metric": "em", **res})
    assert "| mean of 2 |" in md and "left out, scored by only some: base 1, s0 1" in md
    with pytest.raises(DataError, match="share no task"):
        compare_scores({"a": 1.0}, {"x": {"b": 1.0}})


def test_seekrl_compare_prints_the_table_and_writes_json(tmp_path, capsys):
    tasks = [f"q{i}" for i in range(20)]
    base = write_eval(tmp_path / "sft", {t: [0.0] for t in tasks})
    s0 = write_eval(tmp_path / "s0", {t: [float(i < 5)] for i, t in enumerate(tasks)})
    s1 = write_eval(tmp_path / "s1", {t: [float(i < 3)] for i, t in enumerate(tasks)}, nested=True)
    assert main(["compare", str(base), str(s0), str(s1), "--resamples", "1000", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert f"| {s0} | 0.000 | 0.250 | +25.0 |" in out and f"| {s1} | 0.000 | 0.150 | +15.0 |" in out
    assert "| mean of 2 | 0.000 | 0.200 | +20.0 |" in out and "20 tasks scored by every eval" in out
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved == json.loads(json.dumps(compare_evals(base, [s0, s1], resamples=1000)))
    assert main(["compare", str(base), str(s0), "--metric", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--metric is one of reward, em, f1" in err
    assert main(["compare", str(base), str(s0), "--resamples", "10"]) == 2
    assert main(["compare", str(base), str(s0), str(s0)]) == 2
    assert "given twice" in capsys.readouterr().err


def test_per_source_compares_each_data_set_of_a_multi_source_eval(tmp_path):
    nq = [f"nq:{i}" for i in range(10)]
    hp = [f"hotpotqa:{i}" for i in range(10)]  # the same ids as nq's
    base = write_eval(tmp_path / "sft", {t: [0.0] for t in nq + hp})
    after = write_eval(tmp_path / "grpo", {**{t: [1.0] for t in nq[:4]}, **{t: [0.0] for t in nq[4:]},
                                           **{t: [0.0] for t in hp[:9]}})  # hotpotqa:9 not scored: left out
    res = compare_evals(base, [after], resamples=500, per_source=True)
    assert res["n"] == 19 and res["left_out"] == {"base": 1, str(after): 0}
    assert res["gains"][str(after)]["mean"] == pytest.approx(4 / 19)
    by = res["by_source"]
    assert list(by) == ["hotpotqa", "nq"]
    assert by["nq"]["gains"][str(after)]["mean"] == pytest.approx(0.4) and by["nq"]["n"] == 10
    assert by["hotpotqa"]["gains"][str(after)]["mean"] == 0.0 and by["hotpotqa"]["n"] == 9
    md = compare_markdown(res)
    assert "\nnq:\n" in md and "\nhotpotqa:\n" in md and "| +40.0 |" in md
    assert "by_source" not in compare_evals(base, [after], resamples=500)


def test_by_compares_each_value_of_a_field_of_the_tasks_rows(tmp_path, capsys):
    """`--by type`: one table a question type, read from the rows the evals ran on (the base
    eval's saved data.eval by default, or --tasks); rows lacking the field are "(none)"."""
    rows = [{"_id": f"q{i}", "question": f"question {i}?", "answer": "x", "type": "bridge" if i < 12 else "comparison",
             "level": {"hard": "h"} if i % 2 else {}} for i in range(20)]
    rows.append({"_id": "q20", "question": "q?", "answer": "x"})  # no type
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [f"q{i}" for i in range(21)]
    base = write_eval(tmp_path / "sft", {t: [0.0] for t in ids})
    after = write_eval(tmp_path / "grpo", {t: [float(i < 3 or i >= 18)] for i, t in enumerate(ids)})  # 3 bridge, 2 comparison, q20
    (base / "eval" / "config.yaml").write_text(f"data:\n  eval: {data}\n")
    from seekrl.data.loaders import load_tasks

    res = compare_evals(base, [after], resamples=500, by="type", tasks=load_tasks(data), tasks_from=str(data))
    groups = res["by_field"]["groups"]
    assert list(groups) == ["(none)", "bridge", "comparison"] and res["by_field"]["not_in_tasks"] == 0
    assert groups["bridge"]["n"] == 12 and groups["bridge"]["gains"][str(after)]["mean"] == pytest.approx(3 / 12)
    assert groups["comparison"]["n"] == 8 and groups["comparison"]["gains"][str(after)]["mean"] == pytest.approx(2 / 8)
    assert groups["(none)"]["n"] == 1
    nested = compare_evals(base, [after], resamples=500, by="level.hard", tasks=load_tasks(data))["by_field"]["groups"]
    assert {k: v["n"] for k, v in nested.items()} == {"(none)": 11, "h": 10}
    # the evals' source is "dev" and the file's stem "dev": found by data set and id; a file under
    # another name is found by id alone, and tasks it lacks are counted, not grouped
    other = tmp_path / "renamed.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows[:15]))
    part = compare_evals(base, [after], resamples=500, by="type", tasks=load_tasks(other))["by_field"]
    assert part["not_in_tasks"] == 6 and {k: v["n"] for k, v in part["groups"].items()} == {"bridge": 12, "comparison": 3}

    assert main(["compare", str(base), str(after), "--by", "type", "--resamples", "500"]) == 0  # data.eval of the saved config
    out = capsys.readouterr().out
    assert "\ntype = bridge:\n" in out and "| +25.0 |" in out and "\ntype = comparison:\n" in out
    assert main(["compare", str(base), str(after), "--by", "type", "--tasks", str(other), "--resamples", "500"]) == 0
    assert "6 compared tasks are not in" in capsys.readouterr().out
    assert main(["compare", str(base), str(after), "--by", "type", "--tasks", f"{other}[:12]", "--resamples", "500"]) == 0
    assert "9 compared tasks are not in" in capsys.readouterr().out  # a slice, as data.eval takes it
    assert main(["compare", str(base), str(after), "--by", "typ"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no task has a field 'typ'; --by is one of the rows' fields: _id, level, type" in err
    (base / "eval" / "config.yaml").unlink()
    assert main(["compare", str(base), str(after), "--by", "type"]) == 2
    assert "no config.yaml beside the base eval's trajectories; give --tasks" in capsys.readouterr().err
    unrelated = tmp_path / "unrelated.jsonl"
    unrelated.write_text(json.dumps({"_id": "z", "question": "q?", "answer": "x", "type": "bridge"}) + "\n")
    assert main(["compare", str(base), str(after), "--by", "type", "--tasks", str(unrelated)]) == 2
    assert "none of the 21 compared tasks is in" in capsys.readouterr().err


def test_match_id_pairs_the_same_questions_read_from_files_of_different_names(tmp_path, capsys):
    ids = [f"q{i}" for i in range(12)]
    base = write_eval(tmp_path / "sft", {t: [0.0] for t in ids}, source="all_questions")  # a superset, another file
    after = write_eval(tmp_path / "grpo", {t: [float(i < 3)] for i, t in enumerate(ids[:8])}, source="seed0_questions")
    with pytest.raises(DataError, match="share no task .* or give --match id"):
        compare_evals(base, [after], resamples=500)
    res = compare_evals(base, [after], resamples=500, match="id")
    assert res["n"] == 8 and res["left_out"] == {"base": 4, str(after): 0}
    assert res["gains"][str(after)]["mean"] == pytest.approx(3 / 8)
    assert main(["compare", str(base), str(after), "--match", "id", "--resamples", "500"]) == 0
    assert "| +37.5 |" in capsys.readouterr().out
    with pytest.raises(DataError, match="--per-source needs the data sets"):
        compare_evals(base, [after], match="id", per_source=True)
    two = write_eval(tmp_path / "two", {"nq:q1": [1.0], "hotpotqa:q1": [0.0]})  # one id in two data sets of one eval
    with pytest.raises(DataError, match=r"task id 'q1' is in data sets 'nq' and 'hotpotqa'; --match id needs ids unique"):
        task_scores(two, match="id")
    assert task_scores(two) == {("nq", "q1"): 1.0, ("hotpotqa", "q1"): 0.0}


def write_run(folder, steps: list[list[tuple[str, list[float]]]], samples_groups: int = 1000, source: str = "train"):
    """An RL run folder as the loop writes it: per step, its groups (task, the members' rewards)
    in trajectories/step_<N>.jsonl, a metrics.jsonl line per step, and the resolved config."""
    (folder / "trajectories").mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as m:
        m.write(json.dumps({"step": 0, "eval/em": 0.0}) + "\n")  # the eval before training (data.eval set): no trajectories
        for n, groups in enumerate(steps, 1):
            m.write(json.dumps({"step": n, "reward/mean": 0.0}) + "\n")
            with (folder / "trajectories" / f"step_{n}.jsonl").open("w") as f:
                for g, (task, rewards) in enumerate(groups):
                    for k, r in enumerate(rewards):
                        f.write(json.dumps({"task_id": task, "source": source, "group": g, "sample": k, "reward": r,
                                            "status": "ok"}) + "\n")
    (folder / "config.yaml").write_text(f"log:\n  samples_every: 1\n  samples_groups: {samples_groups}\n")
    return folder


def test_by_run_compares_what_a_run_trained_on_sampled_and_never_sampled(tmp_path, capsys):
    """`--by-run RUN`: a task is "rewards differed" when its group's rewards differed in some step
    (one step is enough), "rewards equal" when sampled without a spread, "not sampled" otherwise;
    tasks are found by id when the evals read them from another file."""
    from seekrl.compare import run_labels

    run = write_run(tmp_path / "grpo_run", [
        [("q0", [0.0, 1.0]), ("q1", [0.0, 0.0]), ("q2", [0.5, 0.5])],
        [("q1", [0.0, 0.2]), ("q3", [1.0, 1.0])],  # q1 differs in its second step
    ])
    label, counts = run_labels(run)
    assert counts == {"steps": 2, "tasks": 4, "rewards differed": 2, "rewards equal": 2}
    assert [label(("train", q)) for q in ("q0", "q1", "q2", "q3", "q9")] == [
        "rewards differed", "rewards differed", "rewards equal", "rewards equal", "not sampled"]
    assert label(("other_file", "q2")) == "rewards equal"  # found by id alone

    ids = [f"q{i}" for i in range(10)]
    base = write_eval(tmp_path / "sft", {t: [0.0] for t in ids}, source="seen")
    after = write_eval(tmp_path / "g", {t: [float(t in ("q0", "q2", "q5"))] for t in ids}, source="seen")
    res = compare_evals(base, [after], resamples=500, run=run)["by_run"]
    assert list(res["groups"]) == ["rewards differed", "rewards equal", "not sampled"]
    assert {k: (v["n"], v["gains"][str(after)]["mean"]) for k, v in res["groups"].items()} == {
        "rewards differed": (2, 0.5), "rewards equal": (2, 0.5), "not sampled": (6, pytest.approx(1 / 6))}
    assert main(["compare", str(base), str(after), "--by-run", str(run), "--resamples", "500"]) == 0
    out = capsys.readouterr().out
    assert "4 tasks sampled in 2 steps, 2 with rewards that differed in some step" in out
    assert "\nrun: rewards differed:\n" in out and "\nrun: not sampled:\n" in out and "| +50.0 |" in out

    # a failed episode (status not ok) is left out of its group's spread, as the trainer leaves it out
    f = run / "trajectories" / "step_2.jsonl"
    recs = [json.loads(x) for x in f.read_text().splitlines()]
    recs[1]["status"] = "engine_error"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert run_labels(run)[0](("train", "q1")) == "rewards equal"

    # a run whose groups are not all logged cannot say what it sampled: one line, the fix named
    capped = write_run(tmp_path / "capped", [[("q0", [0.0, 1.0]), ("q1", [0.0, 0.0])]], samples_groups=2)
    with pytest.raises(DataError, match=r"step_1.jsonl: 2 groups, log.samples_groups=2: .* train with log.samples_groups above"):
        run_labels(capped)
    (run / "trajectories" / "step_2.jsonl").unlink()
    assert main(["compare", str(base), str(after), "--by-run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps [2] logged no trajectories (log.samples_every > 1?)" in err
    with pytest.raises(DataError, match="no trajectories/step_<N>.jsonl and metrics.jsonl; give an RL run folder"):
        run_labels(tmp_path / "sft")
