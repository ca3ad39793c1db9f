"""The judge reward without a server: templates, score parsers, rubric items, the `reward.judge_*`
keys, a judge that cannot answer (RewardResult.unavailable, status reward_unavailable), and how
training and evaluation leave such trajectories out. The wire, retries, cache and concurrency are
tested against real servers in tests/integration/test_judge.py."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from seekrl.config import load_config
from seekrl.errors import ConfigError, DataError, RewardUnavailable
from seekrl.evaluate import evaluate, score_trajectory
from seekrl.observe.metrics import documented
from seekrl.rewards import RewardResult, Rubric
from seekrl.rewards.judge import (
    DEFAULT_RUBRIC_TEMPLATE,
    DEFAULT_TEMPLATE,
    has_rubric,
    make_judge_reward,
    make_parser,
    read_template,
    render,
    rubric_items,
    task_fields,
    template_fields,
)
from seekrl.rewards.judge_client import JudgeCache, chat_url
from seekrl.rewards.rubric import build_rubric
from seekrl.types import SamplingParams, Task, Trajectory, TrajectoryGroup


def task(answer=("Paris",), **meta) -> Task:
    return Task(id="t1", prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
                answer=list(answer) if isinstance(answer, tuple) else answer, source="test", meta=meta)


def cfg(tmp_path, *overrides):
    return load_config(None, ["reward.functions=[judge]", "reward.judge_url=http://127.0.0.1:9/v1", f"reward.judge_cache={tmp_path}",
                              *overrides])


# ---- templates -------------------------------------------------------------------------------
def test_task_fields_fill_the_default_templates():
    t = task(("Paris", "Paris, France"), hops=2, kind="1hop")
    f = task_fields("<think>hmm</think><answer> Paris </answer>", t)
    assert f["question"] == "Capital of France?"  # the last user message
    assert f["gold"] == "Paris | Paris, France"
    assert f["response"] == "Paris" and f["completion"] == "<think>hmm</think><answer> Paris </answer>"
    assert f["prompt"] == "system: Be brief.\nuser: Capital of France?"
    assert f["hops"] == "2" and f["kind"] == "1hop"  # other row fields: text as is, the rest as JSON
    text = render(DEFAULT_TEMPLATE, f, t.id)
    assert "Capital of France?" in text and "Paris | Paris, France" in text and "{" not in text
    assert template_fields(DEFAULT_TEMPLATE) == {"question", "gold", "response"}
    assert template_fields(DEFAULT_RUBRIC_TEMPLATE) == {"question", "response", "rubric"}
    # no <answer> tag: the whole completion is the response; a question kept in the row wins
    f = task_fields("  just Paris  ", task(question="What is the capital of France?"))
    assert f["response"] == "just Paris" and f["question"] == "What is the capital of France?"


@pytest.mark.parametrize("answer, gold", [
    ({"target": ["a", "b"]}, "a | b"), ("42", "42"), (7, "7"), (None, ""),
    ({"rubrics": [{"text": "x"}], "ref": "long answer"}, '{"ref": "long answer"}'),
])
def test_gold_text(answer, gold):
    assert task_fields("x", task(answer))["gold"] == gold


def test_render_escapes_literal_braces_and_names_a_missing_field():
    f = {"question": "Q", "gold": "G"}
    assert render('{{question}} {question} {"score": 1} {gold}', f) == '{question} Q {"score": 1} G'
    with pytest.raises(DataError, match=r"reward.judge_template uses \{source_doc\}, which task t9 does not have"):
        render("{question} {source_doc}", f, "t9")


def test_read_template_inline_file_and_errors(tmp_path):
    assert read_template(None, "k", "DEFAULT {x}") == "DEFAULT {x}"
    assert read_template("Grade {response}", "k", "") == "Grade {response}"
    path = tmp_path / "judge.txt"
    path.write_text("From a file: {question}\n")
    assert read_template(str(path), "k", "") == "From a file: {question}\n"
    with pytest.raises(ConfigError, match="reward.judge_template: '.*missing.txt' is neither a template"):
        read_template(str(tmp_path / "missing.txt"), "reward.judge_template", "")
    (tmp_path / "plain.txt").write_text("no placeholder here")
    with pytest.raises(ConfigError, match="has no placeholder"):
        read_template(str(tmp_path / "plain.txt"), "k", "")


# ---- parsers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, lo_hi, reply, score", [
    ("last_number", (0, 10), "The response is right.\nScore: 7", 0.7),
    ("last_number", (0, 10), "Score: 8/10", 0.8),  # not the denominator
    ("last_number", (0, 10), "Qwen3 thinks: 9", 0.9),  # not the digit of a word
    ("last_number", (0, 10), "<think>maybe 2, or 3</think>\nScore: 6.5", 0.65),
    ("last_number", (0, 1), "score = 0.25", 0.25),
    ("last_number", (1, 5), "Rating: 5", 1.0),
    ("first_number", (0, 10), "4 out of 10 points, maybe 5", 0.4),
    ("json", (0, 10), 'Reasoning... {"reason": "ok", "score": 10} done', 1.0),
    ("json", (0, 1), '{"score": "0.5"}', 0.5),
    ("yes_no", (0, 10), "Yes. The answer matches.", 1.0),
    ("yes_no", (0, 10), "<think>yes?</think> No, it does not.", 0.0),
    ("match:\\bCORRECT\\b", (0, 10), "Verdict: CORRECT", 1.0),
    ("match:\\bCORRECT\\b", (0, 10), "Verdict: INCORRECT", 0.0),
    ("re:\\[\\[(\\d+)\\]\\]", (0, 10), "first [[2]] then [[3]]", 0.3),
])
def test_parsers(spec, lo_hi, reply, score):
    assert make_parser(spec, lo_hi)(reply) == pytest.approx(score)


@pytest.mark.parametrize("spec, reply, message", [
    ("last_number", "I cannot tell.", "no number"),
    ("last_number", "Score: 11", "outside"),
    ("last_number", "Score: -1", "outside"),
    ("last_number", "<think>Score: 7 probably, but", "no number"),  # an unclosed think block is all thinking
    ("json", '{"verdict": 1}', "numeric \"score\""),
    ("yes_no", "perhaps", "neither yes nor no"),
    ("re:Score: (\\d+)", "no score", "does not match"),
])
def test_unreadable_replies_raise_value_error(spec, reply, message):
    with pytest.raises(ValueError, match=message):
        make_parser(spec, (0, 10))(reply)


@pytest.mark.parametrize("spec, lo_hi, message", [
    ("median", (0, 10), "unknown parser 'median'"),
    ("re:Score: \\d+", (0, 10), "needs a group"),
    ("re:(", (0, 10), "not a regular expression"),
    ("last_number", (10, 0), "lo < hi"),
])
def test_bad_parser_specs(spec, lo_hi, message):
    with pytest.raises(ValueError, match=message):
        make_parser(spec, lo_hi)


# ---- rubric items ----------------------------------------------------------------------------
def test_rubric_items_from_the_row_and_from_the_answer():
    items = [{"text": "Names Paris", "weight": 2}, {"description": "Cites a source", "title": "Sources"}, "Is concise"]
    want = [("Names Paris", 2.0), ("Sources: Cites a source", 1.0), ("Is concise", 1.0)]
    assert rubric_items(task(rubrics=items)) == want
    assert rubric_items(task(rubrics=json.dumps(items))) == want  # a JSON string (parquet)
    assert rubric_items(task({"rubrics": items})) == want  # verl's ground_truth dict
    assert rubric_items(task(json.dumps({"rubrics": items}))) == want  # ... as a JSON string
    assert rubric_items(task(items[:2])) == want[:2]  # data.answer_field=rubrics: a list of objects
    assert rubric_items(task(["Paris", "Paris, France"])) == []  # a list of strings is gold aliases
    assert rubric_items(task()) == [] and not has_rubric(task()) and has_rubric(task(rubrics=items))
    assert rubric_items(task(("{not json",))) == []


@pytest.mark.parametrize("rubrics, message", [
    ([{"text": "x", "weight": 0}], r"rubrics\[0\]: weight must be a finite number > 0"),
    ([{"text": "x", "weight": "high"}], "weight must be"),
    ([{"text": "x"}, {"weight": 1}], r"rubrics\[1\]: no text"),
    ([3], r"rubrics\[0\]: expected an object"),
    ("[1, ", "not JSON"),
    ({"text": "x"}, "expected a list"),
    (["  "], "empty"),
])
def test_malformed_rubric_items_are_data_errors_naming_the_task(rubrics, message):
    with pytest.raises(DataError, match="task t1: rubrics") as e:
        rubric_items(task(rubrics=rubrics))
    assert re.search(message, str(e.value)), str(e.value)


# ---- config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["reward.judge_url=null"], "reward.functions has judge but reward.judge_url is not set"),
    (["reward.judge_url=127.0.0.1:8002"], "reward.judge_url: '127.0.0.1:8002' is not an http"),
    (["reward.judge_score_range=[10, 0]"], "reward.judge_score_range: give \\[lo, hi\\]"),
    (["reward.judge_score_range=[0, 5, 10]"], "reward.judge_score_range"),
    (["reward.judge_parser=median"], "reward.judge_parser: unknown parser 'median'"),
    (["reward.judge_parser=re:Score"], "reward.judge_parser: .*needs a group"),
    (["reward.judge_template=no/such/file.txt"], "reward.judge_template: 'no/such/file.txt' is neither a template"),
    (["reward.judge_template=Grade {response} on {rubric}"], "reward.judge_template uses \\{rubric\\}"),
    (["reward.judge_rubric_template=Grade {response}"], "reward.judge_rubric_template must show the rubric item"),
    (["reward.judge_concurrency=0"], "reward.judge_concurrency"),
    (["reward.judge_timeout_s=0"], "reward.judge_timeout_s"),
    (["reward.judge_retries=-1"], "reward.judge_retries"),
])
def test_judge_config_errors_are_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        cfg(tmp_path, *overrides)
    assert "\n" not in str(e.value)


def test_judge_keys_are_ignored_without_the_judge():
    c = load_config(None, ["reward.functions=[qa_em]", "reward.judge_parser=median"])
    assert c.reward.judge_url is None


def test_build_rubric_reads_the_token_from_its_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("SEEKRL_TEST_JUDGE_KEY", raising=False)
    c = cfg(tmp_path, "reward.judge_token_env=SEEKRL_TEST_JUDGE_KEY", "reward.judge_model=grader", "reward.judge_concurrency=3")
    with pytest.raises(ConfigError, match="reward.judge_token_env: the environment variable SEEKRL_TEST_JUDGE_KEY is not set"):
        build_rubric(c.reward, 64)
    monkeypatch.setenv("SEEKRL_TEST_JUDGE_KEY", "s3cret")
    rubric = build_rubric(c.reward, 64)
    client = rubric.fns[0].client
    assert rubric.names == ["judge"] and client.token == "s3cret" and client.model == "grader" and client.concurrency == 3
    assert client.url == "http://127.0.0.1:9/v1/chat/completions" and client.cache.path == tmp_path / "judge_cache.sqlite"
    client.close()


def test_judge_cache_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = build_rubric(load_config(None, ["reward.functions=[judge]", "reward.judge_url=http://127.0.0.1:9/v1"]).reward, 64)
    assert default.fns[0].client.cache.path == tmp_path / "xdg" / "seekrl" / "judge" / "judge_cache.sqlite"
    default.fns[0].client.close()
    assert build_rubric(cfg(tmp_path, "reward.judge_cache=off").reward, 64).fns[0].client.cache is None
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="reward.judge_cache: cannot use .* as the judge's cache") as e:
        build_rubric(cfg(tmp_path, f"reward.judge_cache={tmp_path / 'file'}").reward, 64)
    assert not str(e.value).startswith("reward.functions")


def test_judge_cache_round_trip(tmp_path):
    cache = JudgeCache(tmp_path)
    messages = [{"role": "user", "content": "Grade: Paris"}]
    key = JudgeCache.key("m", messages, {"temperature": 0.0, "max_tokens": 8})
    assert key != JudgeCache.key("other", messages, {"temperature": 0.0, "max_tokens": 8})
    assert key != JudgeCache.key("m", messages, {"temperature": 1.0, "max_tokens": 8})
    assert cache.get(key) is None
    cache.put(key, "m", messages, "Score: 9")
    cache.close()
    again = JudgeCache(tmp_path)  # on disk: another process (or a rerun) reads it
    assert again.get(key) == "Score: 9" and len(again) == 1
    again.close()


def test_chat_url():
    assert chat_url("http://h:1/v1") == chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("https://api.example.com/v1/chat/completions") == "https://api.example.com/v1/chat/completions"


# ---- a judge that cannot answer --------------------------------------------------------------
def test_rubric_reports_an_unavailable_reward_instead_of_raising():
    async def judge(completion, task, **ctx):
        raise RewardUnavailable("the judge at http://x could not score: ConnectError")

    rubric = Rubric([judge, "qa_em"], [1.0, 0.5])
    r = asyncio.run(rubric.score("<answer>Paris</answer>", task()))
    assert r.unavailable == "judge: the judge at http://x could not score: ConnectError"
    assert r.total == 0.0 and r.parts == {"qa_em": 1.0}
    ok = asyncio.run(Rubric(["qa_em"]).score("<answer>Paris</answer>", task()))
    assert ok.unavailable is None and ok.total == 1.0 and RewardResult(1.0).unavailable is None

    async def broken(completion, task, **ctx):  # any other error is a bug: it still propagates
        raise KeyError("oops")

    with pytest.raises(KeyError):
        asyncio.run(Rubric([judge, broken]).score("x", task()))


def test_the_judge_skips_trajectories_left_out_anyway(tmp_path):
    judge = make_judge_reward("http://127.0.0.1:9/v1", cache=tmp_path, retries=0)  # nothing listens there
    r = asyncio.run(judge("<answer>Paris</answer>", task(), status="engine_error"))
    assert r.total == 0.0 and r.parts == {} and judge.client.stats["requests"] == 0
    judge.client.close()


def traj(t: Task, status="ok", reward=0.0, text="<answer>Paris</answer>") -> Trajectory:
    return Trajectory(task=t, prompt_ids=[0], completion_ids=[1, 2], loss_mask=[1, 1], logprobs=[0.0, 0.0], versions=[0, 0],
                      reward=reward, reward_parts={"qa_em": reward}, finish_reason="answered", text=text, status=status)


def test_training_leaves_reward_unavailable_out_and_counts_it():
    from seekrl.observe.stats import StatsTracker
    from seekrl.train.rl import usable

    t = task()
    trajs = [traj(t), traj(t, "reward_unavailable"), traj(t, "reward_unavailable"), traj(t, "engine_error")]
    stats = StatsTracker()
    kept, groups = usable(trajs, [0, 0, 1, 1], stats)
    assert kept == trajs[:1] and groups == [0]
    out = stats.export()
    assert out["rollout/excluded/reward_unavailable"] == 2 and out["rollout/excluded/engine_error"] == 1
    assert out["rollout/excluded_frac"] == 0.75
    assert all(documented(k) for k in out)


class _Groups:
    """A workflow that hands back prepared groups (evaluation's view of the rollout)."""

    def __init__(self, groups):
        self.groups = {g.task.id: g for g in groups}

    async def run(self, task, engine, n, params=None):
        return self.groups[task.id]


def test_evaluation_counts_left_out_samples_and_does_not_score_them():
    a, b = task(), Task(id="t2", prompt=[{"role": "user", "content": "q"}], answer=["Lyon"], source="test")
    groups = [TrajectoryGroup(a, [traj(a, reward=1.0), traj(a, "reward_unavailable")]),
              TrajectoryGroup(b, [traj(b, "reward_unavailable"), traj(b, "tool_unavailable")])]
    metrics, out = asyncio.run(evaluate(_Groups(groups), None, [a, b], 2, SamplingParams(), "qa_em"))
    assert metrics["eval/count"] == 1  # t2 had no sample to score
    assert metrics["eval/reward"] == 1.0 and metrics["eval/em"] == 1.0 and metrics["eval/pass@1"] == 1.0
    assert metrics["eval/excluded/reward_unavailable"] == 2 and metrics["eval/excluded/tool_unavailable"] == 1
    assert metrics["eval/excluded_frac"] == 0.75
    assert out == groups and [t.status for t in out[1].trajectories] == ["reward_unavailable", "tool_unavailable"]
    assert "score/em" in out[0].trajectories[0].metrics and "score/em" not in out[0].trajectories[1].metrics
    assert all(documented(k) for k in metrics), [k for k in metrics if not documented(k)]


def test_rubric_tasks_are_correct_by_the_judge_not_by_exact_match():
    t = task([{"text": "Names Paris"}])  # data.answer_field=rubrics
    tr = traj(t)
    tr.reward_parts = {"judge": 0.8}
    s = score_trajectory(tr, "judge")
    assert "em" not in s and s["correct"] == 1.0


def test_judge_metrics_are_documented():
    for key in ("reward/judge", "reward/judge/rubric_items", "reward/judge/item_0", "reward/judge/item_12",
                "rollout/excluded/reward_unavailable", "eval/excluded/reward_unavailable", "eval/excluded_frac", "eval/judge/item_3"):
        assert documented(key), key


