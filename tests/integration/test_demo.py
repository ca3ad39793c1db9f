"""`seekrl demo` end to end at a toy size: every stage runs for real and leaves its files.

The full-size demo (examples/demo_search.yaml) is what `make demo` runs; its learning figures are
in RESULTS.md. Here the world, SFT and GRPO are shrunk so the whole pipeline takes seconds, and
the test checks what each stage must leave behind and that the numbers in the outputs agree.
"""

from __future__ import annotations

import json

from seekrl.cli import main

SMALL = [
    "demo.world_entities=30", "demo.world_questions=90", "demo.sft_steps=6", "demo.sft_batch_size=8",
    "demo.pretrain_entities=40", "demo.pretrain_steps=3", "demo.pretrain_episodes=30",
    "model.tiny_hidden=32", "model.tiny_layers=2", "data.max_eval=12", "train.steps=2", "train.save_every=1",
    "eval.every=1", "rollout.batch_size=16", "log.progress=false", "log.tensorboard=false",
]


def test_demo_runs_every_stage_and_writes_results_and_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), *SMALL]) == 0
    printed = capsys.readouterr().out

    # 1-3: world, index, teacher episodes (SFT rows with masked observations)
    assert (out / "world" / "corpus.jsonl").is_file() and (out / "index" / "meta.json").is_file()
    rows = [json.loads(line) for line in (out / "teacher.jsonl").read_text().splitlines()]
    assert len(rows) == len((out / "world" / "train.jsonl").read_text().splitlines())
    masked = [s for r in rows for s in r["segments"] if s["masked"]]
    assert masked and all("<information>" in s["text"] for s in masked)
    # 4: pretraining on another world's passages and flawless teacher episodes (every token
    # trained), none naming a demo entity; SFT starts from it
    names = [json.loads(line)["name"] for line in (out / "world" / "entities.jsonl").read_text().splitlines()]
    background = [json.loads(line) for line in (out / "background_text.jsonl").read_text().splitlines()]
    texts = [r["text"] for r in background if "text" in r]
    episodes = [r for r in background if "segments" in r]
    assert len(texts) >= 10 and not any(n in t for n in names for t in texts)
    assert len(episodes) >= 20 and not any(n in json.dumps(e) for n in names for e in episodes)
    assert all(not s["masked"] for e in episodes for s in e["segments"])
    assert any("<information>" in s["text"] for e in episodes for s in e["segments"])
    bg_world = {json.loads(line)["question"] for line in (out / "background" / "world" / "train.jsonl").read_text().splitlines()}
    assert all(e["prompt"][-1]["content"] in bg_world for e in episodes)
    pre = [json.loads(line) for line in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in pre if "eval/loss" in r] == [0, 3]  # the teacher episodes' loss, before and after
    pre_model = out / "pretrain" / "checkpoints" / "step_3" / "model"
    assert pre_model.is_dir() and f"path: {pre_model}" in (out / "sft" / "config.yaml").read_text()
    # 5-8: SFT run, both evals, the GRPO run with its evals in metrics.jsonl
    assert (out / "sft" / "checkpoints" / "step_6" / "model").is_dir()
    before = json.loads((out / "sft" / "eval" / "eval.json").read_text())
    after = json.loads((out / "grpo" / "eval" / "eval.json").read_text())
    grpo_rows = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in grpo_rows if "reward/mean" in r] == [1, 2]
    assert any("eval/em" in r for r in grpo_rows)

    results = json.loads((out / "results.json").read_text())
    assert results["before_sft"] == before and results["after_rl"] == after
    assert abs(results["em_gain_points"] - 100 * (after["eval/em"] - before["eval/em"])) < 1e-9
    labels = [r["questions"] for r in results["table"]]
    assert labels[0] == "all" and set(labels[1:]) <= {"1-hop", "2-hop", "comparison"} and len(labels) >= 3
    two_hop = next(r for r in results["table"] if r["questions"] == "2-hop")
    assert two_hop["EM SFT"] == before["eval/2hop/em"] and two_hop["EM RL"] == after["eval/2hop/em"]
    assert "2-hop EM" in printed and "| all |" in printed

    html = (out / "report.html").read_text()
    assert "Test split before and after GRPO" in html and "2-hop" in html
    pngs = sorted(p.name for p in (out / "report").glob("*.png"))
    assert "reward.png" in pngs and "searches.png" in pngs and "em.png" in pngs
    assert all((out / "report" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert (out / "trajectories.html").is_file()


def test_demo_rejects_a_bad_config_before_running_anything(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "demo.sft_stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "sft_stepz" in err and "sft_steps" in err  # names the key and the fix
    assert not (out / "world").exists()
