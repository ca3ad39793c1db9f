"""Asynchronous vs synchronous RL: wall time until the reward reaches a level, same seeds, one run.

    python bench/async_vs_sync.py                               # 2 engine servers, the arms below (~10 min on 2 cores)
    python bench/async_vs_sync.py --engine local --steps 60 --target 0.3
    python bench/async_vs_sync.py --latency 0 --arms sync,async2  # no simulated tool latency
    python bench/async_vs_sync.py --config examples/demo_search.yaml --latency 0 --steps 30 --target 0.4 \
        --set data.train=runs/demo/world/train.jsonl data.eval=runs/demo/world/test.jsonl \
              tools.retriever=runs/demo/index model.path=runs/demo/sft/checkpoints/step_600/model   # the demo world

The task is examples/tiny_grpo.yaml's (a tiny random model learns to copy; reward = word F1)
unless `--config` / `--set` name another (the demo world's search task: example above),
with a long tail in how long episodes take: before its turn, each episode waits for a simulated
tool call whose latency is drawn per episode (seeded) from a Pareto-like tail — most calls take
`--latency` seconds, one in ten takes 5-20x that, as web search or code execution do. The
waiting costs no CPU, as a real tool call's would not. Arms (same config, same seeds, one after
the other in this process):

- sync: roll out the step's batch, then train (the trainer waits for the slowest episode; the
  engine idles while the trainer steps);
- async η: `rollout.mode=async rollout.max_staleness=η` (episodes keep running while the trainer
  steps; decoupled PPO, proximal log-probs recomputed).

Reported per arm: wall time until the moving mean of reward/mean over `--window` steps first
reaches `--target` (and the step), wall time of all `--steps`, time the trainer waited for data
(time/wait_s), the largest staleness trained on, turns cut by weight updates, and the final
moving reward. The speed-up is sync's time-to-target over the arm's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class ToolLatency:
    """Wraps a workflow: each episode first waits for a simulated tool call (long-tailed latency)."""

    def __init__(self, workflow, base_s: float, seed: int):
        self.workflow, self.base_s, self.seed = workflow, base_s, seed

    def __getattr__(self, name):
        return getattr(self.workflow, name)

    async def run(self, task, engine, n, params=None):
        workflow = self.workflow
        base_s, seed = self.base_s, self.seed

        class Delayed:
            def __getattr__(self, name):
                return getattr(engine, name)

            async def generate(self, prompt_ids, p, **kw):
                r = random.Random(f"{seed}|{task.id}|{p.seed}")
                tail = r.uniform(5.0, 20.0) if r.random() < 0.1 else r.uniform(0.5, 1.5)
                await asyncio.sleep(base_s * tail)
                return await engine.generate(prompt_ids, p, **kw)

        return await workflow.run(task, Delayed() if base_s > 0 else engine, n, params)


def run_arm(name: str, overrides: list[str], args, out_dir: Path) -> dict:
    from seekrl.build import build_rl
    from seekrl.config import load_config
    from seekrl.engines.launch import terminate_as_exit
    from seekrl.observe.loggers import read_metrics
    from seekrl.train import rl

    cfg = load_config(args.config, [*args.set,
        f"train.steps={args.steps}", f"log.dir={out_dir}", f"log.name={name}", "log.progress=false", "log.tensorboard=false",
        "log.samples_every=0", "data.max_eval=16", "eval.every=0", "train.resume=never", f"train.seed={args.seed}",
        *(["engine.servers=2"] if args.engine == "servers" else []), *overrides,
    ])
    t0 = time.perf_counter()
    with terminate_as_exit():
        c = build_rl(cfg)
        c.rollout.workflow = ToolLatency(c.workflow, args.latency, args.seed)
        try:
            asyncio.run(rl.run(c))
        finally:
            c.close()
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(out_dir / name) if r["step"] > 0]
    elapsed, moving, reached = 0.0, [], None
    for r in rows:
        elapsed += r["time/step_s"]
        moving.append(r["reward/mean"])
        avg = sum(moving[-args.window:]) / len(moving[-args.window:])
        if reached is None and len(moving) >= args.window and avg >= args.target:
            reached = (r["step"], elapsed)
    return {
        "arm": name, "overrides": overrides, "wall_s": wall, "train_s": elapsed,
        "steps_to_target": reached[0] if reached else None, "time_to_target_s": reached[1] if reached else None,
        "wait_s": sum(r["time/wait_s"] for r in rows), "staleness_max": max(r["rollout/staleness/max"] for r in rows),
        "interrupted": sum(r["rollout/interrupted"] for r in rows),
        "final_reward": sum(r["reward/mean"] for r in rows[-args.window:]) / len(rows[-args.window:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="sync,async1,async2,async4", help="sync and/or async<η>, comma-separated")
    ap.add_argument("--engine", choices=("servers", "local"), default="servers", help="two `seekrl serve engine` servers, or in-process")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--target", type=float, default=0.35, help="reward level (moving mean over --window steps)")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--latency", type=float, default=0.05, help="typical simulated tool latency per episode, seconds (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny_grpo.yaml"), help="the run's config (default: the tiny copy task)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every arm (e.g. the demo world's paths)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    console = Console()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms.split(","):
            overrides = [] if arm == "sync" else ["rollout.mode=async", f"rollout.max_staleness={int(arm[5:])}"]
            console.print(f"[bold]{arm}[/bold]: {' '.join(overrides) or 'rollout.mode=sync'}")
            results.append(run_arm(arm, overrides, args, Path(tmp)))
            console.print(results[-1])
    base = next((r["time_to_target_s"] for r in results if r["arm"] == "sync"), None)
    table = Table(title=f"time to reward {args.target} (moving mean of {args.window} steps), {args.engine}, latency {args.latency} s")
    for col in ("arm", "steps to target", "time to target s", "speed-up", f"wall s ({args.steps} steps)", "trainer wait s",
                "staleness max", "turns cut", "final reward"):
        table.add_column(col)
    for r in results:
        t = r["time_to_target_s"]
        table.add_row(r["arm"], str(r["steps_to_target"]), f"{t:.1f}" if t else "-", f"{base / t:.2f}x" if base and t else "-",
                      f"{r['wall_s']:.1f}", f"{r['wait_s']:.1f}", f"{r['staleness_max']:.0f}", f"{r['interrupted']:.0f}",
                      f"{r['final_reward']:.3f}")
    console.print(table)
    meta = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores", "args": vars(args)}
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
