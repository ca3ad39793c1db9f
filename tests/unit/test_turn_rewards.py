"""Per-turn rewards: the Rubric's weighing and checks, and `retrieved_gold_turn` / `retrieved_support_turn` by hand."""

from __future__ import annotations

import asyncio

import pytest

from seekrl.rewards import REWARD_FUNCTIONS, RewardResult, Rubric, TurnContext
from seekrl.types import Task

TASK = Task(id="q", prompt=[], answer=["Paris", "Paris, France"])


def score(rubric, completion="", **ctx):
    return asyncio.run(rubric.score(completion, TASK, **ctx))


def test_retrieved_gold_turn_credits_the_first_search_that_found_the_gold():
    turns = [
        TurnContext("<tool_call>...</tool_call>", ("search",), ("Doc 1(Title: Lyon) Lyon is a city.",)),
        TurnContext("<tool_call>...</tool_call>", ("lookup", "search"), ("paris is here but not a search", "The capital is PARIS.")),
        TurnContext("<tool_call>...</tool_call>", ("search",), ("Paris again.",)),  # found again: nothing more
        TurnContext("<answer>Paris</answer>"),
    ]
    r = REWARD_FUNCTIONS["retrieved_gold_turn"]("", TASK, turns=turns)
    assert r.turn_rewards == [0.0, 1.0, 0.0, 0.0] and r.total == 1.0
    miss = REWARD_FUNCTIONS["retrieved_gold_turn"]("", TASK, turns=turns[:1] + turns[3:])
    assert miss.turn_rewards == [0.0, 0.0] and miss.total == 0.0
    # only the named tools count; without ctx turns the completion is one turn that called nothing
    from seekrl.rewards.rubric import resolve_reward

    lookup = resolve_reward("retrieved_gold_turn", {"tools": ["lookup"]})
    assert lookup("", TASK, turns=turns).turn_rewards == [0.0, 1.0, 0.0, 0.0]
    assert REWARD_FUNCTIONS["retrieved_gold_turn"]("<information>Paris</information>", TASK).turn_rewards == [0.0]


def test_retrieved_support_turn_credits_each_search_for_the_needed_paragraphs_it_found_first():
    task = Task(id="h", prompt=[], answer="1961", meta={"supporting_facts": None,
                                                        "supporting_titles": ["Barack Obama", "Hawaii", "Barack Obama"]})
    turns = [
        TurnContext("<search>q1</search>", ("search",), ('Doc 1(Title: "Barack Obama") He was born in Hawaii.\nDoc 2(Title: Obama (surname)) x',)),
        TurnContext("<search>q2</search>", ("search",), ("Doc 1(Title: Barack Obama) again\nDoc 2(Title: Hawaii State) not the paragraph",)),
        TurnContext("<search>q3</search>", ("lookup", "search"), ("Doc 1(Title: Hawaii) a lookup, not a search", "Doc 1(Title: Hawaii) the state")),
        TurnContext("<answer>1961</answer>"),
    ]
    fn = REWARD_FUNCTIONS["retrieved_support_turn"]
    r = fn("", task, turns=turns)
    # repeated titles count once (2 needed); a prefix title ("Hawaii State") and a found-again paragraph earn nothing
    assert r.turn_rewards == [0.5, 0.0, 0.5, 0.0] and r.total == 1.0 and r.parts == {"known": 1.0}
    half = fn("", task, turns=turns[:2] + turns[3:])
    assert half.turn_rewards == [0.5, 0.0, 0.0] and half.total == 0.5
    # supporting_facts, when given, name the paragraphs; a task with no titles scores 0 and says so
    facts = Task(id="f", prompt=[], answer="x", meta={"supporting_facts": [["Hawaii", 0], ["Hawaii", 2]]})
    assert fn("", facts, turns=turns).turn_rewards == [0.0, 0.0, 1.0, 0.0]
    unknown = fn("", TASK, turns=turns)
    assert unknown.total == 0.0 and unknown.turn_rewards == [0.0] * 4 and unknown.parts == {"known": 0.0}
    from seekrl.rewards.rubric import resolve_reward

    assert resolve_reward("retrieved_support_turn", {"tools": ["lookup"]})("", task, turns=turns).turn_rewards == [0.0, 0.0, 0.5, 0.0]
    # only what the policy read counts: a title the observation's max_obs_tokens cut off was not found
    import dataclasses

    cut = [turns[0], turns[1], dataclasses.replace(turns[2], shown="<information>Doc 1(Title: Hai ...[truncated]</information>"), turns[3]]
    assert fn("", task, turns=cut).turn_rewards == [0.5, 0.0, 0.0, 0.0]
    shown = dataclasses.replace(turns[2], shown="<information>Doc 1(Title: Hawaii) the st ...[truncated]</information>")
    assert fn("", task, turns=[turns[0], turns[1], shown, turns[3]]).turn_rewards == [0.5, 0.0, 0.5, 0.0]
    rubric = Rubric(["qa_f1", "retrieved_support_turn"], [1.0, 0.5])
    assert rubric.per_turn is True
    # what it needs of a task (Rubric.unscorable: a run whose tasks all lack it is refused before the model loads)
    assert rubric.unscorable([TASK, task]) == [] and [n for n, _ in rubric.unscorable([TASK])] == ["retrieved_support_turn"]
    scored = asyncio.run(rubric.score("<answer>1961</answer>", task, turns=turns))
    assert scored.total == 1.5 and scored.turn_rewards == [0.25, 0.0, 0.25, 0.0]  # the outcome reward is not a turn's


def test_rubric_weighs_and_sums_per_turn_rewards():
    def a(completion, task, **ctx):
        return RewardResult(1.0, turn_rewards=[1.0, 0.0, 2.0])

    def b(completion, task, **ctx):
        return RewardResult(0.5, {"x": 1.0}, turn_rewards=[0.0, 4.0, 0.0])

    def c(completion, task, **ctx):
        return 3.0

    turns = [TurnContext("t")] * 3
    r = score(Rubric([a, b, c], [2.0, 0.5, 1.0]), turns=turns)
    assert r.total == 2.0 + 0.25 + 3.0 and r.parts == {"a": 1.0, "b": 0.5, "b/x": 1.0, "c": 3.0}
    assert r.turn_rewards == [2.0, 2.0, 4.0]  # 2 * [1, 0, 2] + 0.5 * [0, 4, 0]
    assert score(Rubric([c]), turns=turns).turn_rewards is None  # no function gives any: None, the old result
    with pytest.raises(ValueError, match="returned 3 turn rewards for an episode of 2 turns"):
        score(Rubric([a]), turns=turns[:2])


def test_rubric_knows_whether_it_gives_per_turn_rewards():
    assert Rubric(["qa_em", "retrieved_gold_turn"]).per_turn is True
    assert Rubric(["qa_em", "format"]).per_turn is False
    assert Rubric(["qa_em", "seekrl.rewards.qa:qa_f1"]).per_turn is None  # a user's path might
