"""bench/run_phases.py: the per-epoch table of RL runs' step times (a resumed run's repeated step
counts once, its last write; `--steps` cuts every run at the same step; a folder without steps
is a clear exit), and each run's step split into its logged phases."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "run_phases.py"


def _load():
    spec = importlib.util.spec_from_file_location("run_phases", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_epochs_side_by_side_with_resumed_steps_counted_once(tmp_path):
    rp = _load()
    base = {"rollout/refill/rounds": 2.0, "rollout/refill/dropped_frac": 0.5, "reward/mean": 0.2, "rollout/refill/tasks": 8.0}
    off = _run(tmp_path, "off", [{"step": 0, "eval/em": 0.1}]
               + [{**base, "step": s, "epoch": float(s > 2), "time/step_s": 10.0 * s, "time/rollout_s": 5.0} for s in (1, 2, 3)]
               + [{**base, "step": 3, "epoch": 1.0, "time/step_s": 99.0, "time/rollout_s": 7.0}])  # step 3 again, resumed
    on = _run(tmp_path, "on", [{**base, "step": s, "epoch": float(s > 1), "time/step_s": 4.0, "time/rollout_s": 2.0,
                                "data/skip_flat/skipped": 3.0 * (s > 1)} for s in (1, 2, 3, 4)])
    out = rp.table([off, on], last=3)
    lines = out.splitlines()
    assert "| off | 0 | 2 | 15.0 | 5.0 | 2.00 | 0.50 | — | 0.200 |" in lines
    assert "| off | 1 | 1 | 99.0 | 7.0 | 2.00 | 0.50 | — | 0.200 |" in lines  # the last write of step 3
    assert "| on | 1 | 2 | 4.0 | 2.0 | 2.00 | 0.50 | 3 | 0.200 |" in lines  # step 4 cut by --steps 3
    assert "- off: 3 steps in 129 s of steps (rollout 17 s), 24 tasks rolled out by the refill" in lines
    with pytest.raises(SystemExit, match="no training steps"):
        rp.table([_run(tmp_path, "empty", [{"step": 0}])], last=None)


def test_phases_split_the_mean_step_and_leave_out_runs_without_them(tmp_path):
    rp = _load()
    timed = {"time/rollout_s": 20.0, "time/logprobs_s": 1.0, "time/update_s": 24.0, "time/ptx_s": 8.0, "time/publish_s": 2.0}
    new = _run(tmp_path, "new", [{**timed, "step": 1, "time/step_s": 50.0},
                                 {**timed, "step": 2, "time/step_s": 52.0, "time/update_s": 26.0}])
    old = _run(tmp_path, "old", [{"step": 1, "time/step_s": 9.0, "time/rollout_s": 4.0}])
    lines = rp.phases([new, old], last=None).splitlines()
    assert lines[2] == "| new | 2 | 51.0 | 20.0 | 1.0 | 25.0 | 8.0 | 2.0 | 3.0 |"  # the rest: 51 - (20 + 1 + 25 + 2); PPO-ptx is inside the update
    assert len(lines) == 3  # the run without phases has no row
    assert rp.phases([old], last=None) == ""
    assert rp.phases([new], last=1).splitlines()[2] == "| new | 1 | 50.0 | 20.0 | 1.0 | 24.0 | 8.0 | 2.0 | 3.0 |"
