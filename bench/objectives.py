"""The policy objectives side by side: the same GRPO run with only `algo.policy_loss` changed.

    python bench/objectives.py                                    # ppo gspo gspo_token cispo x seeds 0 1 2, examples/tiny_grpo.yaml
    python bench/objectives.py --objectives ppo cispo --seeds 0 --steps 200
    python bench/objectives.py --config examples/demo_search.yaml --steps 60 \
        --set data.train=runs/demo/world/train.jsonl data.eval=runs/demo/world/test.jsonl \
              tools.retriever=runs/demo/index model.path=runs/demo/sft/checkpoints/step_600/model   # the demo world

Each run is `seekrl train CONFIG algo.policy_loss=X train.seed=S` in its own process, one after
the other. Reported per run: mean reward/mean over the first and the last quarter of the steps
and their difference (the issue's "learns" bar: +0.3), the greedy eval reward at the end when the
config evaluates, and s/step; per objective the mean gain over seeds with a 95% t-interval.
Prints a markdown table and writes the rows as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in steps]
    q = max(1, len(rewards) // 4)
    first, last = sum(rewards[:q]) / q, sum(rewards[-q:]) / q
    evals = [r["eval/reward"] for r in rows if "eval/reward" in r]
    ems = [r["eval/em"] for r in rows if "eval/em" in r]
    times = [r["time/step_s"] for r in steps if "time/step_s" in r]
    return {"steps": len(rewards), "first": first, "last": last, "gain": last - first,
            "eval_reward": evals[-1] if evals else None, "eval_em_first": ems[0] if ems else None, "eval_em": ems[-1] if ems else None, "s_per_step": sum(times) / max(1, len(times))}


def train_run(cmd: list[str], run_dir: Path, name: str) -> dict:
    """Run one `seekrl train` command (from the repository root) to the end; its wall time and summary."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=4 * 3600)
    if r.returncode != 0:
        sys.exit(f"{name} failed ({r.returncode}): {r.stderr.strip().splitlines()[-3:]}")
    return {"wall_s": time.perf_counter() - t0, **summarize(read_rows(run_dir))}


def interval(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = T975.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny_grpo.yaml"))
    ap.add_argument("--objectives", nargs="+", default=["ppo", "gspo", "gspo_token", "cispo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: the config's)")
    ap.add_argument("--set", nargs="*", default=[], help="more section.key=value overrides for every run")
    ap.add_argument("--out", default=None, help="write the per-run rows as JSON here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="seekrl-objectives-") as tmp:
        for objective in args.objectives:
            for seed in args.seeds:
                name = f"{objective}_s{seed}"
                cmd = [sys.executable, "-m", "seekrl", "train", args.config, f"algo.policy_loss={objective}",
                       f"train.seed={seed}", f"log.dir={tmp}", f"log.name={name}", "train.save_every=0", *args.set]
                if args.steps:
                    cmd.append(f"train.steps={args.steps}")
                row = {"objective": objective, "seed": seed, **train_run(cmd, Path(tmp) / name, name)}
                rows.append(row)
                print(f"{name}: reward {row['first']:.3f} -> {row['last']:.3f} ({row['gain']:+.3f}), eval {row['eval_reward']}, "
                      f"{row['s_per_step']:.3f} s/step", flush=True)
    print(f"\n{datetime.date.today()} · {platform.node()} · {args.config} · {' '.join(args.set)}\n")
    has_em = any(r["eval_em"] is not None for r in rows)
    em_head = " | eval EM at step 0 → end (per seed) | EM gain: mean [95% CI]" if has_em else ""
    print(f"| objective | seeds | mean reward, first → last quarter (per seed) | gain: mean [95% CI] | greedy eval reward at the end{em_head} | s/step |")
    print("|---|---|---|---|---|" + ("---|---|" if has_em else "") + "---|")
    for objective in args.objectives:
        rs = [r for r in rows if r["objective"] == objective]
        m, lo, hi = interval([r["gain"] for r in rs])
        per = ", ".join(f"{r['first']:.3f} → {r['last']:.3f}" for r in rs)
        evals = [r["eval_reward"] for r in rs if r["eval_reward"] is not None]
        ev = f"{statistics.fmean(evals):.3f}" if evals else "—"
        em = ""
        if has_em:
            em_rs = [r for r in rs if r["eval_em"] is not None]
            em_m, em_lo, em_hi = interval([100 * (r["eval_em"] - r["eval_em_first"]) for r in em_rs])
            em = (" | " + ", ".join(f"{r['eval_em_first']:.3f} → {r['eval_em']:.3f}" for r in em_rs)
                  + f" | {em_m:+.1f} [{em_lo:+.1f}, {em_hi:+.1f}] points")
        print(f"| {objective} | {len(rs)} | {per} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | {ev}{em} | {statistics.fmean(r['s_per_step'] for r in rs):.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
