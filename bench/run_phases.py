"""Where the steps of RL runs spend their time, epoch by epoch, side by side.

    python bench/run_phases.py RUN_DIR [RUN_DIR ...] [--steps N]

For each run folder (its metrics.jsonl; a resumed run's repeated steps count once, the last
write), and each pass over the training questions (the `epoch` metric), over steps 1..N (default
every step): the steps, the mean step and rollout seconds, the refill rounds a step and the share
of the sampled groups the refill dropped (`rollout/refill/*`), the training tasks `data.skip_flat`
left out of that epoch's order (`data/skip_flat/skipped`), and the mean reward; then the totals;
then, for the runs that log them, each run's mean step split into its phases (`time/rollout_s`,
`time/logprobs_s`, `time/update_s` with PPO-ptx's `time/ptx_s` of it, `time/publish_s`, and the
rest: logging, memory trimming).
It launches nothing: run the arms with `seekrl train` (e.g. the same command with and without
`data.skip_flat=1`), each alone on the machine, and compare them here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seekrl.observe.loggers import read_metrics  # noqa: E402 (after the path)


def steps_of(run: Path, last: int | None) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    for r in read_metrics(run):
        step = int(r.get("step", 0))
        if step > 0 and (last is None or step <= last):
            rows[step] = r  # a resumed run's repeated step: the last write
    if not rows:
        raise SystemExit(f"{run}: no training steps in metrics.jsonl (is it a run folder of `seekrl train`?)")
    return rows


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def table(runs: list[Path], last: int | None) -> str:
    out = ["| run | epoch | steps | step s | rollout s | refill rounds | dropped frac | tasks left out | reward |",
           "|---|---|---|---|---|---|---|---|---|"]
    totals = []
    for run in runs:
        rows = steps_of(run, last)
        epochs: dict[int, list[dict]] = {}
        for step in sorted(rows):
            epochs.setdefault(int(rows[step].get("epoch", 0)), []).append(rows[step])
        for epoch, rs in sorted(epochs.items()):
            out.append(f"| {run.name} | {epoch} | {len(rs)} | {_fmt(_mean(rs, 'time/step_s'))} | {_fmt(_mean(rs, 'time/rollout_s'))} "
                       f"| {_fmt(_mean(rs, 'rollout/refill/rounds'), 2)} | {_fmt(_mean(rs, 'rollout/refill/dropped_frac'), 2)} "
                       f"| {_fmt(_mean(rs, 'data/skip_flat/skipped'), 0)} | {_fmt(_mean(rs, 'reward/mean'), 3)} |")
        all_rows = list(rows.values())
        totals.append(f"- {run.name}: {len(all_rows)} steps in {sum(r.get('time/step_s', 0.0) for r in all_rows):,.0f} s of steps "
                      f"(rollout {sum(r.get('time/rollout_s', 0.0) for r in all_rows):,.0f} s), "
                      f"{sum(r.get('rollout/refill/tasks', 0.0) for r in all_rows):,.0f} tasks rolled out by the refill")
    return "\n".join(out + [""] + totals)


PHASES = ("time/rollout_s", "time/logprobs_s", "time/update_s", "time/ptx_s", "time/publish_s")


def phases(runs: list[Path], last: int | None) -> str:
    """Each run's mean step and its phases, in seconds ("" when no run logs them: older runs)."""
    out = ["| run | steps | step s | rollout s | log-probs s | update s | of it PPO-ptx s | publish s | the rest s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        rows = [r for r in steps_of(run, last).values() if "time/update_s" in r]
        if not rows:
            continue
        m = {k: _mean(rows, k) for k in ("time/step_s", *PHASES)}
        rest = m["time/step_s"] - sum(m[k] or 0.0 for k in PHASES if k != "time/ptx_s")
        out.append(f"| {run.name} | {len(rows)} | {_fmt(m['time/step_s'])} | " + " | ".join(_fmt(m[k]) for k in PHASES) + f" | {_fmt(rest)} |")
    return "\n".join(out) if len(out) > 2 else ""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (log.dir/log.name)")
    ap.add_argument("--steps", type=int, default=None, help="only steps 1..N of each run")
    a = ap.parse_args(argv)
    print(table(a.runs, a.steps))
    split = phases(a.runs, a.steps)
    if split:
        print("\n" + split)


if __name__ == "__main__":
    main()
