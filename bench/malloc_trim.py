"""Resident memory of a GRPO run with and without giving glibc's free pages back, side by side in one run.

    python bench/malloc_trim.py                                   # the tiny example, 4 steps
    python bench/malloc_trim.py --config runs/hotpotqa/grpo/config.yaml --steps 3 \\
        rollout.batch_size=16 rollout.refill=false                # SmolLM2 with search (the recipe's GRPO config)

Each arm is a child process that runs `seekrl train` on the config for `--steps` steps in a
temporary folder (2 malloc arenas, as importing seekrl sets them):

- "trim": as seekrl runs (seekrl/memory.py: `malloc_trim(0)` after every step);
- "keep": the same run with the trim left out (`seekrl.memory.release` only reads the resident set).

It prints, per arm, the resident memory after each step (`memory/rss_gib`), the peak resident
memory of the process (VmHWM) and the mean step time, then a markdown row for BENCHMARKS.md.
The arms run one after the other, so each has the machine to itself; the same seed makes them
sample the same episodes (the trim changes no number the run computes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_arm import add_arm_arguments, run_arm  # noqa: E402

CHILD = r"""
import json, sys
from seekrl import memory  # importing seekrl sets 2 malloc arenas, as in every seekrl process
if sys.argv[1] == "keep":
    memory.release = lambda: {"memory/rss_gib": memory.resident_gib(), "memory/trimmed_gib": 0.0}
from seekrl import jobs
from seekrl.config import load_config
from seekrl.observe.loggers import read_metrics
run = jobs.train(load_config(sys.argv[2], sys.argv[3:]))
rows = [r for r in read_metrics(run) if r.get("step", 0) > 0]
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
print("BENCH " + json.dumps({"rss_gib": [r["memory/rss_gib"] for r in rows], "trimmed_gib": [r["memory/trimmed_gib"] for r in rows],
                             "step_s": [r["time/step_s"] for r in rows], "peak_gib": hwm}))
"""


def arm(name: str, config: str, steps: int, overrides: list[str], timeout_s: float) -> dict:
    return run_arm(CHILD, name, [name], config, steps, overrides, timeout_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arm_arguments(p)
    a = p.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench/malloc_trim.py needs Linux with glibc (malloc_trim, /proc)")
    res = {name: arm(name, a.config, a.steps, a.overrides, a.timeout_s) for name in ("keep", "trim")}
    for name, r in res.items():
        print(f"{name}: resident after each step {', '.join(f'{x:.2f}' for x in r['rss_gib'])} GiB; "
              f"peak {r['peak_gib']:.2f} GiB; given back per step {sum(r['trimmed_gib']) / len(r['trimmed_gib']):.2f} GiB; "
              f"{sum(r['step_s']) / len(r['step_s']):.1f} s/step")
    t, k = res["trim"], res["keep"]
    cmd = " ".join(["python bench/malloc_trim.py", *(["--config", a.config] if "--config" in sys.argv else []),
                    f"--steps {a.steps}", *a.overrides])
    print(f"| malloc_trim after each step | `{cmd}` | {platform.machine()}, {os.cpu_count()} CPUs | "
          f"{datetime.date.today()} | resident after the last step {k['rss_gib'][-1]:.2f} -> {t['rss_gib'][-1]:.2f} GiB, "
          f"peak {k['peak_gib']:.2f} -> {t['peak_gib']:.2f} GiB, "
          f"{sum(k['step_s']) / len(k['step_s']):.1f} -> {sum(t['step_s']) / len(t['step_s']):.1f} s/step |")
    if a.out:
        Path(a.out).write_text(json.dumps({"command": cmd, **res}, indent=2))


if __name__ == "__main__":
    main()
