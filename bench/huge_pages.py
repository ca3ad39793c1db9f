"""Training steps with PyTorch's large CPU tensors on 4 KiB pages and on transparent huge pages, side by side in one run.

    python bench/huge_pages.py                                    # the tiny GRPO example, 4 steps
    python bench/huge_pages.py --job sft --config runs/hotpotqa/sft/config.yaml --steps 3
    python bench/huge_pages.py --config runs/hotpotqa/grpo/config.yaml --steps 2 rollout.refill=false

Each arm is a child process that runs the job (`seekrl train` or `seekrl sft`) on the config for
`--steps` steps in a temporary folder:

- "4k": `THP_MEM_ALLOC_ENABLE=0`, PyTorch's plain allocation, as seekrl runs: glibc maps a block
  over its mmap threshold (at most 32 MiB) afresh and unmaps it when freed, so the kernel faults
  it in and zeroes it 4 KiB at a time, every step;
- "huge": `THP_MEM_ALLOC_ENABLE=1`, PyTorch's switch for transparent huge pages (blocks of 2 MiB
  or more 2 MiB-aligned and `madvise(MADV_HUGEPAGE)`, one fault per 2 MiB).

It prints, per arm, the mean step time (`time/step_s`, the first step left out as warm-up when
there are more), the minor page faults and the kernel's share of the CPU time over the whole
child, the peak resident memory (VmHWM), and a markdown row for BENCHMARKS.md. The arms run one
after the other (`--order` says which first), so each has the machine to itself; the same seed
gives them the same losses up to float rounding (a GRPO loss differed in its 7th digit).
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
import json, resource, sys
from seekrl import jobs  # importing seekrl applies seekrl/memory.py's settings, before torch
from seekrl.config import load_config
from seekrl.observe.loggers import read_metrics
run = getattr(jobs, sys.argv[1])(load_config(sys.argv[2], sys.argv[3:]))
rows = [r for r in read_metrics(run) if r.get("step", 0) > 0 and "time/step_s" in r]
use = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
print("BENCH " + json.dumps({"step_s": [r["time/step_s"] for r in rows], "faults": use.ru_minflt, "user_s": use.ru_utime,
                             "sys_s": use.ru_stime, "peak_gib": hwm,
                             "loss": [r.get("loss/policy", r.get("loss")) for r in rows]}))
"""

ARMS = {"4k": {"THP_MEM_ALLOC_ENABLE": "0"}, "huge": {"THP_MEM_ALLOC_ENABLE": "1"}}


def arm(name: str, job: str, config: str, steps: int, overrides: list[str], timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    return run_arm(CHILD, name, [job], config, steps, overrides, timeout_s, env={**env, **ARMS[name]})


def mean_step(r: dict) -> float:
    times = r["step_s"][1:] if len(r["step_s"]) > 1 else r["step_s"]
    return sum(times) / len(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", choices=("train", "sft"), default="train")
    add_arm_arguments(p)
    p.add_argument("--order", choices=("4k,huge", "huge,4k"), default="4k,huge", help="which arm runs first")
    a = p.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench/huge_pages.py needs Linux (transparent huge pages, /proc)")
    with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
        thp = f.read().split("[")[-1].split("]")[0]  # the kernel's mode: always, madvise or never
    res = {name: arm(name, a.job, a.config, a.steps, a.overrides, a.timeout_s) for name in a.order.split(",")}
    for name, r in res.items():
        cpu = r["user_s"] + r["sys_s"]
        print(f"{name}: {mean_step(r):.1f} s/step ({', '.join(f'{x:.1f}' for x in r['step_s'])}); {r['faults']:,} page faults; "
              f"kernel {100 * r['sys_s'] / cpu:.0f}% of {cpu:.0f} CPU s; peak {r['peak_gib']:.2f} GiB")
    if res["4k"]["loss"] != res["huge"]["loss"]:
        print(f"the arms' losses differ: {res['4k']['loss']} vs {res['huge']['loss']}")
    k, h = res["4k"], res["huge"]
    cmd = " ".join(["python bench/huge_pages.py", *([f"--job {a.job}"] if a.job != "train" else []),
                    *(["--config", a.config] if "--config" in sys.argv else []), f"--steps {a.steps}",
                    *([f"--order {a.order}"] if a.order != "4k,huge" else []), *a.overrides])
    print(f"| huge pages (THP {thp}) | `{cmd}` | {platform.machine()}, {os.cpu_count()} CPUs | {datetime.date.today()} | "
          f"{mean_step(k):.1f} -> {mean_step(h):.1f} s/step, page faults {k['faults']:,} -> {h['faults']:,}, "
          f"kernel time {100 * k['sys_s'] / (k['user_s'] + k['sys_s']):.0f}% -> {100 * h['sys_s'] / (h['user_s'] + h['sys_s']):.0f}%, "
          f"peak {k['peak_gib']:.2f} -> {h['peak_gib']:.2f} GiB |")
    if a.out:
        Path(a.out).write_text(json.dumps({"command": cmd, "thp": thp, **res}, indent=2))


if __name__ == "__main__":
    main()
