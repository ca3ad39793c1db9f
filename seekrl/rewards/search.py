"""Search rewards: Search-R1 v0.3-style outcome reward with format and retrieval parts (`search_r1`
in the rubric), and per-turn credit for retrieval: `retrieved_gold_turn` for the search that
reached the answer string, `retrieved_support_turn` for each search that brought a paragraph the
question needs (multi-hop: the bridge paragraph too), both below.

    correct answer, valid sequence      -> score
    correct answer, invalid sequence    -> score - structure_format_score
    wrong/no answer, valid sequence     -> structure_format_score (+ retrieval_score when a gold
                                           answer appeared in a retrieved <information> block)
    otherwise                           -> final_format_score when an <answer> was given, else 0

A valid sequence is a tag grammar over the completion (the sampled turns and the inserted
observations, which the reward reads as text; never the prompt): optional <think> blocks,
any number of `<search>...</search>` each followed by `<information>...</information>`, and
exactly one `<answer>...</answer>` at the end, tags not nested. Departure from Search-R1: the
<think> blocks are optional (`require_think=True` asks for one before every action), so models
without a reasoning habit can still earn the structure score.
"""

from __future__ import annotations

import re
from typing import Any

from seekrl.data.teacher import gold_titles, names_title
from seekrl.rewards.base import RewardResult, TurnContext
from seekrl.rewards.qa import exact_match, extract_answer, f1_score, gold_list, normalize_answer, substring_match
from seekrl.types import Task

__all__ = ["make_search_r1_reward", "is_valid_sequence", "retrieved_gold", "make_retrieved_gold_turn_reward",
           "make_retrieved_support_turn_reward", "PARTIAL_CREDIT"]

_TAG = re.compile(r"<(/?)(think|search|information|answer)>")


def is_valid_sequence(text: str, require_think: bool = False) -> bool:
    """The tag grammar above: balanced, unnested blocks; search→information; one final answer."""
    open_tag: str | None = None
    last_closed: str | None = None
    blocks: list[str] = []
    end = 0
    for m in _TAG.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            if open_tag is not None or "answer" in blocks:
                return False  # nested, or anything after the answer
            if tag == "information" and last_closed != "search":
                return False
            if tag in ("search", "answer") and require_think and last_closed != "think":
                return False
            if last_closed == "search" and tag != "information":
                return False
            open_tag = tag
        else:
            if open_tag != tag:
                return False
            blocks.append(tag)
            open_tag, last_closed, end = None, tag, m.end()
    if open_tag is not None or blocks.count("answer") != 1 or blocks[-1] != "answer":
        return False
    return text[end:].strip() == ""


def retrieved_gold(text: str, golds: Any) -> bool:
    """True when a normalised gold answer occurs in a retrieved <information> block."""
    infos = [normalize_answer(b) for b in re.findall(r"<information>(.*?)</information>", text, re.S)]
    wanted = [normalize_answer(g) for g in gold_list(golds)]
    return any(g and g in info for g in wanted for info in infos)


PARTIAL_CREDIT = ("none", "f1", "subem")


def make_search_r1_reward(
    structure_format_score: float = 0.2, final_format_score: float = 0.1, retrieval_score: float = 0.1,
    score: float = 1.0, require_think: bool = False, partial: str = "none", partial_weight: float = 0.5,
):
    """Search-R1's outcome reward: `score` for the exact answer (less `structure_format_score` when
    the episode is malformed), else `structure_format_score` (+ `retrieval_score` when a retrieved
    passage holds the gold answer) for a well-formed episode, `final_format_score` for an answer in a
    malformed one. `partial` ("f1" | "subem", reward.search_r1_partial) adds `partial_weight` × the
    answer's token F1 (or 1 when it contains a gold answer) to a well-formed episode that misses the
    exact answer, so near misses outrank wrong answers and the exact answer still scores most."""
    if partial not in PARTIAL_CREDIT:
        raise ValueError(f"search_r1 partial credit must be one of {', '.join(PARTIAL_CREDIT)}, got {partial!r}")
    room = round(score - structure_format_score - retrieval_score, 9)  # what a well-formed, retrieving miss is below the exact answer
    if partial != "none" and not 0 <= partial_weight < room:
        raise ValueError(f"search_r1 partial_weight must be in [0, {room:g}) so that the exact answer scores most, got {partial_weight}")

    def search_r1(completion: str, task: Task, **ctx: Any):
        answer = extract_answer(completion)
        valid = is_valid_sequence(completion, require_think)
        retrieved = retrieved_gold(completion, task.answer)
        em = exact_match(answer, task.answer) if answer is not None else 0.0
        parts = {"em": em, "valid_format": float(valid), "retrieved_gold": float(retrieved)}
        if partial != "none":  # the credit a near miss earns (logged for every episode: 0 unless paid)
            parts["partial"] = 0.0
        if em:
            total = score if valid else score - structure_format_score
        elif valid:
            total = structure_format_score + (retrieval_score if retrieved else 0.0)
            if partial != "none" and answer is not None:
                credit = f1_score(answer, task.answer) if partial == "f1" else substring_match(answer, task.answer)
                parts["partial"] = credit
                total += partial_weight * credit
        else:
            total = final_format_score if answer is not None else 0.0
        return RewardResult(total, parts)

    return search_r1


