"""observe/: StatsTracker arithmetic, RunLogger files and resume, Progress lines, sample files."""

from __future__ import annotations

import io
import json
import math
import re

import pytest
import torch

from seekrl.observe import Progress, RunLogger, StatsTracker, read_metrics, write_trajectories
from seekrl.observe.samples import mask_runs
from seekrl.types import Task, Trajectory, TrajectoryGroup


# ----------------------------------------------------------------------------- StatsTracker
def test_scopes_and_repeated_add_average():
    t = StatsTracker()
    with t.scope("loss"):
        t.add(policy=1.2, value=torch.tensor(0.5))
        t.add(policy=2.0)  # same key again: (1.2 + 2.0) / 2 = 1.6
        with t.scope("inner"):
            t.add(x=3)
    t.add(top=7)
    out = t.export()
    assert out == pytest.approx({"loss/inner/x": 3.0, "loss/policy": 1.6, "loss/value": 0.5, "top": 7.0})
    assert list(out) == sorted(out)
    assert all(type(v) is float for v in out.values())
    assert t.export() == {}  # reset by default


def test_export_without_reset_keeps_values():
    t = StatsTracker()
    t.add(a=1.0)
    assert t.export(reset=False) == {"a": 1.0}
    t.add(a=3.0)
    assert t.export() == {"a": 2.0}


def test_add_rejects_non_scalar_tensor():
    with pytest.raises(ValueError, match="scalar"):
        StatsTracker().add(x=torch.ones(3))


def test_add_masked_is_token_weighted_across_micro_batches():
    t = StatsTracker()
    with t.scope("loss"):
        # micro-batch 1: tokens 1, 2 count (3 masked out): sum 3, count 2
        t.add_masked("entropy", torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1, 1, 0]]))
        # micro-batch 2: only 20 counts: sum 20, count 1
        t.add_masked("entropy", torch.tensor([[10.0, 20.0]]), torch.tensor([[0.0, 1.0]]))
        # an all-masked micro-batch adds nothing
        t.add_masked("entropy", torch.tensor([[99.0]]), torch.tensor([[0]]))
    out = t.export()
    # token-weighted: (3 + 20) / 3 = 7.666..., not the mean of means (1.5 + 20) / 2 = 10.75
    assert out["loss/entropy"] == pytest.approx(23 / 3)


def test_add_masked_lists_and_shape_error():
    t = StatsTracker()
    t.add_masked("m", [[1.0, 3.0], [5.0, 7.0]], [[1, 0], [1, 1]])  # (1 + 5 + 7) / 3
    assert t.export()["m"] == pytest.approx(13 / 3)
    with pytest.raises(ValueError):
        t.add_masked("m", torch.ones(2, 3), torch.ones(3, 2))
    t.add_masked("never", torch.ones(2), torch.zeros(2))
    assert "never" not in t.export()


def test_add_dist_pools_calls():
    t = StatsTracker()
    with t.scope("reward"):
        t.add_dist("r", torch.tensor([1.0, 2.0, 3.0, 4.0]))
    out = t.export(reset=False)
    # mean 2.5; population variance ((1.5^2 + 0.5^2) * 2) / 4 = 1.25
    assert out["reward/r/mean"] == pytest.approx(2.5)
    assert out["reward/r/std"] == pytest.approx(math.sqrt(1.25))
    assert (out["reward/r/min"], out["reward/r/max"]) == (1.0, 4.0)
    with t.scope("reward"):
        t.add_dist("r", [5.0])  # pooled values 1..5: mean 3, variance (4+1+0+1+4)/5 = 2
    out = t.export()
    assert out["reward/r/mean"] == pytest.approx(3.0)
    assert out["reward/r/std"] == pytest.approx(math.sqrt(2.0))
    assert out["reward/r/max"] == 5.0
    t.add_dist("big", [1e9 + 1, 1e9 + 3])  # large offset: std 1 exactly
    assert t.export()["big/std"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- RunLogger
def test_run_logger_jsonl_tensorboard_and_resume(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run, config={"algo": {"name": "grpo"}}) as logger:
        for step in range(1, 6):
            logger.log({"reward/mean": step / 10, "loss": float("nan") if step == 2 else 1.0, "tag": "x"}, step=step)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5
    assert all(line.startswith('{"step": ') for line in lines)  # "step" first
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[1]["loss"] is None  # NaN -> null
    assert rows[2] == {"step": 3, "reward/mean": 0.3, "loss": 1.0, "tag": "x"}
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))

    # a resume from the checkpoint at step 3 drops rows 4 and 5, then logs them again; the same for
    # the step samples (the RL loop's trajectories/step_<N>.jsonl); other files stay
    samples = run / "trajectories"
    samples.mkdir()
    for name in ("step_2.jsonl", "step_3.jsonl", "step_4.jsonl", "step_12.jsonl", "step_x.jsonl", "notes.txt"):
        (samples / name).write_text("{}\n")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')  # a half-written line from the crash
    logger = RunLogger(run, tensorboard=False, resume_step=3)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert sorted(f.name for f in samples.iterdir()) == ["notes.txt", "step_2.jsonl", "step_3.jsonl", "step_x.jsonl"]
    logger.log({"reward/mean": torch.tensor(0.9)}, step=4)
    logger.close()
    logger.close()  # twice is fine
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["reward/mean"] == pytest.approx(0.9)

    # a fresh start in the same folder (its checkpoints deleted) starts over: no row of the earlier
    # attempt is mixed with the new ones (a sum of time/step_s would count both)
    with RunLogger(run, tensorboard=False) as logger:
        assert read_metrics(run) == []
        assert sorted(f.name for f in samples.iterdir()) == ["notes.txt", "step_x.jsonl"]
        logger.log({"reward/mean": 0.2}, step=1)
    assert read_metrics(run) == [{"step": 1, "reward/mean": 0.2}]


