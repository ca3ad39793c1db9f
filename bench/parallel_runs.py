"""Several training runs on one CPU: one after the other with every core, or at the same time with a share each.

    python bench/parallel_runs.py --runs 2 --steps 1 DIR/grpo/config.yaml OVERRIDES...

The same `seekrl train CONFIG OVERRIDES` with `train.seed=0 .. runs-1` (one run folder each under
`--out`, `train.max_steps_this_run=--steps`), in two arms, measured in one invocation:

- `one after the other`: each run alone with `--threads` torch threads (default: every core);
- `at the same time`: every run at once, each with `--threads / --runs` threads (at least 1),
  each pinned to cores of its own (`run_at_once`, as `demo.grpo_parallel` runs them);
- `at the same time, unpinned` (`--unpinned`): the same without the pinning, so every run and
  every vLLM server it starts may use every core.

`--at-once-only` skips the first arm (runs more than the cores: every run shares every core, and
a vLLM server of each runs one unbound thread; recipes/children.py). Per arm the least available
memory (Linux MemAvailable, read every second) is reported too: what several runs at once leave.

Both arms do the same work (the same seeds fix the same draws; the sampled tokens are reported
so a difference in the rollouts shows). Per arm: the wall time, and for each run its step time,
rollout time and sampled tokens from its metrics.jsonl. Every child is stopped on failure or
Ctrl-C (recipes/children.py `run_at_once`); a run that passes `--timeout` seconds is stopped
and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from child_arm import add_run_arguments, fresh_out  # noqa: E402
from seekrl.recipes.children import Child, available_memory_gib, run_at_once, steps_done  # noqa: E402 (after the path)
from seekrl.observe.loggers import read_metrics  # noqa: E402


def _child(config: str, overrides: list[str], out: Path, name: str, seed: int, steps: int) -> Child:
    argv = [sys.executable, "-m", "seekrl.cli", "train", config, *overrides, f"log.dir={out}", f"log.name={name}",
            f"train.seed={seed}", f"train.max_steps_this_run={steps}", "log.progress=false"]
    return Child(name, argv, out / f"{name}.log", done=steps_done(out / name), total=steps)


def _steps(run: Path) -> list[dict]:
    return [r for r in read_metrics(run) if r.get("step", 0) > 0 and "time/step_s" in r]


class LeastAvailable(threading.Thread):
    """The least MemAvailable (GiB) seen while it runs, read every `every_s` seconds."""

    def __init__(self, every_s: float = 1.0):
        super().__init__(daemon=True)
        self.every_s, self.least, self.stopped = every_s, float("inf"), threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.least = min(self.least, available_memory_gib() or float("inf"))
            self.stopped.wait(self.every_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(ap, "runs/bench/parallel_runs")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--unpinned", action="store_true", help="a third arm: the runs at once, not pinned to cores")
    ap.add_argument("--at-once-only", action="store_true", help="skip the arm that runs them one after the other")
    args = ap.parse_args()
    out, config = fresh_out(args)
    share = max(1, args.threads // args.runs)
    arms = {}
    for arm in (*([] if args.at_once_only else ["one after the other"]), "at the same time",
                *(["at the same time, unpinned"] if args.unpinned else [])):
        tag = "seq" if arm.startswith("one") else "free" if arm.endswith("unpinned") else "par"
        names = [f"{tag}_s{k}" for k in range(args.runs)]
        start, memory = time.perf_counter(), LeastAvailable()
        memory.start()
        kids = [_child(config, args.overrides, out, name, k, args.steps) for k, name in enumerate(names)]
        if tag == "seq":  # recipes/children.py, as demo.grpo_parallel runs them: one at a time, then all at once
            for kid in kids:
                run_at_once([kid], args.threads, timeout_s=args.timeout)
        else:
            run_at_once(kids, share, timeout_s=args.timeout, pin=tag == "par")
        wall = time.perf_counter() - start
        memory.stopped.set()
        memory.join()
        runs = {name: _steps(out / name) for name in names}
        arms[arm] = {"threads": args.threads if tag == "seq" else share, "wall_s": round(wall, 1),
                     "least_available_gib": round(memory.least, 2), "runs": {
            name: {"step_s": round(sum(r["time/step_s"] for r in rows), 1), "rollout_s": round(sum(r["time/rollout_s"] for r in rows), 1),
                   "sampled_tokens": int(sum(r["tokens/sampled"] for r in rows)), "steps": len(rows)} for name, rows in runs.items()}}
        print(json.dumps({arm: arms[arm]}), flush=True)
    print("| arm | torch threads a run | wall s | least available GiB | per run: step s (rollout s, sampled tokens) |\n|---|---|---|---|---|")
    for arm, a in arms.items():
        per = "; ".join(f"{v['step_s']} ({v['rollout_s']}, {v['sampled_tokens']})" for v in a["runs"].values())
        print(f"| {arm} | {a['threads']} | {a['wall_s']} | {a['least_available_gib']} | {per} |")
    (out / "result.json").write_text(json.dumps(arms, indent=2))
    if args.at_once_only:
        return
    seq, par = arms["one after the other"]["wall_s"], arms["at the same time"]["wall_s"]
    print(f"at the same time / one after the other: {par / seq:.2f} of the wall time")
    if args.unpinned:
        print(f"unpinned / one after the other: {arms['at the same time, unpinned']['wall_s'] / seq:.2f} of the wall time")


if __name__ == "__main__":
    main()