def make_retrieved_gold_turn_reward(tools: tuple[str, ...] | list[str] = ("search",)):
    """Per-turn retrieval credit (`retrieved_gold_turn`): 1.0 on the first turn that called one of
    `tools` and got back a gold answer (normalised, as a substring: `retrieved_gold`'s test, on the
    tool's own output rather than the rendered observation), 0.0 on every other turn. The total is
    their sum: 1.0 when the gold was retrieved at all. Finding it again later earns nothing, so
    repeating a good search is not rewarded. Without `ctx["turns"]` (single-turn workflows) the
    completion is one turn that called no tool."""
    names = frozenset(tools)

    def retrieved_gold_turn(completion: str, task: Task, **ctx: Any) -> RewardResult:
        turns = ctx.get("turns") or [TurnContext(completion)]
        wanted = [w for w in (normalize_answer(g) for g in gold_list(task.answer)) if w]
        values, found = [], False
        for turn in turns:
            outputs = [normalize_answer(out) for name, out in zip(turn.tools, turn.outputs) if name in names]
            hit = not found and any(w in out for w in wanted for out in outputs)
            values.append(float(hit))
            found = found or hit
        return RewardResult(float(found), turn_rewards=values)

    retrieved_gold_turn.per_turn = True  # gives per-turn rewards (rewards/base.py)
    return retrieved_gold_turn


def make_retrieved_support_turn_reward(tools: tuple[str, ...] | list[str] = ("search",)):
    """Per-turn credit for finding what a multi-hop question needs (`retrieved_support_turn`): each
    turn that called one of `tools` earns 1/n for every one of the task's n gold paragraphs
    (`gold_titles`: HotpotQA's supporting titles, 2Wiki's golden context, the synthetic tasks' `gold_titles`) that its
    results name (`Doc i(Title: t)`, `names_title`), in the observation as the policy read it (a
    title `max_obs_tokens` cut off was not found), and no earlier turn retrieved. The total, their
    sum, is the share of the needed paragraphs the episode retrieved: 1.0 when it found them all.
    Unlike `retrieved_gold_turn`, it credits the bridge search that finds the first hop's paragraph,
    which rarely holds the answer string; repeating a search earns nothing. A task without gold
    titles scores 0 on every turn (its part `known` is 0, so a run can see that it taught nothing)."""
    names = frozenset(tools)

    def retrieved_support_turn(completion: str, task: Task, **ctx: Any) -> RewardResult:
        turns = ctx.get("turns") or [TurnContext(completion)]
        needed = gold_titles(task)
        values, found = [], set()
        for turn in turns:
            outputs = [out for name, out in zip(turn.tools, turn.outputs) if name in names]
            new = {t for t in needed if t not in found and any(names_title(out, t) for out in outputs)
                   and (turn.shown is None or names_title(turn.shown, t))}
            values.append(len(new) / len(needed) if needed else 0.0)
            found |= new
        return RewardResult(sum(values), {"known": float(bool(needed))}, turn_rewards=values)

    retrieved_support_turn.per_turn = True  # gives per-turn rewards (rewards/base.py)
    retrieved_support_turn.needs = (lambda task: bool(gold_titles(task)),  # Rubric.unscorable
                                    "its gold paragraphs (supporting_facts, supporting_titles, golden_context or gold_titles)")
    return retrieved_support_turn
