"""Search-R1 v0.3-style reward: tag grammar and the score table (hand-worked cases)."""

import asyncio

import pytest

from seekrl.rewards.rubric import Rubric
from seekrl.rewards.search import is_valid_sequence, make_search_r1_reward, retrieved_gold
from seekrl.types import Task

T = Task(id="q", prompt=[], answer=["Paris"])
GOOD = "<search> capital of France </search>\n\n<information>Doc 1(Title: Paris) Paris is the capital.</information>\n\n<answer> Paris </answer>"


@pytest.mark.parametrize(
    "text, valid",
    [
        (GOOD, True),
        ("<think> easy </think><answer> Paris </answer>", True),
        ("<answer> Paris </answer> trailing words", False),  # something after the answer
        ("<search> a </search><answer> x </answer>", False),  # search without information
        ("<information> x </information><answer> x </answer>", False),  # information without search
        ("<search> a <answer> x </answer></search>", False),  # nested
        ("<answer> a </answer><answer> b </answer>", False),  # two answers
        ("no tags at all", False),
    ],
)
def test_sequence_grammar(text, valid):
    assert is_valid_sequence(text) is valid


def test_require_think():
    assert not is_valid_sequence("<answer> Paris </answer>", require_think=True)
    assert is_valid_sequence("<think> t </think><answer> Paris </answer>", require_think=True)


def test_score_table():
    fn = make_search_r1_reward(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)
    assert fn(GOOD, T).total == 1.0  # correct + valid
    assert fn("<answer> Paris </answer> extra", T).total == pytest.approx(0.8)  # correct, invalid: 1 - 0.2
    wrong = GOOD.replace("<answer> Paris </answer>", "<answer> Lyon </answer>")
    r = fn(wrong, T)
    assert r.total == pytest.approx(0.3) and r.parts == {"em": 0.0, "valid_format": 1.0, "retrieved_gold": 1.0}  # 0.2 + 0.1
    assert fn("<think> t </think><answer> Lyon </answer>", T).total == pytest.approx(0.2)  # valid, nothing retrieved
    assert fn("Lyon <answer> Lyon </answer> x", T).total == pytest.approx(0.1)  # invalid, but answered
    assert fn("I do not know", T).total == 0.0


def test_retrieved_gold_reads_only_information_blocks():
    assert retrieved_gold(GOOD, ["paris"])
    assert not retrieved_gold("<search> Paris </search><answer> Paris </answer>", ["Paris"])


def test_in_rubric_with_parts():
    result = asyncio.run(Rubric(["search_r1"]).score(GOOD, T))
    assert result.total == 1.0 and result.parts["search_r1/em"] == 1.0


@pytest.mark.parametrize("fmt", ["search_r1", "dr_tulu", "hermes"])
def test_invalid_action_notice_is_not_an_answer(fmt):
    """The loop's notice spells out "<answer> and </answer>"; only the model's own answer counts."""
    from seekrl.rewards.qa import extract_answer, qa_em
    from seekrl.tools.parsers import get_format

    notice = get_format(fmt).invalid_text
    task = Task(id="q", prompt=[{"role": "user", "content": "q"}], answer=["and"])
    bad = "I think it is Paris." + notice + "Still thinking."
    assert extract_answer(bad) is None and qa_em(bad, task) == 0.0
    assert make_search_r1_reward()(bad, task).total == 0.0  # not the 0.1 "answer given" format score
    good = bad + "<answer> and </answer>"  # the model's own answer after the notice is read
    assert extract_answer(good) == "and" and qa_em(good, task) == 1.0


def test_partial_credit_ranks_near_misses_below_the_exact_answer():
    t = Task(id="q", prompt=[], answer=["Paris Saint-Germain"])
    good = GOOD.replace("Paris is the capital.", "Paris Saint-Germain won.")
    near = good.replace("<answer> Paris </answer>", "<answer> Saint-Germain </answer>")
    longer = good.replace("<answer> Paris </answer>", "<answer> the club Paris Saint-Germain </answer>")
    exact = good.replace("<answer> Paris </answer>", "<answer> Paris Saint-Germain </answer>")
    plain = make_search_r1_reward()
    f1 = make_search_r1_reward(partial="f1", partial_weight=0.5)
    sub = make_search_r1_reward(partial="subem", partial_weight=0.5)
    assert plain(near, t).total == pytest.approx(0.3) and "partial" not in plain(near, t).parts
    # "saintgermain" against "paris saintgermain" (punctuation dropped): precision 1, recall 1/2, F1 2/3
    assert f1(near, t).total == pytest.approx(0.3 + 0.5 * 2 / 3) and f1(near, t).parts["partial"] == pytest.approx(2 / 3)
    assert f1(longer, t).total == pytest.approx(0.3 + 0.5 * 0.8) and f1(longer, t).total < 1.0  # "club paris saintgermain": P 2/3, R 1
    assert sub(near, t).total == pytest.approx(0.3) and sub(longer, t).total == pytest.approx(0.8)
    for fn in (plain, f1, sub):
        assert fn(exact, t).total == 1.0 and fn(exact, t).parts["em"] == 1.0
        assert fn("I do not know", t).total == 0.0
    assert f1("x <answer> Saint-Germain </answer> y", t).total == pytest.approx(0.1)  # malformed: no partial credit
    with pytest.raises(ValueError, match="partial credit must be one of none, f1, subem"):
        make_search_r1_reward(partial="rouge")
    with pytest.raises(ValueError, match=r"partial_weight must be in \[0, 0.7\)"):
        make_search_r1_reward(partial="f1", partial_weight=0.7)


def test_partial_credit_from_the_config():
    from seekrl.config import load_config
    from seekrl.errors import ConfigError
    from seekrl.rewards.rubric import build_rubric

    cfg = load_config(None, ["reward.functions=[search_r1]", "reward.search_r1_partial=f1", "reward.search_r1_partial_weight=0.4"])
    rubric = build_rubric(cfg.reward, 64)
    t = Task(id="q", prompt=[], answer=["Paris Saint-Germain"])
    near = GOOD.replace("<answer> Paris </answer>", "<answer> Saint-Germain </answer>")
    result = asyncio.run(rubric.score(near, t))
    assert result.total == pytest.approx(0.2 + 0.4 * 2 / 3) and result.parts["search_r1/partial"] == pytest.approx(2 / 3)
    with pytest.raises(ConfigError, match="reward.search_r1_partial"):
        load_config(None, ["reward.search_r1_partial=rouge"])
