"""`seekrl eval` on a tiny random model: eval.json, eval.md and every trajectory under runs/<name>/eval/."""

from __future__ import annotations

import dataclasses
import json

from seekrl.cli import main
from seekrl.config import load_config
from seekrl.memory import resident_gib


def test_seekrl_eval_writes_metrics_table_and_trajectories(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        load_config(None, [
            "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy",
            "data.eval=tiny:copy:test", "data.max_eval=4", "rollout.group_size=4", "rollout.batch_size=16",
            "rollout.max_new_tokens=4", "rollout.max_prompt_tokens=32", "reward.functions=[qa_f1]",
            f"log.dir={tmp_path}", "log.name=tiny", "log.progress=false",
        ]).to_yaml()
    )
    rss_before = resident_gib()
    assert main(["eval", str(config), "eval.n=4", "eval.temperature=1.0"]) == 0
    out = tmp_path / "tiny" / "eval"
    metrics = json.loads((out / "eval.json").read_text())
    assert metrics["eval/count"] == 4
    for key in ("eval/em", "eval/f1", "eval/accuracy", "eval/qa_f1", "eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/answer_rate"):
        assert 0.0 <= metrics[key] <= 1.0, key
    if rss_before is not None:  # Linux: the eval's peak (VmHWM) is at least what the process held when it began
        assert rss_before <= metrics["memory/peak_rss_gib"] < 64
    table = (out / "eval.md").read_text()
    assert table.splitlines()[2].startswith("| all | 4 |")
    assert "memory" not in table  # the table holds the eval's scores only
    assert table in capsys.readouterr().out  # the table is printed too
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all("segments" in r and "reward_parts" in r for r in rows)


def test_eval_builds_no_optimizer_critic_or_reference(tmp_path, monkeypatch):
    """Nothing is trained in `seekrl eval`: no optimizer, no critic, no reference model, no train tasks."""
    import torch

    import seekrl.build
    from seekrl.build import build_eval

    def refuse(*args, **kwargs):
        raise AssertionError("evaluation built a training component")

    monkeypatch.setattr(torch.optim.AdamW, "__init__", refuse)
    for name in ("make_value_model", "PolicyTrainer", "CriticTrainer", "shard_model", "init_ranks"):
        monkeypatch.setattr(seekrl.build, name, refuse)
    cfg = load_config(None, [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=/nonexistent/train.jsonl",
        "data.eval=tiny:copy:test", "data.max_eval=4", "rollout.group_size=4", "rollout.batch_size=16", "algo.name=ppo",
        "algo.kl_coef=0.1", "rollout.max_new_tokens=4", "rollout.max_prompt_tokens=32", "reward.functions=[qa_f1]",
        f"log.dir={tmp_path}", "log.name=tiny", "log.progress=false",
    ])
    run = build_eval(cfg)  # data.train is never read: a missing file does not matter
    try:
        assert [t.source for t in run.tasks] == ["tiny_copy"] * 4 and run.run_dir == tmp_path / "tiny" / "eval"
        assert not [f.name for f in dataclasses.fields(run) if f.name in ("trainer", "critic", "optimizer", "ref_model")]
    finally:
        run.close()
