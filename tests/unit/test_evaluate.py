"""Evaluation metrics on hand-built trajectories: pass@k, EM/F1, math accuracy, scopes, the table."""

from __future__ import annotations

import json
from itertools import combinations

import pytest

from seekrl.evaluate import (
    eval_table_markdown,
    final_answer,
    is_math_task,
    pass_at_k,
    pass_ks,
    summarize,
    write_eval,
)
from seekrl.types import Task, Trajectory, TrajectoryGroup


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of k-subsets of the n samples (the first c correct) holding a correct one."""
    subsets = list(combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_enumeration_over_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k)), (n, c, k)


def test_pass_at_k_edge_cases():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 0, 5) == 0.0  # nothing correct
    assert pass_at_k(5, 5, 1) == 1.0  # everything correct
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a correct sample
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the fraction correct
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_ks():
    assert pass_ks(1) == [1]
    assert pass_ks(2) == [1, 2]
    assert pass_ks(5) == [1, 2, 4, 5]
    assert pass_ks(8) == [1, 2, 4, 8]


def traj(task, text, *, finish="answered", reward=0.0, parts=None, metrics=None):
    ids = [1, 2, 3]
    return Trajectory(
        task=task, prompt_ids=[0], completion_ids=ids, loss_mask=[1] * 3, logprobs=[0.0] * 3, versions=[0] * 3,
        reward=reward, reward_parts=parts or {}, finish_reason=finish, metrics=metrics or {}, text=text,
    )


def tool(calls, invalid=0):
    return {"turns": calls + 1.0, "tool_calls": float(calls), "invalid_actions": float(invalid)}


PARIS = Task("q1", [], answer=["Paris", "City of Paris"], source="synthetic", meta={"kind": "1hop"})
LYON = Task("q2", [], answer=["Lyon"], source="synthetic", meta={"kind": "2hop"})
HALF = Task("m1", [], answer="\\frac{1}{2}", source="math500")


def qa_groups():
    return [
        TrajectoryGroup(PARIS, [
            traj(PARIS, "<search>capital</search> <answer>The Paris</answer>", reward=1.0, parts={"qa_em": 1.0}, metrics=tool(1)),
            traj(PARIS, "<answer>city</answer>", metrics=tool(2, invalid=1)),  # F1 vs "city of paris": 2*(1*1/3)/(4/3) = 0.5
            traj(PARIS, "<answer>paris</answer> <answer>Rome</answer>", metrics=tool(3)),  # the LAST answer counts
            traj(PARIS, "<search>x</search>", finish="max_turns", metrics=tool(4)),  # no answer: 0, not answered
        ]),
        TrajectoryGroup(LYON, [
            traj(LYON, "<answer>Lyon France</answer>", metrics=tool(0)),  # F1 = 2*(1/2*1)/(3/2) = 2/3
            traj(LYON, "<answer>lyon</answer>", reward=1.0, parts={"qa_em": 1.0}, metrics=tool(1)),
            traj(LYON, "<answer>Nice</answer>", metrics=tool(1)),
            traj(LYON, "", finish="length", metrics=tool(0)),
        ]),
    ]


def test_summarize_qa_em_f1_tools_and_kinds():
    m = summarize(qa_groups(), primary="qa_em")
    assert m["eval/count"] == 2
    # EM: Paris group 1,0,0,0; Lyon group 0,1,0,0 -> 2/8
    assert m["eval/em"] == pytest.approx(2 / 8)
    assert m["eval/1hop/em"] == pytest.approx(1 / 4) and m["eval/2hop/em"] == pytest.approx(1 / 4)
    # F1: Paris 1 + 0.5 + 0 + 0; Lyon 2/3 + 1 + 0 + 0
    assert m["eval/1hop/f1"] == pytest.approx(1.5 / 4)
    assert m["eval/2hop/f1"] == pytest.approx((2 / 3 + 1) / 4)
    assert m["eval/f1"] == pytest.approx((1.5 + 2 / 3 + 1) / 8)
    assert m["eval/tool_calls"] == pytest.approx((1 + 2 + 3 + 4 + 0 + 1 + 1 + 0) / 8)
    assert m["eval/1hop/tool_calls"] == pytest.approx(10 / 4)
    assert m["eval/invalid_actions"] == pytest.approx(1 / 8)
    assert m["eval/answer_rate"] == pytest.approx(6 / 8)  # one max_turns, one length
    assert m["eval/accuracy"] == pytest.approx(2 / 8)  # the primary reward (qa_em) >= 0.5
    assert m["eval/qa_em"] == pytest.approx(2 / 8) and m["eval/reward"] == pytest.approx(2 / 8)
    assert m["eval/response_len"] == 3.0
    # each task has c = 1 of n = 4 correct: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1
    assert m["eval/pass@1"] == pytest.approx(0.25)
    assert m["eval/pass@2"] == pytest.approx(0.5)
    assert m["eval/pass@4"] == pytest.approx(1.0)
    assert "eval/pass@3" not in m
    assert m["eval/1hop/count"] == 1 and m["eval/2hop/pass@2"] == pytest.approx(0.5)
    assert not any(k.startswith("eval/synthetic/") for k in m)  # one source: no per-source scope


def test_summarize_pass_at_k_with_mixed_correctness_and_math():
    groups = [
        TrajectoryGroup(PARIS, [traj(PARIS, "<answer>Paris</answer>")] * 2 + [traj(PARIS, "<answer>no</answer>")] * 2),  # c=2
        TrajectoryGroup(LYON, [traj(LYON, "<answer>no</answer>")] * 4),  # c=0
        TrajectoryGroup(HALF, [  # math: equivalence, not string match; c=3
            traj(HALF, "so the answer is \\boxed{0.5}"),
            traj(HALF, "<answer>1/2</answer>"),
            traj(HALF, "\\boxed{\\frac{2}{4}}"),
            traj(HALF, "\\boxed{3}", reward=1.0),  # the configured reward does not decide math accuracy
        ]),
    ]
    m = summarize(groups, primary="math", prefix="test")
    assert m["test/count"] == 3
    assert m["test/math500/accuracy"] == pytest.approx(3 / 4)
    assert "test/math500/em" not in m
    assert m["test/synthetic/em"] == pytest.approx(2 / 8)
    # pass@2: Paris 1 - C(2,2)/C(4,2) = 5/6; Lyon 0; math 1 (n - c = 1 < 2)
    assert m["test/pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert m["test/pass@1"] == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)
    assert m["test/math500/pass@4"] == 1.0 and m["test/synthetic/pass@4"] == pytest.approx(0.5)
    # single-turn trajectories (no `turns` metric): answered = an answer can be extracted
    assert m["test/math500/answer_rate"] == 1.0 and m["test/tool_calls"] == 0.0
    assert "test/invalid_actions" not in m


def test_answer_extraction_and_math_rule():
    plain = Task("c", [], answer="3 7 1", source="tiny_copy", meta={"answer_format": "plain"})
    assert final_answer(traj(plain, " 3 7 1 ")) == "3 7 1"
    assert final_answer(traj(plain, "  ")) is None
    assert final_answer(traj(PARIS, "Paris")) is None  # tool/search format: only an <answer> tag counts
    assert final_answer(traj(HALF, "x \\boxed{1/2}")) == "1/2"
    assert is_math_task(HALF) and is_math_task(Task("g", [], "72", source="gsm8k"))
    assert is_math_task(Task("n", [], 42, source="mydata"))
    assert not is_math_task(PARIS) and not is_math_task(plain)


def test_unscorable_answer_falls_back_to_primary_reward():
    odd = Task("o", [], answer=None, source="custom")
    m = summarize([TrajectoryGroup(odd, [traj(odd, "x", parts={"judge": 0.9}), traj(odd, "y", parts={"judge": 0.1})])], "judge")
    assert "eval/em" not in m
    assert m["eval/accuracy"] == 0.5 and m["eval/pass@1"] == 0.5 and m["eval/pass@2"] == 1.0


def test_eval_table_markdown_and_write_eval(tmp_path):
    groups = qa_groups() + [TrajectoryGroup(HALF, [traj(HALF, "\\boxed{0.5}")] * 4)]
    m = summarize(groups, primary="qa_em")
    table = eval_table_markdown(m)
    lines = table.strip().splitlines()
    assert lines[0] == "| scope | count | reward | EM | F1 | accuracy | pass@1 | pass@2 | pass@4 | tool calls | answer rate | well-formed |"
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert list(rows) == ["all", "math500", "synthetic", "1hop", "2hop"]
    assert rows["all"][0] == "3"
    assert rows["math500"][2] == "-" and rows["math500"][4] == "1.000"  # no EM for math; accuracy 1
    assert rows["synthetic"][2] == "0.250"  # EM
    assert rows["1hop"][5] == "0.250" and rows["1hop"][-3] == "2.500"  # pass@1, tool calls
    assert rows["math500"][-1] == "-" and rows["synthetic"][-1] == f"{m['eval/synthetic/well_formed']:.3f}"
    json_path, md_path = write_eval(m, tmp_path / "eval")
    assert json.loads(json_path.read_text()) == m
    assert md_path.read_text() == table


def test_collect_keeps_task_order_and_advances_progress_per_task():
    import asyncio

    from seekrl.rollout import collect

    class Workflow:  # finishes the tasks in reverse order
        async def run(self, task, engine, n, params):
            await asyncio.sleep(0.01 * (3 - int(task.id)))
            return TrajectoryGroup(task=task, trajectories=[])

    class Bar:
        def __init__(self):
            self.n = 0

        def update(self, k):
            self.n += k

    tasks = [Task(id=str(i), prompt=[{"role": "user", "content": "q"}], answer="a") for i in range(3)]
    bar = Bar()
    groups = asyncio.run(collect(Workflow(), None, tasks, 1, progress=bar))
    assert [g.task.id for g in groups] == ["0", "1", "2"] and bar.n == 3
