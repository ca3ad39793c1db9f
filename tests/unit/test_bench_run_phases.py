"""bench/run_phases.py: the per-epoch table of RL runs' step times (a resumed run's repeated step
counts once, its last write; `--steps` cuts every run at the same step; a folder without steps
is a clear exit)."""

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
