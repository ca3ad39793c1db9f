"""The RL loop end to end with tiny models on CPU: learning, the run folder, resume, config errors.

The learning tests are the promise of the issue: GRPO and PPO each raise a tiny random model's
mean reward on a learnable task (tiny:copy, word-F1 reward; a random policy scores ~0.04) well
above its start. The resume tests compare a killed-and-resumed run with an uninterrupted one,
metric by metric (timings excluded), including a kill that falls exactly at an epoch boundary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seekrl.config import load_config
from seekrl.jobs import train
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import reproducible, undocumented

ROOT = Path(__file__).resolve().parents[2]


def tiny_cfg(tmp_path, name, *overrides):
    base = [
        "model.path=tiny", "model.tiny_hidden=128", "model.max_context=64", "data.train=tiny:copy",
        "rollout.group_size=8", "rollout.batch_size=128", "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=32",
        "reward.functions=[qa_f1]", "train.lr=1e-3", "train.warmup_steps=5", f"log.dir={tmp_path}",
        f"log.name={name}", "log.progress=false", "log.tensorboard=false", "log.samples_every=0",
    ]
    return load_config(None, base + list(overrides))


def _mean(rows, key, steps):
    vals = [r[key] for r in rows if r["step"] in steps]
    return sum(vals) / len(vals)


def test_grpo_raises_reward(tmp_path):
    run = train(tiny_cfg(tmp_path, "grpo", "algo.name=grpo", "train.steps=130"))
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    start = _mean(rows, "reward/mean", range(1, 6))
    end = _mean(rows, "reward/mean", range(121, 131))
    assert start < 0.12, f"a random policy should score low, got {start:.3f}"
    assert end > start + 0.25, f"GRPO did not learn: reward {start:.3f} -> {end:.3f}"
    # `seekrl eval` on the final checkpoint: the trained model beats the random one (greedy, test split);
    # the two evals run side by side (each is mostly a process start on one core)
    config = tmp_path / "grpo.yaml"
    config.write_text((run / "config.yaml").read_text())
    common = ["data.eval=tiny:copy:test", "data.max_eval=128", f"log.dir={tmp_path}"]
    trained, random_ = _clis(
        ["eval", str(config), f"model.path={run / 'checkpoints' / 'step_130' / 'model'}", *common],
        ["eval", str(config), "model.path=tiny", *common, "log.name=random"],
    )
    assert trained.returncode == 0, trained.stderr
    assert random_.returncode == 0, random_.stderr
    scores = json.loads((run / "eval" / "eval.json").read_text())
    baseline = json.loads((tmp_path / "random" / "eval" / "eval.json").read_text())
    # greedy eval F1 on 128 test questions, measured over train.seed 0-3 (2026-12-02): 0.364, 0.234, 0.155, 0.360
    # against 0.0 for the random model; the run is not bit-reproducible under load (docs/ARCHITECTURE.md, seeding
    # contract), so the margin is set below the lowest seed's, not at seed 0's
    assert scores["eval/qa_f1"] > baseline["eval/qa_f1"] + 0.1, (scores, baseline)
    assert (run / "config.yaml").read_text() == config.read_text()  # eval wrote to eval/, not over the run


def test_ppo_raises_reward(tmp_path):
    """One epoch of two minibatches a step: the second minibatch is already off-policy, so the
    clipped ratio and the critic both take part."""
    run = train(
        tiny_cfg(tmp_path, "ppo", "algo.name=ppo", "train.steps=60", "train.lr=2e-3", "train.critic_lr=1e-3",
                 "train.ppo_epochs=1", "train.minibatches=2")
    )
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    start = _mean(rows, "reward/mean", range(1, 6))
    end = _mean(rows, "reward/mean", range(51, 61))
    assert start < 0.12
    # measured gains over train.seed 0, 1, 2: +0.18 to +0.36 (minibatches of rows, before 2026-11-29), +0.19 to +0.26
    # (minibatches of whole groups); at train.lr=1e-12 (no learning) 0.040 -> 0.036
    assert end > start + 0.15, f"PPO did not learn: reward {start:.3f} -> {end:.3f}"
    assert "loss/value" in rows[-1] and "critic/explained_var" in rows[-1]
    assert all(0 < r["time/critic_s"] < r["time/update_s"] for r in rows if r["step"] > 0)  # the critic's share of the update
    assert undocumented({k for r in rows for k in r}) == []


def small_cfg(tmp_path, name, *overrides):
    """A few fast steps; 12 tasks with 4 tasks per step make an epoch exactly 3 steps."""
    base = [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy",
        "data.max_train=12", "rollout.group_size=4", "rollout.batch_size=16", "rollout.max_new_tokens=6",
        "rollout.max_prompt_tokens=32", "reward.functions=[qa_f1]", "train.lr=1e-3", "train.steps=6",
        "train.warmup_steps=2", "train.schedule=cosine", "train.save_every=1", f"log.dir={tmp_path}",
        f"log.name={name}", "log.progress=false",
    ]
    return load_config(None, base + list(overrides))


def _comparable(rows):
    return [reproducible(r) for r in rows]


@pytest.mark.parametrize(
    "algo", [["algo.name=grpo", "algo.kl_coef=0.05"], ["algo.name=ppo", "train.minibatches=2", "algo.kl_coef=0.05", "algo.kl_in=reward"]]
)
def test_resume_at_epoch_boundary_equals_uninterrupted(tmp_path, algo):
    full = train(small_cfg(tmp_path, "full", *algo))
    # Stop after step 3 (the end of epoch 0), then resume from its checkpoint to step 6.
    train(small_cfg(tmp_path, "cut", *algo, "train.max_steps_this_run=3"))
    first = read_metrics(tmp_path / "cut")
    assert [r["step"] for r in first] == [1, 2, 3]
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_3" / "state.json").read_text())
    assert state["data"]["index"] in (0, 12)  # the iterator stands exactly at the end of epoch 0
    resumed = train(small_cfg(tmp_path, "cut", *algo))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))


def test_killed_run_resumes_to_the_same_metrics(tmp_path):
    """A real SIGKILL at an arbitrary moment; `train.resume=auto` continues from the last checkpoint."""
    full = train(small_cfg(tmp_path, "full", "train.steps=8"))
    config = tmp_path / "killed.yaml"
    config.write_text(small_cfg(tmp_path, "killed", "train.steps=8").to_yaml())
    proc = subprocess.Popen(
        [sys.executable, "-m", "seekrl.cli", "train", str(config)], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and not (ckpts / "step_3").is_dir():
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = read_metrics(tmp_path / "killed")
    assert 3 <= len(done) < 8, f"the kill should fall mid-run, metrics had {len(done)} rows"
    resumed = train(load_config(config))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))


def test_run_folder_contents(tmp_path):
    from transformers import AutoModelForCausalLM

    run = train(small_cfg(tmp_path, "folder", "train.steps=2", "log.samples_every=1", "data.eval=tiny:copy:test", "data.max_eval=8"))
    assert (run / "config.yaml").is_file()
    assert load_config(run / "config.yaml").rollout.group_size == 4  # the saved config reloads
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("reward/mean", "reward/std", "loss/policy", "kl", "entropy", "response_len/mean", "time/step_s"):
        assert key in rows[1], key
    assert "eval/reward" in rows[0] and "eval/reward" in rows[-1]
    for r in rows[1:]:  # the step's phases, each inside the step's time
        assert r["time/update_s"] > 0 and r["time/logprobs_s"] >= 0 and r["time/publish_s"] >= 0, r
        assert r["time/rollout_s"] + r["time/update_s"] + r["time/publish_s"] <= r["time/step_s"], r
    assert "time/ptx_s" not in rows[1] and "time/critic_s" not in rows[1]  # no PPO-ptx, no critic: no time of theirs
    assert all(r["memory/rss_gib"] > 0.05 and r["memory/trimmed_gib"] >= 0 for r in rows[1:])  # seekrl/memory.py, each step
    assert undocumented({k for r in rows for k in r}) == []
    samples = [json.loads(line) for line in (run / "trajectories" / "step_2.jsonl").read_text().splitlines()]
    assert samples and all("segments" in s and "reward_parts" in s for s in samples)
    assert list((run / "tensorboard").iterdir())
    ckpt = run / "checkpoints" / "step_2" / "model"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert model.config.hidden_size == 32


def _cli(*args, cwd=ROOT):
    return _clis(list(args), cwd=cwd)[0]


def _clis(*argvs, cwd=ROOT, timeout=120):
    """`seekrl` commands run side by side (output to files: no pipe can fill and stall one); every
    one is stopped on a timeout or failure."""
    import tempfile

    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in argvs]
    procs = [subprocess.Popen([sys.executable, "-m", "seekrl.cli", *a], cwd=cwd, stdout=o, stderr=e, text=True)
             for a, (o, e) in zip(argvs, files)]
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    done = []
    for p, (o, e) in zip(procs, files):
        o.seek(0), e.seek(0)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, o.read(), e.read()))
        o.close(), e.close()
    return done


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algo.nmae=grpo", "did you mean 'algo.name'"),
        ("train.steps=many", "train.steps: expected an integer"),
        ("rollout.batch_size=12", "must be a multiple of rollout.group_size"),
        ("rollout.max_new_tokens=4000", "exceeds model.max_context"),
        ("reward.functions=[qa_f2]", "did you mean 'qa_f1'"),
        ("data.train=/nonexistent/rows.jsonl", "/nonexistent/rows.jsonl"),
        ("algo.name=grp", "did you mean 'grpo'"),
    ],
)
def test_config_errors_exit_2_with_one_line(override, expected):
    r = _cli("train", "examples/tiny_grpo.yaml", override)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert expected in lines[0], lines[0]


def test_malformed_data_row_names_file_and_line(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "q1", "answer": "1"}\n{"question": "q2", "answer": \n')
    r = _cli("train", "examples/tiny_grpo.yaml", f"data.train={data}", "data.eval=null")
    assert r.returncode == 2
    assert f"{data}:2:" in r.stderr


def test_cli_help_lists_commands():
    r = _cli("--help")
    assert r.returncode == 0
    for cmd in ("train", "sft", "eval", "index", "serve", "config"):
        assert cmd in r.stdout


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.name=dr_grpo", "algo.loss_agg=seq-mean-token-sum-norm"],
        ["algo.name=rloo", "algo.loss_agg=seq-mean-token-mean", "algo.dual_clip=3.0", "algo.clip_high=0.28"],
        ["algo.name=reinforce_pp", "algo.kl_coef=0.01", "algo.kl_in=reward", "algo.kl_estimator=k1"],
        ["algo.name=grpo", "algo.kl_coef=0.01", "algo.kl_target=0.01", "algo.entropy_coef=0.01", "train.ppo_epochs=2", "train.minibatches=2"],
        ["algo.name=grpo", "algo.filter_zero_std=true", "algo.mask_truncated=true", "train.recompute_logprobs=always"],
        ["algo.policy_loss=gspo", "train.ppo_epochs=2", "train.minibatches=2"],
        ["algo.policy_loss=gspo_token", "algo.name=reinforce_pp", "train.ppo_epochs=2"],
        ["algo.policy_loss=cispo", "train.ppo_epochs=2", "algo.kl_coef=0.01"],
    ],
    ids=["dr_grpo", "rloo_dualclip", "reinforce_pp_kl_reward", "grpo_adaptive_kl_entropy", "grpo_filters",
         "gspo_epochs", "gspo_token_reinforce_pp", "cispo_kl"],
)
def test_algorithm_variants_run_and_log(tmp_path, overrides):
    run = train(small_cfg(tmp_path, "variant", "train.steps=3", "train.save_every=0", *overrides))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert all(v is None or v == v for v in r.values())  # no NaN
        assert "loss/policy" in r and "entropy" in r
        assert undocumented(r) == []  # every metric is in observe/metrics.py (the docs' table)
    if "algo.kl_coef=0.01" in overrides:
        assert "kl_coef" in rows[-1]
        if "algo.kl_estimator=k1" not in overrides:
            assert rows[-1]["kl"] >= 0  # k3 is non-negative (k1 is unbiased but can be negative)
    if "algo.kl_target=0.01" in overrides:
        assert rows[-1]["kl_coef"] != 0.01  # the adaptive controller moved the coefficient
    if "algo.filter_zero_std=true" in overrides:
        assert 0 <= rows[-1]["rollout/kept_frac"] <= 1
    if "algo.policy_loss=gspo" in overrides:  # the second epoch is off-policy: GSPO's tight range clips sequences
        assert any(r["actor/clip_frac"] > 0 for r in rows)
    if "algo.policy_loss=cispo" in overrides:  # CISPO clips weights, never drops tokens: ratios stay near 1 anyway
        assert all(r["actor/ratio_max"] < 6.0 for r in rows)


def test_lora_with_gradient_checkpointing_trains_only_adapters(tmp_path):
    cfg = small_cfg(tmp_path, "lora", "train.steps=2", "train.save_every=0", "model.lora_r=4",
                    "model.gradient_checkpointing=true", "algo.kl_coef=0.01", "train.lr=1e-2")
    import asyncio

    from seekrl.build import build_rl
    from seekrl.train import rl

    comp = build_rl(cfg)
    before = {n: p.detach().clone() for n, p in comp.model.named_parameters()}
    try:
        asyncio.run(rl.run(comp))
    finally:
        comp.close()
    changed = {n for n, p in comp.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all("lora_" in n for n in changed), sorted(changed)[:5]
    rows = read_metrics(comp.run_dir)
    assert rows[-1]["kl"] >= 0  # the reference is the base model with adapters disabled



# ---- damaged checkpoints and kills during a save ------------------------------------------------
KILL_IN_SAVE = """
import os, signal, sys
from seekrl.train import checkpoint_tree as tree
from seekrl.cli import main

