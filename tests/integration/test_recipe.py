"""`seekrl demo --recipe hotpotqa_smollm2` end to end at a toy size, a tiny random model standing in
for SmolLM2: the real HotpotQA index and split, the teacher with the real search tool, SFT, evals,
two GRPO seeds (the first with its learning curve on the check questions), results and report; a
rerun resumes (every stage skipped); `seekrl eval` on a stage's config.yaml reproduces the recipe's
own eval; checkpoints load with from_pretrained."""

from __future__ import annotations

import json

import pytest

from seekrl.cli import main

SMALL = [
    "model.path=tiny", "model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_vocab=512",
    "demo.eval_questions=8", "demo.base_questions=4", "demo.check_questions=6",
    "demo.sft_steps=2", "demo.sft_batch_size=4", "train.steps=2", "train.save_every=1",
    "rollout.batch_size=8", "rollout.group_size=4", "rollout.max_new_tokens=8",
    "log.progress=false", "log.tensorboard=false",
    "model.freeze_layers=0", "demo.grpo_seeds=[0,1]", "demo.check_every=1", "demo.curve_questions=3",
    "demo.sft_precision=bf16", "demo.grpo_engine=local",  # the shipped vLLM server needs `make vllm` (tests/integration/test_vllm.py)
    "demo.grpo_parallel=1",  # the seeds one after the other in the recipe's process; at once in test_more_grpo_steps_continue_from_the_checkpoint_and_evaluate_the_new_model
    "demo.seed_memory_gib=0.25",  # a seed of the 1-layer model, not SmolLM2's 7 GiB: demo.grpo_parallel=2 runs on a small CI machine
]