def test_run_logger_wandb_missing_is_one_clear_error(tmp_path):
    try:
        import wandb  # noqa: F401

        pytest.skip("wandb is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="pip install wandb"):
        RunLogger(tmp_path / "run", wandb=True)


# ----------------------------------------------------------------------------- Progress
def test_progress_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    with Progress(total_steps=10, start_step=2, fields=("kl",), stream=stream) as progress:
        progress.update(3, {"reward/mean": 0.41, "kl": 0.0031, "other": 5})
        progress.update(4, {"reward": 1.0}, lr=1e-5)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"step 3/10 reward=0\.41 time=\d+\.\ds kl=0\.0031", lines[0])
    assert re.fullmatch(r"step 4/10 reward=1 time=\d+\.\ds lr=1e-05", lines[1])


def test_progress_disabled_and_forced_bar():
    stream = io.StringIO()
    with Progress(total_steps=5, enabled=False, stream=stream) as progress:
        progress.update(1, {"reward/mean": 0.5})
    assert stream.getvalue() == ""
    stream = io.StringIO()
    with Progress(total_steps=5, force_bar=True, stream=stream) as progress:
        progress.update(3, {"reward/mean": 0.5})
    assert "3/5" in stream.getvalue()


# ----------------------------------------------------------------------------- samples
class CharTokenizer:
    """id i <-> the i-th character of the alphabet."""

    alphabet = "abcdefghijklmnopqrstuvwxyz <>/"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.alphabet[i] for i in ids)

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]


def _trajectory(task: Task, tok: CharTokenizer, reward: float) -> Trajectory:
    traj = Trajectory(task=task, prompt_ids=tok.encode("what"), completion_ids=[], loss_mask=[], logprobs=[], versions=[])
    for text, sampled in (("<search>x</search>", True), ("<info>doc</info>", False), ("<answer>y</answer>", True)):
        ids = tok.encode(text)
        traj.append(ids, sampled=sampled, logprobs=[-0.1] * len(ids) if sampled else None, version=1)
    traj.reward, traj.reward_parts, traj.metrics = reward, {"em": reward}, {"turns": 2.0}
    return traj


def test_mask_runs():
    assert mask_runs([1, 1, 0, 0, 0, 1]) == [(0, 2, False), (2, 5, True), (5, 6, False)]
    assert mask_runs([0]) == [(0, 1, True)]
    assert mask_runs([]) == []


def test_write_trajectories_segments(tmp_path):
    tok = CharTokenizer()
    groups = []
    for g in range(3):
        task = Task(id=f"t{g}", prompt=[{"role": "user", "content": "what"}], answer=["y", "yes"], source="nq")
        groups.append(TrajectoryGroup(task=task, trajectories=[_trajectory(task, tok, r) for r in (1.0, 0.0)]))
    path = tmp_path / "samples" / "step_1.jsonl"
    n = write_trajectories(path, groups, tok, max_groups=2, step=1)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert n == len(records) == 4  # 2 groups x 2 samples
    r = records[1]
    assert (r["task_id"], r["source"], r["step"], r["group"], r["sample"]) == ("t0", "nq", 1, 0, 1)
    assert (r["reward"], r["reward_parts"], r["finish_reason"]) == (0.0, {"em": 0.0}, "answered")
    assert r["answer"] == "['y', 'yes']" and r["prompt"] == "what"
    assert r["completion"] == "<search>x</search><info>doc</info><answer>y</answer>"
    assert r["segments"] == [
        {"text": "<search>x</search>", "masked": False},
        {"text": "<info>doc</info>", "masked": True},
        {"text": "<answer>y</answer>", "masked": False},
    ]
    flags = [s["masked"] for s in r["segments"]]
    assert all(a != b for a, b in zip(flags, flags[1:]))  # runs alternate
    assert "".join(s["text"] for s in r["segments"]) == r["completion"]
    assert (r["num_completion_tokens"], r["num_sampled_tokens"], r["num_prompt_tokens"]) == (52, 36, 4)  # 18 + 16 + 18