real = tree.save_file

def save_file(tensors, filename, *args, **kwargs):  # half of step 4's optimizer file written, then SIGKILL
    real(tensors, filename, *args, **kwargs)
    if filename.endswith(os.path.join("step_4.tmp", "optimizer.safetensors")):
        os.truncate(filename, os.path.getsize(filename) // 2)
        os.kill(os.getpid(), signal.SIGKILL)

tree.save_file = save_file
sys.exit(main(sys.argv[1:]))
"""


def test_kill_during_checkpoint_save_resumes_to_the_same_metrics(tmp_path):
    full = train(small_cfg(tmp_path, "full"))
    config = tmp_path / "killed.yaml"
    config.write_text(small_cfg(tmp_path, "killed").to_yaml())
    script = tmp_path / "kill_in_save.py"
    script.write_text(KILL_IN_SAVE)
    proc = subprocess.run([sys.executable, str(script), "train", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = tmp_path / "killed" / "checkpoints"
    assert (ckpts / "step_4.tmp" / "optimizer.safetensors").is_file() and not (ckpts / "step_4").exists()
    assert (ckpts / "latest").read_text() == "step_3\n"
    assert [r["step"] for r in read_metrics(tmp_path / "killed")] == [1, 2, 3, 4]  # step 4 was logged, not saved
    resumed = train(load_config(config))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_5", "step_6"]  # the partial save is gone


def test_damaged_checkpoints_are_skipped_on_resume(tmp_path, capsys):
    full = train(small_cfg(tmp_path, "full"))
    train(small_cfg(tmp_path, "cut", "train.max_steps_this_run=4", "train.keep_last=3"))
    ckpts = tmp_path / "cut" / "checkpoints"
    weights = ckpts / "step_4" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # the latest: truncated weights
    (ckpts / "step_3" / "state.json").write_text("")  # the one before: an empty state.json
    capsys.readouterr()
    resumed = train(small_cfg(tmp_path, "cut", "train.keep_last=3"))  # resumes from step 2
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("seekrl:")]
    assert warnings == [
        f"seekrl: warning: skipping checkpoint {ckpts / 'step_4'}: model/model.safetensors is truncated or not safetensors "
        "(Error while deserializing header: incomplete metadata, file not fully covered)",
        f"seekrl: warning: skipping checkpoint {ckpts / 'step_3'}: state.json is not valid JSON (Expecting value: line 1 column 1 (char 0))",
    ]
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))
    # an explicit train.resume path that is damaged: one line, nothing loaded
    from seekrl.errors import CheckpointError

    (ckpts / "step_6" / "rng.json").write_text("{")
    with pytest.raises(CheckpointError) as e:
        train(small_cfg(tmp_path, "cut", f"train.resume={ckpts / 'step_6'}"))
    assert str(e.value) == (f"train.resume: '{ckpts / 'step_6'}' is not an intact checkpoint: rng.json is not valid JSON "
                            "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
                            "give a checkpoint folder (runs/<name>/checkpoints/step_<N>), auto or never")


def test_unusable_resume_exits_2_in_one_line(tmp_path):
    config = tmp_path / "r.yaml"
    config.write_text(small_cfg(tmp_path, "r", "train.steps=2").to_yaml())
    r = _cli("train", str(config), "train.resume=/nonexistent/step_3")
    errors = [line for line in r.stderr.splitlines() if line.startswith("seekrl:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert errors == ["seekrl: error: train.resume: '/nonexistent/step_3' does not exist; give a checkpoint folder "
                      "(runs/<name>/checkpoints/step_<N>), auto or never"]
    train(load_config(config))
    ckpts = tmp_path / "r" / "checkpoints"
    for step in (1, 2):
        (ckpts / f"step_{step}" / "state.json").write_text("{")
    r = _cli("train", str(config), "train.steps=3")
    lines = [line for line in r.stderr.splitlines() if line.startswith("seekrl:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert [line.split(":")[1].strip() for line in lines] == ["warning", "warning", "error"], lines
    assert lines[-1] == (f"seekrl: error: train.resume=auto: none of the 2 checkpoints in {ckpts} is intact (warnings above); "
                         "move them away to start over, or set train.resume to a checkpoint folder")


# ---- non-finite losses ---------------------------------------------------------------------------
OVERFLOW_REWARD = """
import itertools, os

from seekrl.rewards.qa import qa_f1

_calls = itertools.count()
_bad = os.environ["OVERFLOW_STEPS"]  # "2": step 2 only; "2-": step 2 and every later one


def reward(completion, task, **ctx):
    step = next(_calls) // 16 + 1  # 16 trajectories per step (small_cfg)
    start = int(_bad.rstrip("-"))
    bad = step >= start if _bad.endswith("-") else step == start
    return 1e39 if bad else qa_f1(completion, task)  # 1e39: finite in Python, inf in float32 advantages: a nan loss
"""


def _overflow_reward(tmp_path, monkeypatch, steps):
    (tmp_path / "overflow_reward.py").write_text(OVERFLOW_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "overflow_reward", raising=False)
    monkeypatch.setenv("OVERFLOW_STEPS", steps)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_nonfinite_loss_skips_the_update_and_the_run_goes_on(tmp_path, monkeypatch, algo):
    from safetensors.torch import load_file

    _overflow_reward(tmp_path, monkeypatch, "2")
    run = train(small_cfg(tmp_path, algo, f"algo.name={algo}", "reward.functions=[overflow_reward:reward]",
                          "train.steps=3", "train.keep_last=3", "log.samples_every=0"))
    rows = read_metrics(run)
    assert [r["train/nonfinite_skipped"] for r in rows] == [0, 1, 0]
    assert [r["train/nonfinite_skipped_total"] for r in rows] == [0, 1, 1]
    assert rows[1]["loss/policy"] is None  # nan, logged as null
    if algo == "ppo":
        assert rows[1]["loss/value"] is None
    ckpts = run / "checkpoints"
    files = ["model/model.safetensors", "optimizer.safetensors"] + (["critic.safetensors"] if algo == "ppo" else [])
    for name in files:
        step1, step2 = (load_file(str(ckpts / f"step_{s}" / name)) for s in (1, 2))
        assert all(torch.equal(step1[k], step2[k]) for k in step1), f"{name}: the skipped step changed it"
    step2, step3 = (load_file(str(ckpts / f"step_{s}" / "model" / "model.safetensors")) for s in (2, 3))
    assert all(t.isfinite().all() for t in step3.values())
    assert not all(torch.equal(step2[k], step3[k]) for k in step3)  # step 3 updated again
    lrs = [json.loads((ckpts / f"step_{s}" / "scheduler.json").read_text())["last_epoch"] for s in (1, 2, 3)]
    assert lrs == [1, 2, 3]  # the schedule advanced through the skipped step


def test_nonfinite_steps_in_a_row_stop_the_run_in_one_line(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    _overflow_reward(tmp_path, monkeypatch, "2-")
    config = tmp_path / "nan.yaml"
    config.write_text(small_cfg(tmp_path, "nan", "reward.functions=[overflow_reward:reward]", "train.max_nonfinite=2").to_yaml())
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OVERFLOW_STEPS": "2-"}
    r = subprocess.run([sys.executable, "-m", "seekrl.cli", "train", str(config)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.startswith("seekrl:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines == [
        "seekrl: error: step 3: loss/policy is nan; 2 consecutive steps had a non-finite loss or gradient norm and their "
        "updates were skipped (train.max_nonfinite=2); lower train.lr or check the rewards (the checkpoints hold the last finite weights)"
    ]
    rows = read_metrics(tmp_path / "nan")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["train/nonfinite_skipped_total"] == 2
    ckpts = tmp_path / "nan" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_1", "step_2"]  # nothing written at the stop
    step1, step2 = (load_file(str(ckpts / f"step_{s}" / "model" / "model.safetensors")) for s in (1, 2))
    assert all(t.isfinite().all() and torch.equal(t, step1[k]) for k, t in step2.items())


KILL_IN_PHASE = """
import asyncio, os, signal, sys
from seekrl.train import rl
from seekrl.rollout import executor
from seekrl.cli import main

phase, nth = sys.argv[1], int(sys.argv[2])  # SIGKILL in the middle of the nth rollout or eval
module, name = (executor, "collect") if phase == "rollout" else (rl, "evaluate")
real = getattr(module, name)
calls = 0

async def killing(*args, **kwargs):
    global calls
    calls += 1
    if calls == nth:
        work = asyncio.ensure_future(real(*args, **kwargs))  # episodes in flight when the kill lands
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    return await real(*args, **kwargs)

setattr(module, name, killing)
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("phase,nth", [("rollout", 4), ("eval", 3)])
def test_sigkill_during_rollout_or_eval_resumes_to_the_same_metrics(tmp_path, phase, nth):
    """A run SIGKILLed in the middle of a step's rollout (episodes in flight) or of an evaluation
    resumes from its last checkpoint and ends with the metrics of an uninterrupted run."""
    extra = ["data.eval=tiny:copy:test", "data.max_eval=8", "eval.every=2"]
    full = train(small_cfg(tmp_path, "full", *extra))
    config = tmp_path / "killed.yaml"
    config.write_text(small_cfg(tmp_path, "killed", *extra).to_yaml())
    script = tmp_path / "kill_in_phase.py"
    script.write_text(KILL_IN_PHASE)
    proc = subprocess.run([sys.executable, str(script), phase, str(nth), "train", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    logged = [r["step"] for r in read_metrics(tmp_path / "killed")]
    assert logged == [0, 1, 2, 3]  # step 0's eval, steps 1-3; step 4 was killed before it was logged
    resumed = train(load_config(config))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))