def _lines(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe") / "hotpotqa"
    assert main(["demo", "--recipe", "hotpotqa_smollm2", "--out", str(out), *SMALL]) == 0
    return out


def test_recipe_runs_every_stage(recipe):
    out = recipe
    assert json.loads((out / "index" / "meta.json").read_text())["num_docs"] == 14903
    data = {k: _lines(out / "data" / f"{k}.jsonl") for k in ("train", "heldout", "check", "base", "curve")}
    assert [len(data[k]) for k in ("train", "heldout", "check", "base", "curve")] == [1225 - 14, 8, 6, 4, 3]
    assert data["curve"] == data["check"][:3]
    ids = {k: {r["_id"] for r in v} for k, v in data.items()}
    assert ids["base"] <= ids["heldout"] and not ids["heldout"] & ids["train"] and not ids["check"] & ids["train"]
    assert not ids["heldout"] & ids["check"]
    from seekrl.recipes.hotpotqa import answer_options

    opened = _lines(out / "data" / "check_open.jsonl")  # the check questions whose answer has to be read, in order
    assert opened == [r for r in data["check"] if answer_options(r)[0] == "open"] and 0 < len(opened) < len(data["check"])

    # the teacher: only train questions; kept episodes answer the gold answer, supported by a passage
    kept = _lines(out / "teacher_sft.jsonl")
    counts = json.loads((out / "teacher_counts.json").read_text())
    sft_half, rl_half = _lines(out / "data" / "train_sft.jsonl"), _lines(out / "data" / "train_rl.jsonl")  # demo.sft_share=0.5
    assert sft_half + rl_half == data["train"] and len(sft_half) == round(0.5 * len(data["train"]))
    assert counts["episodes"] == len(sft_half) and counts["kept"] == len(kept) > 0.6 * counts["episodes"]
    assert {r["id"] for r in kept} <= {r["_id"] for r in sft_half}
    assert all(r["reward_parts"]["search_r1/em"] == 1.0 for r in kept)
    assert all(any(s["masked"] and "<information>" in s["text"] for s in r["segments"]) for r in kept)

    # trained stages: resolved config and from_pretrained-loadable checkpoints
    from transformers import AutoModelForCausalLM

    for stage in ("sft", "grpo", "grpo_s1"):
        assert "tools:" in (out / stage / "config.yaml").read_text()
        if stage == "sft":  # demo.sft_precision reaches the SFT stage
            assert "  mixed_precision: bf16\n" in (out / stage / "config.yaml").read_text()
        model = AutoModelForCausalLM.from_pretrained(out / stage / "checkpoints" / "step_2" / "model")
        assert model.config.num_hidden_layers == 1

    # the shipped GRPO preset reaches both seeds: PPO-ptx on SFT's half's yes/no episodes, EM reward, local answer
    # credit, answer branches, the rest of the training questions, and demo.grpo_dtype as the GRPO engine's dtype only
    import yaml

    ptx = _lines(out / "data" / "ptx.jsonl")
    kind = {r["_id"]: answer_options(r)[0] for r in data["train"]}
    assert ptx and {kind[r["id"]] for r in ptx} == {"yes/no"} and {r["id"] for r in ptx} <= {r["_id"] for r in sft_half}
    for stage in ("grpo", "grpo_s1"):
        c = yaml.safe_load((out / stage / "config.yaml").read_text())
        assert c["data"]["train"] == str(out / "data" / "train_rl.jsonl") and c["data"]["ptx"] == str(out / "data" / "ptx.jsonl")
        assert (c["algo"]["ptx_coef"], c["algo"]["branch_credit"], c["reward"]["functions"]) == (0.2, "local", ["qa_em"])
        assert (c["rollout"]["answer_branches"], c["rollout"]["branch_from"], c["engine"]["dtype"]) == (4, "answer", "bf16_if_native")
    for stage in ("sft", "grpo", "grpo_s1"):  # every eval samples with engine.dtype (auto: the checkpoint's fp32)
        assert yaml.safe_load((out / stage / "eval" / "config.yaml").read_text())["engine"]["dtype"] == "auto"

    res = json.loads((out / "results.json").read_text())
    assert [(r["model"], r["n"]) for r in res["table"]] == [
        ("base model", 4), ("after SFT", 8), ("after GRPO (train.seed=0)", 8), ("after GRPO (train.seed=1)", 8),
        ("after GRPO, check questions (train.seed=0)", 3)]
    for row, name in zip(res["table"], ("base", "sft", "grpo", "grpo_s1")):
        ev = json.loads((out / name / "eval" / "eval.json").read_text())
        assert row["EM"] == ev["eval/em"] and row["well-formed"] == ev["eval/well_formed"]
        assert row["searches/question"] == ev["eval/tool_calls"]
    assert (out / "grpo_s1" / "config.yaml").read_text().count("seed: 1") >= 1
    for i, name in enumerate(("grpo", "grpo_s1")):
        g = res["grpo_gains"][name]
        assert g["n"] == 8 and g["ci95"][0] <= g["mean"] <= g["ci95"][1] and g["seed"] == i
        assert g["mean"] == pytest.approx(res["table"][2 + i]["EM"] - res["table"][1]["EM"])
    assert res["grpo_gain"] == res["grpo_gains"]["grpo"]
    assert res["grpo_gain_mean"] == pytest.approx((res["grpo_gains"]["grpo"]["mean"] + res["grpo_gains"]["grpo_s1"]["mean"]) / 2)
    m = res["grpo_gain_mean_ci"]  # the seeds' mean, question by question: the same mean gain, an interval around it
    assert m["mean"] == pytest.approx(res["grpo_gain_mean"]) and m["ci95"][0] <= m["mean"] <= m["ci95"][1] and m["evals"] == 2
    assert "across the 2 seeds" in (out / "results.md").read_text() and "95% CI" in (out / "results.md").read_text()
    # EM by question type: the held-out questions' own types, weighted back to the overall EM
    kinds = {r["_id"]: r["type"] or "unknown" for r in data["heldout"]}  # 302 dev rows (an IRCoT copy) have no type
    for name in ("sft", "grpo", "grpo_s1"):
        by = res["em_by_type"][name]
        assert set(by) == set(kinds.values()) and sum(v["n"] for v in by.values()) == 8
        assert sum(v["em"] * v["n"] for v in by.values()) / 8 == pytest.approx(res["evals"][name]["eval/em"])
        # the questions with two possible answers and the open ones: every held-out question once, the same EM
        tw = res["two_way"][name]
        assert sum(v["n"] for v in tw.values()) == 8
        assert sum((v["em"] or 0.0) * v["n"] for v in tw.values()) / 8 == pytest.approx(res["evals"][name]["eval/em"])
    # the gain on the open questions: the same paired bootstrap, over those questions only
    n_open = res["two_way"]["sft"]["open"]["n"]
    for name in ("grpo", "grpo_s1"):
        if n_open:
            g, tw = res["open_gains"][name], res["two_way"]
            assert g["n"] == n_open and g["mean"] == pytest.approx(tw[name]["open"]["em"] - tw["sft"]["open"]["em"])
    # the learning curve: the first seed on the curve questions at steps 0, 1 (every 1) and 2 (the last)
    curve = res["curve"]
    assert [p["step"] for p in curve] == [0, 1, 2] and curve[0]["minutes"] == 0 and curve[-1]["minutes"] > 0
    evals = [r for r in _lines(out / "grpo" / "metrics.jsonl") if "eval/em" in r]
    assert [p["check EM"] for p in curve] == [r["eval/em"] for r in evals] and all(r["eval/count"] == 3 for r in evals)
    assert res["table"][-1]["EM"] == evals[-1]["eval/em"] and all("time/eval_s" in r for r in evals)
    assert not (out / "grpo_s1" / "metrics.jsonl").read_text().count("eval/em")  # only the first seed draws the curve
    assert set(res["train_seconds"]) == {"sft", "grpo", "grpo_s1"} and all(v > 0 for v in res["train_seconds"].values())
    assert set(res["stage_seconds"]) == {"index", "teacher", "eval base", "sft", "eval sft", "grpo", "eval grpo", "grpo_s1",
                                         "eval grpo_s1"}
    md = (out / "results.md").read_text()
    assert "95% CI" in md and "| total |" in md and "after GRPO, check questions" in md
    assert "GRPO (train.seed=1) over SFT" in md and "Mean EM gain" in md and "Learning curve" in md and "bridge EM" in md
    assert "open EM (n=" in md
    support = res["search_support"]  # what each stage's searches retrieved, on every held-out question (all have titles)
    assert set(support) == {"sft", "grpo", "grpo_s1"} and all(s["episodes"] == len(data["heldout"]) for s in support.values())
    assert all(s["later_search_new"] <= s["searched_again"] <= s["episodes"] for s in support.values())
    assert "What the searches retrieved" in md
    ceiling = res["ceiling_command"]  # the pass@k ceiling, one command on the open check questions
    assert f"data.eval={out / 'data' / 'check_open.jsonl'}" in ceiling and "eval.n=8" in ceiling and ceiling in md
    assert f"model.path={out / 'sft' / 'checkpoints' / 'step_2' / 'model'}" in ceiling
    page = (out / "report.html").read_text()
    assert page.index("Held-out questions before and after each stage") < page.index("Learning curve") < page.index("<details")
    assert "What the searches retrieved" in page


def test_rerun_resumes_and_skips_every_stage(recipe, capsys):
    before = (recipe / "stage_seconds.json").read_text()
    results = json.loads((recipe / "results.json").read_text())
    assert main(["demo", "--recipe", "hotpotqa_smollm2", "--out", str(recipe), *SMALL]) == 0
    assert (recipe / "stage_seconds.json").read_text() == before  # nothing ran again
    again = json.loads((recipe / "results.json").read_text())
    assert again["table"] == results["table"] and again["grpo_gain"] == results["grpo_gain"]


def test_eval_on_a_stage_config_reproduces_the_recipe_eval(recipe):
    model = recipe / "grpo" / "checkpoints" / "step_2" / "model"
    for stage in ("grpo", "sft"):
        assert main(["eval", str(recipe / stage / "config.yaml"), f"model.path={model}",
                     f"data.eval={recipe / 'data' / 'heldout.jsonl'}", f"log.name=again_{stage}"]) == 0
        again = json.loads((recipe / f"again_{stage}" / "eval" / "eval.json").read_text())
        check = json.loads((recipe / "grpo" / "eval" / "eval.json").read_text())
        assert {k: again[k] for k in ("eval/em", "eval/f1", "eval/tool_calls", "eval/well_formed", "eval/count")} == \
               {k: check[k] for k in ("eval/em", "eval/f1", "eval/tool_calls", "eval/well_formed", "eval/count")}


def test_unknown_recipe_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--recipe", "nope"])
    assert e.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_more_grpo_steps_continue_from_the_checkpoint_and_evaluate_the_new_model(recipe):
    """A longer budget: the same command with train.steps=3 resumes GRPO at step 2 and runs the
    evals after it again on step 3; the stages before it are skipped. Here with
    demo.grpo_parallel=2: both seeds resume at once, as child `seekrl train` processes, each then
    its eval in the same child (their output in DIR/<run>.log)."""
    before = json.loads((recipe / "stage_seconds.json").read_text())
    assert main(["demo", "--recipe", "hotpotqa_smollm2", "--out", str(recipe), *SMALL, "train.steps=3",
                 "demo.grpo_parallel=2"]) == 0
    after = json.loads((recipe / "stage_seconds.json").read_text())
    assert {k: after[k] for k in ("index", "teacher", "eval base", "sft", "eval sft")} == \
           {k: before[k] for k in ("index", "teacher", "eval base", "sft", "eval sft")}
    assert set(after) - set(before) == {"grpo + grpo_s1, each then its eval (at once)"}
    for name in ("grpo", "grpo_s1"):  # each child's own output: its training run, then its eval
        log = (recipe / f"{name}.log").read_text()
        assert log.index(f"run folder: {recipe / name}\n") < log.index(f"wrote {recipe / name / 'eval' / 'eval.json'},")
    for name in ("grpo", "grpo_s1"):
        steps = [r["step"] for r in _lines(recipe / name / "metrics.jsonl") if "reward/mean" in r]
        assert steps == [1, 2, 3]
        assert "step_3/model" in (recipe / name / "eval" / "config.yaml").read_text()
    res = json.loads((recipe / "results.json").read_text())
    assert res["evals"]["grpo"] == json.loads((recipe / "grpo" / "eval" / "eval.json").read_text())
    assert [p["step"] for p in res["curve"]] == [0, 1, 2, 3]


def test_open_questions_only_grpo_draws_no_two_answer_question(recipe, tmp_path):
    """demo.grpo_questions=open: GRPO trains on DIR/data/train_open.jsonl, the training questions of
    its share whose answer has to be read (answer_options 'open'); the teacher and SFT stages are reused. With
    demo.ptx_coef, every GRPO update adds the SFT loss of the teacher's kept episodes of the other
    training questions (DIR/data/ptx.jsonl, PPO-ptx), of the kinds demo.ptx_kinds (here yes/no)."""
    import shutil

    from seekrl.recipes.hotpotqa import answer_options

    out = tmp_path / "open"
    shutil.copytree(recipe, out, ignore=shutil.ignore_patterns("grpo*", "again_*", "check", "results.*", "report*"))
    for f in out.rglob("*.yaml"):
        f.write_text(f.read_text().replace(str(recipe), str(out)))
    before = json.loads((out / "stage_seconds.json").read_text())
    assert main(["demo", "--recipe", "hotpotqa_smollm2", "--out", str(out), *SMALL, "demo.grpo_seeds=[0]",
                 "demo.check_every=0", "demo.grpo_questions=open", "demo.ptx_coef=0.5", "demo.ptx_kinds=[yes/no]"]) == 0
    after = json.loads((out / "stage_seconds.json").read_text())
    assert {k: after[k] for k in ("index", "teacher", "sft")} == {k: before[k] for k in ("index", "teacher", "sft")}

    train = _lines(out / "data" / "train.jsonl")
    kinds = {r["_id"]: answer_options(r)[0] for r in train}
    assert {"yes/no", "either-or", "open"} <= set(kinds.values())
    opened = _lines(out / "data" / "train_open.jsonl")  # of GRPO's share of them (demo.sft_share=0.5)
    assert opened == [r for r in _lines(out / "data" / "train_rl.jsonl") if kinds[r["_id"]] == "open"]
    assert json.loads((out / "results.json").read_text())["split"]["train_open"] == len(opened)
    assert f"train: {out / 'data' / 'train_open.jsonl'}" in (out / "grpo" / "config.yaml").read_text()
    drawn = {r["task_id"] for f in (out / "grpo" / "trajectories").glob("*.jsonl") for r in _lines(f)}
    assert drawn and all(kinds[i] == "open" for i in drawn)
    held = _lines(out / "data" / "ptx.jsonl")
    assert held == [r for r in _lines(out / "teacher_sft.jsonl") if kinds[r["id"]] == "yes/no"] and held
    assert any(kinds[r["id"]] == "either-or" for r in _lines(out / "teacher_sft.jsonl"))  # kept, and left out of ptx
    config = (out / "grpo" / "config.yaml").read_text()
    assert f"ptx: {out / 'data' / 'ptx.jsonl'}" in config and "ptx_coef: 0.5" in config
    metrics = [r for r in _lines(out / "grpo" / "metrics.jsonl") if r["step"] > 0]
    updated = [r for r in metrics if "loss/ptx" in r]  # steps where a group had reward spread (algo.filter_zero_std)
    assert metrics and all(r["loss/ptx"] > 0 and r["ptx/tokens"] > 0 for r in updated)


def test_retrievable_questions_grpo_draws_only_questions_whose_search_finds_every_paragraph(recipe, tmp_path):
    """demo.grpo_questions=retrievable: GRPO trains on DIR/data/train_retrievable.jsonl, the open
    training questions whose own search returns every needed paragraph in the top tools.topk."""
    import shutil

    from seekrl.recipes.hotpotqa import retrievable_rows

    out = tmp_path / "retrievable"
    shutil.copytree(recipe, out, ignore=shutil.ignore_patterns("grpo*", "again_*", "check", "results.*", "report*"))
    for f in out.rglob("*.yaml"):
        f.write_text(f.read_text().replace(str(recipe), str(out)))
    assert main(["demo", "--recipe", "hotpotqa_smollm2", "--out", str(out), *SMALL, "demo.grpo_seeds=[0]", "demo.check_every=0",
                 "demo.grpo_questions=retrievable"]) == 0
    opened = _lines(out / "data" / "train_open.jsonl")
    found = _lines(out / "data" / "train_retrievable.jsonl")
    assert found == retrievable_rows(opened, out / "index", 3) and 0 < len(found) < len(opened)
    assert json.loads((out / "results.json").read_text())["split"]["train_retrievable"] == len(found)
    assert f"the {len(found)} of the {len(opened)} open training questions whose own search" in (out / "results.md").read_text()
    assert f"train: {out / 'data' / 'train_retrievable.jsonl'}" in (out / "grpo" / "config.yaml").read_text()
    drawn = {r["task_id"] for f in (out / "grpo" / "trajectories").glob("*.jsonl") for r in _lines(f)}
    assert drawn and drawn <= {r["_id"] for r in found}


def test_sft_share_gives_grpo_only_questions_sft_never_saw(recipe, tmp_path, capsys):
    """demo.sft_share=0.5: the teacher plays (and SFT trains on) the first half of the training
    questions, DIR/data/train_sft.jsonl; GRPO draws only from the other half, DIR/data/train_rl.jsonl
    (then its open questions). A rerun in DIR with another share is one line, exit 2."""
    import shutil

    from seekrl.recipes.hotpotqa import answer_options, sft_share_split

    out = tmp_path / "share"
    shutil.copytree(recipe, out, ignore=shutil.ignore_patterns("teacher*", "sft*", "grpo*", "again_*", "check", "results.*",
                                                               "report*", "stage_seconds.json"))
    for f in out.rglob("*.yaml"):
        f.write_text(f.read_text().replace(str(recipe), str(out)))
    argv = ["demo", "--recipe", "hotpotqa_smollm2", "--out", str(out), *SMALL, "demo.grpo_seeds=[0]", "demo.check_every=0",
            "reward.functions=[qa_f1,retrieved_support_turn]", "reward.weights=[1.0,0.5]",  # the teacher keeps search_r1
            "demo.grpo_questions=open", "demo.ptx_kinds=[yes/no,either-or,open]", "demo.sft_share=0.5", "demo.ptx_coef=0.5"]
    assert main(argv) == 0
    assert "eval base" not in json.loads((out / "stage_seconds.json").read_text())  # the base eval was reused

    train = _lines(out / "data" / "train.jsonl")
    sft_q, rl_q = _lines(out / "data" / "train_sft.jsonl"), _lines(out / "data" / "train_rl.jsonl")
    assert sft_q + rl_q == train and len(sft_q) == round(0.5 * len(train))
    assert (sft_q, rl_q) == sft_share_split(train, 0.5)  # the train file's fixed order
    sft_ids, rl_ids = {r["_id"] for r in sft_q}, {r["_id"] for r in rl_q}
    counts = json.loads((out / "teacher_counts.json").read_text())
    assert counts["episodes"] == len(sft_q) and counts["sft_share"] == 0.5
    kept = _lines(out / "teacher_sft.jsonl")
    assert kept and {r["id"] for r in kept} <= sft_ids  # SFT saw answers of its share only
    assert f"train: {out / 'teacher_sft.jsonl'}" in (out / "sft" / "config.yaml").read_text()
    opened = _lines(out / "data" / "train_open.jsonl")
    assert opened == [r for r in rl_q if answer_options(r)[0] == "open"]
    episodes = [r for f in (out / "grpo" / "trajectories").glob("*.jsonl") for r in _lines(f)]
    drawn = {r["task_id"] for r in episodes}
    assert drawn and drawn <= rl_ids and not drawn & sft_ids
    # GRPO's reward credits the needed paragraphs each episode's searches retrieved (hotpotqa_gold_titles, as shown)
    import re

    from seekrl.data.corpus import hotpotqa_gold_titles
    from seekrl.data.teacher import names_title

    titles = {r["_id"]: hotpotqa_gold_titles(r) for r in rl_q}
    for ep in episodes:
        shown = re.findall(r"<information>(.*?)</information>", ep["completion"], re.DOTALL)
        want = sum(any(names_title(b, t) for b in shown) for t in titles[ep["task_id"]]) / len(titles[ep["task_id"]])
        assert ep["reward_parts"]["retrieved_support_turn"] == pytest.approx(want)
        assert ep["reward"] == pytest.approx(ep["reward_parts"]["qa_f1"] + 0.5 * want)
    assert _lines(out / "data" / "ptx.jsonl") == kept  # every SFT episode is outside GRPO's questions
    res = json.loads((out / "results.json").read_text())
    assert (res["split"]["train_sft"], res["split"]["train_rl"]) == (len(sft_q), len(rl_q))
    assert f"GRPO drew only from the other {len(rl_q)}" in (out / "results.md").read_text()

    capsys.readouterr()  # the teacher and SFT stages of DIR belong to share 0.5
    assert main([*argv[:-2], "demo.sft_share=0.25", "demo.ptx_coef=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("seekrl: error:") and "demo.sft_share=0.5, not 0.25" in err[-1]

    # demo.grpo_share=all: the same teacher and SFT stages (reused), GRPO drawing from every training question
    both = tmp_path / "share_all"
    shutil.copytree(out, both, ignore=shutil.ignore_patterns("grpo*", "check", "results.*", "report*", "stage_seconds.json"))
    for f in both.rglob("*.yaml"):
        f.write_text(f.read_text().replace(str(out), str(both)))
    assert argv[4] == str(out)
    assert main([*argv[:4], str(both), *argv[5:-4], "demo.sft_share=0.5", "demo.ptx_coef=0.5", "demo.ptx_kinds=[yes/no,either-or,open]",
                 "demo.grpo_share=all", "demo.grpo_questions=all"]) == 0
    assert not {"teacher", "sft"} & set(json.loads((both / "stage_seconds.json").read_text()))  # reused
    assert f"train: {both / 'data' / 'train.jsonl'}" in (both / "grpo" / "config.yaml").read_text()
    drawn = {r["task_id"] for f in (both / "grpo" / "trajectories").glob("*.jsonl") for r in _lines(f)}
    assert drawn and drawn <= sft_ids | rl_ids
    assert _lines(both / "data" / "ptx.jsonl") == kept  # GRPO draws every question, so PPO-ptx holds every kept episode
    res = json.loads((both / "results.json").read_text())
    assert res["grpo_share"] == "all"
    assert f"GRPO drew from all {len(train)} (demo.grpo_share=all)" in (both / "results.md").read_text()
