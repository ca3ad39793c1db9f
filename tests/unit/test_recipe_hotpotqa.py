"""The HotpotQA recipe's parts (seekrl/recipes/hotpotqa.py) on the real dev_distractor rows:

- the split: fixed sizes, disjoint, the same for any row order, every row used once;
- the teacher in `first_query: question` mode over a real BM25 index of the rows' paragraphs:
  the question first, then only gold titles still missing (the bridge entity), then the gold
  answer exactly when every gold paragraph came back;
- `retrievable_rows` (demo.grpo_questions=retrievable) against that teacher's episodes;
- which teacher episodes are kept (`supported_episode`), the paired bootstrap, `passage_words`
  and the `well_formed` eval metric.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from seekrl.data.corpus import Document
from seekrl.data.loaders import builtin_rows, load_tasks
from seekrl.data.teacher import ScriptedTeacher, gold_titles
from seekrl.evaluate import score_trajectory, summarize
from seekrl.generate import run_episode
from seekrl.recipes.hotpotqa import hotpotqa_split, paired_bootstrap, retrievable_rows, sft_share_split, supported_episode
from seekrl.retrieval.bm25 import BM25Index
from seekrl.retrieval.retriever import LocalRetriever
from seekrl.rewards import Rubric
from seekrl.tools.base import ToolRegistry
from seekrl.tools.executor import ToolExecutor
from seekrl.tools.parsers import get_format
from seekrl.tools.search import format_passages, make_search_tool
from seekrl.types import Task, Trajectory, TrajectoryGroup

SEARCH = re.compile(r"<search>(.*?)</search>", re.S)


@pytest.fixture(scope="module")
def rows():
    return [row for _, row in builtin_rows("hotpotqa")]


def test_split_is_fixed_disjoint_and_independent_of_row_order(rows):
    split = hotpotqa_split(rows, 300, 200)
    assert [len(split[k]) for k in ("heldout", "check", "train")] == [300, 200, len(rows) - 500] == [300, 200, 725]
    ids = {k: {r["_id"] for r in v} for k, v in split.items()}
    assert not (ids["heldout"] & ids["check"]) and not (ids["heldout"] & ids["train"]) and not (ids["check"] & ids["train"])
    assert set().union(*ids.values()) == {r["_id"] for r in rows}
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    again = hotpotqa_split(shuffled, 300, 200)
    assert all([r["_id"] for r in again[k]] == [r["_id"] for r in split[k]] for k in split)
    # a larger held-out set keeps the smaller one's questions (the order is one fixed hash order)
    assert ids["heldout"] <= {r["_id"] for r in hotpotqa_split(rows, 400, 100)["heldout"]}
    # both kinds of row (with supporting_facts, and the IRCoT copy's supporting_titles) are in every part
    for part in split.values():
        assert any(r.get("supporting_facts") for r in part) and any(r.get("supporting_titles") for r in part)
    with pytest.raises(ValueError, match="cannot hold out"):
        hotpotqa_split(rows[:10], 8, 2)
    with pytest.raises(ValueError, match="unique _id"):
        hotpotqa_split(rows[:5] + rows[:5], 2, 2)


def test_question_first_teacher_searches_the_bridge_entity_and_answers_only_with_both_paragraphs(rows, tmp_path):
    sample = hotpotqa_split(rows, 300, 200)["train"][:40]
    docs = {}
    for r in sample:
        for title, sentences in r["context"]:
            docs.setdefault(title, Document.from_title_text(str(len(docs)), title, "".join(sentences)))
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(__import__("json").dumps(r) for r in sample) + "\n")
    tasks = load_tasks(str(path), template="search_r1")
    registry = ToolRegistry()
    index = BM25Index.build(list(docs.values()))
    index.save(tmp_path / "index")
    registry.register(make_search_tool(LocalRetriever(index), 3, passage_words=40))
    executor, fmt, rubric = ToolExecutor(registry), get_format("search_r1"), Rubric(["search_r1"])
    teacher = ScriptedTeacher(tasks, "search_r1", skip_search=0.0, stop_early=0.0, weak_query=0.0, give_up=0.0,
                              max_turns=2, first_query="question")

    async def go():
        out = []
        for task in tasks:
            ep = await run_episode(task, teacher, fmt, executor, max_turns=2)
            text = "".join(s["text"] for s in ep["segments"])
            out.append((task, ep, await rubric.score(text, task, finish_reason=ep["finish_reason"])))
        return out

    bridged, one_search = 0, set()
    for task, ep, r in asyncio.run(go()):
        trained = [s["text"] for s in ep["segments"] if not s["masked"]]
        seen = " ".join(s["text"] for s in ep["segments"] if s["masked"])
        queries = [q.strip() for t in trained for q in SEARCH.findall(t)]
        question = task.meta.get("question") or re.search(r"Question:\s*(.+)", task.prompt[-1]["content"]).group(1).strip()
        assert queries[0] == " ".join(question.split())  # the question as it is, on one line
        titles = gold_titles(task)
        for q in queries[1:]:  # later queries: a gold title the earlier results had not brought back
            assert q in titles
        bridged += len(queries) > 1
        if len(queries) == 1:
            one_search.add(task.id)
        found = all(f"(Title: {t})" in seen or f'(Title: "{t}")' in seen for t in titles)
        assert ep["finish_reason"] == "answered"
        if found:
            assert r.parts["search_r1/em"] == 1.0 and r.parts["search_r1/valid_format"] == 1.0
        # every passage is cut to 40 words of text
        for line in seen.split("\n"):
            if line.startswith("Doc "):
                assert len(line.split(") ", 1)[1].split()) <= 41
    assert bridged >= 5  # the question alone often misses the second paragraph
    # demo.grpo_questions=retrievable keeps exactly the questions whose own search found every
    # needed paragraph: those the question-first teacher answered after one search
    kept = retrievable_rows(sample, tmp_path / "index", 3)
    assert {r["_id"] for r in kept} == one_search and 0 < len(kept) < len(sample)
    assert kept == [r for r in sample if r["_id"] in one_search]  # in the rows' order
    assert {r["_id"] for r in retrievable_rows(sample, tmp_path / "index", 6)} > one_search  # more results, more kept
    assert retrievable_rows([], tmp_path / "index", 3) == []


def test_supported_episode_and_passage_words():
    ok = {"answer": ["Paris"], "reward_parts": {"search_r1/retrieved_gold": 1.0}}
    assert supported_episode(ok)
    assert not supported_episode({"answer": ["Paris"], "reward_parts": {"search_r1/retrieved_gold": 0.0}})
    assert supported_episode({"answer": ["Yes"], "reward_parts": {"search_r1/retrieved_gold": 0.0}})
    doc = Document.from_title_text("1", "Paris", "one two three four five six")
    assert format_passages([(doc, 1.0)], 4) == 'Doc 1(Title: "Paris") one two three four ...'
    assert format_passages([(doc, 1.0)], 6) == format_passages([(doc, 1.0)]) == 'Doc 1(Title: "Paris") one two three four five six'
    with pytest.raises(ValueError, match="passage_words"):
        make_search_tool(LocalRetriever(BM25Index.build([doc])), 1, passage_words=-1)


def test_paired_bootstrap():
    same = paired_bootstrap([0, 1, 1, 0] * 25, [0, 1, 1, 0] * 25)
    assert same["mean"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["n"] == 100
    before, after = [0.0] * 300, [0.0] * 270 + [1.0] * 30  # +10 points on 30 of 300 questions
    g = paired_bootstrap(before, after)
    assert g["mean"] == pytest.approx(0.1) and 0.06 < g["ci95"][0] < 0.1 < g["ci95"][1] < 0.14
    assert paired_bootstrap(before, after) == g  # seeded
    mixed = paired_bootstrap([1.0] * 20 + [0.0] * 280, [0.0] * 20 + [1.0] * 25 + [0.0] * 255)
    assert mixed["ci95"][0] < 0 < mixed["ci95"][1]  # +5 wins -20 losses +25 wins: not significant
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0])


def test_well_formed_needs_an_answer_and_no_invalid_turn():
    task = Task("t", [], answer=["Paris"], source="hotpotqa")

    def traj(finish, invalid):
        t = Trajectory(task=task, prompt_ids=[1], completion_ids=[2], loss_mask=[1], logprobs=[0.0], versions=[0])
        t.text, t.finish_reason = "<answer> Paris </answer>", finish
        t.metrics = {"turns": 2.0, "invalid_actions": float(invalid), "tool_calls": 1.0}
        return t

    assert score_trajectory(traj("answered", 0), "qa_em")["well_formed"] == 1.0
    assert score_trajectory(traj("answered", 1), "qa_em")["well_formed"] == 0.0
    assert score_trajectory(traj("max_turns", 0), "qa_em")["well_formed"] == 0.0
    m = summarize([TrajectoryGroup(task, [traj("answered", 0)]), TrajectoryGroup(task, [traj("length", 0)])], "qa_em")
    assert m["eval/well_formed"] == 0.5


def test_curriculum_counts(tmp_path):
    from seekrl.recipes.hotpotqa import curriculum_counts

    path = tmp_path / "curriculum.json"
    tasks = [{"source": "train", "id": str(i), "n": 8, "correct": c} for i, c in enumerate([0, 0, 3, 8, 1, 7, 0])]
    path.write_text(json.dumps({"version": 1, "key": {"k": 8}, "tasks": tasks}))
    assert curriculum_counts(path) == {"measured": 7, "k": 8, "kept": 3, "solved_by_some_sample": 4, "solved_by_all": 1}


def test_two_way_guesses_split_yes_no_either_or_and_open_questions():
    from seekrl.recipes.hotpotqa import answer_options, two_way_guesses

    rows = [
        {"_id": "a", "question": "Are both Parodia and Thalictrum flowering plants?", "answer": "yes"},
        {"_id": "b", "question": "Are Phlebodium and Pieris both ferns?", "answer": "No"},
        {"_id": "c", "question": "Who was born first, Krzysztof Zanussi or Thom Andersen?", "answer": "Krzysztof Zanussi"},
        {"_id": "d", "question": "Which genus has more species, Salvia or Arachis?", "answer": "Arachis"},
        {"_id": "e", "question": "Which magazine came first: Vibe or Cooking Light?", "answer": "Vibe"},
        {"_id": "f", "question": "In what city did the Prince of tenors star in a film?", "answer": "Rome"},
        {"_id": "g", "question": "Is it Bach or Handel or neither?", "answer": "Leipzig"},  # gold names no option: open
        {"_id": "h", "question": "Skipped: not in the scores", "answer": "yes"},
    ]
    preds = {"a": "Yes", "b": "yes", "c": "Thom Andersen", "d": "Arachis", "e": "the Vibe", "f": "Rome", "g": None}
    scores = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 1.0, "f": 1.0, "g": 0.0}
    out = two_way_guesses(rows, preds, scores)
    assert out["yes/no"] == {"n": 2, "em": 0.5, "answered yes": 1.0, "gold yes": 0.5, "named one": 1.0}
    # c: gold first, picked second; d: gold second, picked second; e: gold first, picked first ("the" is normalised away)
    assert out["either-or"] == {"n": 3, "em": pytest.approx(2 / 3), "picked first": pytest.approx(1 / 3), "gold first": pytest.approx(2 / 3),
                                "named one": 1.0}
    assert out["open"] == {"n": 2, "em": 0.5}
    # an answer naming neither option counts in the EM, not in the split
    out = two_way_guesses(rows, {**preds, "c": "Warsaw"}, scores)
    assert out["either-or"]["picked first"] == pytest.approx(1 / 2) and out["either-or"]["n"] == 3
    assert out["either-or"]["named one"] == pytest.approx(2 / 3)
    assert answer_options(rows[2]) == ("either-or", ("krzysztof zanussi", "thom andersen"), 0)
    assert answer_options(rows[4]) == ("either-or", ("vibe", "cooking light"), 0)
    assert answer_options(rows[1]) == ("yes/no", ("yes", "no"), 1) and answer_options(rows[6])[0] == "open"


def test_sft_share_split_is_a_fixed_partition_and_refuses_an_empty_side():
    from seekrl.config import ConfigError, load_config

    train = [{"_id": str(i)} for i in range(10)]
    assert sft_share_split(train, 0.3) == (train[:3], train[3:])
    assert sft_share_split(train, 0.04 + 0.05) == (train[:1], train[1:])
    for share, side in ((0.01, "SFT"), (0.97, "GRPO")):
        with pytest.raises(ConfigError, match=f"leaves {side} none: set it between 0.1 and 0.9, or 1"):
            sft_share_split(train, share)
    for bad in ("0", "1.5", "-0.2"):  # the config refuses a share outside (0, 1] before anything runs
        with pytest.raises(ConfigError, match="demo.sft_share"):
            load_config(None, [f"demo.sft_share={bad}"])


def test_an_eval_is_reused_only_for_the_same_model_questions_and_weights(tmp_path):
    """A rerun in DIR reuses an eval of the same checkpoint path only if the weights there were not
    written after it (a stage retrained in DIR, its checkpoints deleted, is evaluated again)."""
    import os

    from seekrl.recipes.hotpotqa import _evaluated

    model, questions, ev = tmp_path / "sft" / "model", tmp_path / "heldout.jsonl", tmp_path / "sft" / "eval"
    model.mkdir(parents=True)
    ev.mkdir()
    (model / "model.safetensors").write_bytes(b"w")
    (ev / "config.yaml").write_text(f"model:\n  path: {model}\ndata:\n  eval: {questions}\n")
    assert not _evaluated(ev, str(model), questions)  # no eval.json yet
    (ev / "eval.json").write_text("{}")
    t = (ev / "eval.json").stat().st_mtime
    os.utime(model / "model.safetensors", (t - 10, t - 10))
    assert _evaluated(ev, str(model), questions)
    assert not _evaluated(ev, str(model), tmp_path / "check.jsonl")  # other questions
    assert not _evaluated(ev, str(tmp_path / "grpo" / "model"), questions)  # another checkpoint
    os.utime(model / "model.safetensors", (t + 10, t + 10))  # retrained after the eval
    assert not _evaluated(ev, str(model), questions)
    (ev / "config.yaml").write_text(f"model:\n  path: smollm2\ndata:\n  eval: {questions}\n")
    assert _evaluated(ev, "smollm2", questions)  # a named model has no weights in DIR to compare


def test_search_support_counts_what_each_search_retrieved():
    """The needed paragraphs (supporting_facts, or supporting_titles when null) found by the first
    search or only by a later one, and the EM of the episodes whose later search found one."""
    from seekrl.recipes.hotpotqa import search_support

    rows = [{"_id": "a", "supporting_facts": [["Lev Yashin", 0], ["Turgay Şeren", 4], ["Lev Yashin", 2]]},
            {"_id": "b", "supporting_facts": None, "supporting_titles": ["Ed Sullivan", "CBS"]},
            {"_id": "c", "supporting_facts": [["Paris", 0]]},
            {"_id": "d", "supporting_facts": None}]  # no titles: left out

    def info(*titles):
        return "<information>" + "\n".join(f'Doc {i + 1}(Title: "{t}") text' for i, t in enumerate(titles)) + "</information>"

    def ep(task_id, em, *blocks):
        return {"task_id": task_id, "metrics": {"score/em": em}, "completion": "".join(f"<search> q </search>\n\n{b}\n\n" for b in blocks)}

    episodes = [ep("a", 1.0, info("Lev Yashin Cup", "Lev Yashin"), info("Turgay Şeren")),  # the second search adds one
                ep("b", 0.0, info("Ed Sullivan", "CBS"), info("Ed Sullivan")),  # both first, the second adds nothing
                ep("c", 1.0, info("Paris")),  # one search, everything found
                ep("d", 1.0, info("X"), info("Y"))]
    out = search_support(rows, episodes)
    assert out == {"episodes": 3, "all_retrieved": 1.0, "searched_again": 2, "later_search_new": 1,
                   "em_later_new": 1.0, "em_later_nothing_new": 0.0}
    # unquoted titles count too; a title that is only a prefix of a retrieved one does not
    out = search_support(rows[:1], [ep("a", 0.0, "<information>Doc 1(Title: Lev Yashin Cup) x</information>")])
    assert out["all_retrieved"] == 0.0 and out["searched_again"] == 0 and out["em_later_new"] is None
    assert search_support(rows[3:], episodes) == {"episodes": 0, "all_retrieved": None, "searched_again": 0,
                                                  "later_search_new": 0, "em_later_new": None, "em_later_nothing_new": None}


def test_recipe_checks_its_config_before_any_stage_including_options_that_need_the_search_tool(tmp_path):
    """The recipe checks the config and its overrides before the index exists: the answer-branch
    options, which need tools.format, are accepted and checked (a bad one fails), and a
    retriever folder that is not there yet is not an error."""
    from seekrl.config import ConfigError, load_config
    from seekrl.recipes.hotpotqa import DEFAULT_CONFIG, check_config
    from seekrl.recipes.hotpotqa import run as run_recipe

    over = [f"tools.retriever={tmp_path / 'index'}", "rollout.answer_branches=4", "rollout.branch_temperature=1.0",
            "demo.grpo_engine=local",  # the shipped vllm needs `make vllm` (the next test)
            "demo.seed_memory_gib=0"]  # the shipped three seeds at once need 21 GiB free (the test after it)
    cfg = check_config(str(DEFAULT_CONFIG), over)
    assert (cfg.rollout.answer_branches, cfg.tools.format) == (4, "search_r1")
    with pytest.raises(ConfigError, match="rollout.trajectory: 'full' is not one of"):
        check_config(str(DEFAULT_CONFIG), [*over, "rollout.trajectory=full"])
    with pytest.raises(ConfigError, match="answer_branches"):  # the tools checks run: branches need a tool format
        check_config(str(DEFAULT_CONFIG), [*over, "tools.format=null"])
    assert check_config(str(DEFAULT_CONFIG), [*over, "demo.ptx_kinds=[yes/no]"]).demo.ptx_kinds == ["yes/no"]
    with pytest.raises(ConfigError, match=r"demo.ptx_kinds\[1\]: 'bridge' is not one of yes/no, either-or, open$"):
        check_config(str(DEFAULT_CONFIG), [*over, "demo.ptx_kinds=[yes/no, bridge]"])
    with pytest.raises(ConfigError, match=r"demo.ptx_kinds\[0\]: 'yes-no' is not one of .*did you mean 'yes/no'"):
        load_config(None, ["model.path=tiny", "demo.ptx_kinds=[yes-no]"])  # every command checks it, not only the recipe
    with pytest.raises(ConfigError, match="demo.ptx_kinds is empty"):
        check_config(str(DEFAULT_CONFIG), [*over, "demo.ptx_kinds=[]"])
    with pytest.raises(ConfigError, match="rollout.trajectory"):  # the recipe fails before its first stage
        run_recipe(str(tmp_path / "out"), None, ["rollout.answer_branches=2", "rollout.trajectory=full"])
    assert not (tmp_path / "out" / "index").exists()


def test_seeds_at_once_must_fit_the_available_memory_before_any_stage(tmp_path, monkeypatch):
    """demo.grpo_parallel > 1: min(grpo_parallel, seeds) x demo.seed_memory_gib must fit Linux's
    MemAvailable, checked before the first stage with a one-line error that names the fix; one seed
    at a time, or demo.seed_memory_gib=0, is not checked."""
    import seekrl.recipes.hotpotqa as recipe
    from seekrl.config import ConfigError
    from seekrl.recipes.children import available_memory_gib

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   16777216 kB\n")
    assert available_memory_gib(meminfo) == 16.0
    assert available_memory_gib(tmp_path / "none") is None
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert available_memory_gib(meminfo) is None
    monkeypatch.setattr(recipe, "available_memory_gib", lambda: 16.0)
    over = [f"tools.retriever={tmp_path / 'index'}", "demo.grpo_engine=local"]
    for ok in (["demo.grpo_parallel=1"], ["demo.grpo_parallel=3", "demo.grpo_seeds=[0]"], ["demo.grpo_parallel=2"],
               ["demo.grpo_parallel=2", "demo.seed_memory_gib=8"], ["demo.seed_memory_gib=0"]):
        recipe.check_config(str(recipe.DEFAULT_CONFIG), [*over, *ok])
    with pytest.raises(ConfigError, match=r"^demo.grpo_parallel=3 runs 3 GRPO seeds at once, about 21.0 GiB at their peak "
                                          r"\(3 x demo.seed_memory_gib=7\), and 16.0 GiB is available: lower demo.grpo_parallel"):
        recipe.check_config(str(recipe.DEFAULT_CONFIG), over)  # the shipped three seeds at once
    with pytest.raises(ConfigError, match="about 22.0 GiB"):  # in pairs, at 11 GiB a seed
        recipe.check_config(str(recipe.DEFAULT_CONFIG), [*over, "demo.grpo_parallel=2", "demo.seed_memory_gib=11"])
    cfg = recipe.check_config(str(recipe.DEFAULT_CONFIG), [*over, "demo.grpo_parallel=2", "demo.seed_memory_gib=8"])
    recipe.check_seed_memory(cfg, 1, available=1.0)  # the last group of one seed: no check
    with pytest.raises(ConfigError, match="about 16.0 GiB .* 15.9 GiB is available"):  # just over
        recipe.check_seed_memory(cfg, 2, available=15.9)
    with pytest.raises(ConfigError, match="demo.grpo_parallel"):  # the recipe fails before its first stage
        recipe.run(str(tmp_path / "out"), None, ["demo.grpo_engine=local"])
    assert not (tmp_path / "out" / "index").exists()


def test_grpo_engine_vllm_samples_only_grpo_on_a_server_and_is_checked_before_any_stage(tmp_path, monkeypatch):
    """demo.grpo_engine=vllm gives the GRPO stages one vLLM server each (with --max-model-len
    model.max_context unless server_args has it) and nothing else; the recipe checks that vLLM is
    installed and that the GRPO stages' config holds with it before its first stage."""
    import importlib.util

    import seekrl.engines.setup as setup
    from seekrl.config import ConfigError
    from seekrl.recipes.hotpotqa import DEFAULT_CONFIG, check_config, grpo_engine_overrides, grpo_overrides
    from seekrl.recipes.hotpotqa import run as run_recipe

    over = [f"tools.retriever={tmp_path / 'index'}", "demo.grpo_dtype=null", "demo.seed_memory_gib=0"]
    assert grpo_engine_overrides(check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_engine=local"])) == []
    local = check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_engine=local", "demo.grpo_dtype=bf16_if_native"])
    assert grpo_engine_overrides(local) == ["engine.dtype=bf16_if_native"]  # the GRPO stages' dtype only
    assert local.engine.dtype == "auto"  # the evals' (and SFT's) engine.dtype is the config's
    with pytest.raises(ConfigError, match=r"demo.grpo_dtype: 'bf16' is not one of .*did you mean 'bfloat16'"):
        check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_dtype=bf16"])
    monkeypatch.setattr(setup, "default_server_python", lambda: "/opt/vllm/bin/python")  # as if `make vllm` had run
    cfg = check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_engine=vllm"])
    kv = ["--kv-cache-memory-bytes", "268435456"]  # the shipped server_args: a 256 MiB KV cache
    assert grpo_engine_overrides(cfg) == ["engine.servers=1", "engine.server_kind=vllm",
                                          f'engine.server_args=["{kv[0]}", "{kv[1]}", "--max-model-len", "{cfg.model.max_context}"]']
    shipped = check_config(str(DEFAULT_CONFIG), [over[0], over[2]])  # the recipe as shipped: a bf16 vLLM server for GRPO
    assert grpo_engine_overrides(shipped)[:3] == ["engine.dtype=bf16_if_native", "engine.servers=1", "engine.server_kind=vllm"]
    assert grpo_overrides(shipped) == [*grpo_engine_overrides(shipped), "train.micro_batch_tokens=1024"]  # GRPO's micro-batches
    assert shipped.train.micro_batch_tokens == 2048  # SFT's
    assert grpo_overrides(check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_micro_batch_tokens=0"])) == grpo_engine_overrides(cfg)
    with pytest.raises(ConfigError, match="demo.grpo_micro_batch_tokens"):
        check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_micro_batch_tokens=-1"])
    given = check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_engine=vllm", "engine.server_args=[--max-model-len=2048,--seed,3]"])
    assert grpo_engine_overrides(given)[-1] == 'engine.server_args=["--max-model-len=2048", "--seed", "3"]'
    from seekrl.config import load_config  # the overrides make a GRPO config that samples on one started vLLM server
    grpo = load_config(str(DEFAULT_CONFIG), ["tools.retriever=http://127.0.0.1:1/retrieve", *grpo_overrides(cfg)])
    assert (grpo.engine.kind, grpo.engine.servers, grpo.engine.api) == ("remote", 1, "vllm")
    assert grpo.engine.server_args == [*kv, "--max-model-len", str(cfg.model.max_context)]
    assert grpo.train.micro_batch_tokens == 1024
    with pytest.raises(ConfigError, match="rollout.top_p=1"):  # a rule of the vLLM engine, checked up front
        check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_engine=vllm", "rollout.top_p=0.9"])
    monkeypatch.setattr(setup, "default_server_python", lambda: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match=r"demo.grpo_engine=vllm .* vLLM is not installed: run `make vllm`"):
        run_recipe(str(tmp_path / "out"), None, [])  # the shipped default
    assert check_config(str(DEFAULT_CONFIG), [*over, "demo.grpo_engine=local"]).demo.grpo_engine == "local"  # needs no vLLM
    assert not (tmp_path / "out" / "index").exists()  # before the first stage
