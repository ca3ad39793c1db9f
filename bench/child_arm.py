"""One bench arm as a child process: a seekrl job on a config for a few steps in a temporary run
folder, which prints one line `BENCH {json}`; shared by bench/huge_pages.py and bench/malloc_trim.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_arm(code: str, name: str, argv: list[str], config: str, steps: int, overrides: list[str], timeout_s: float,
            env: dict[str, str] | None = None) -> dict:
    """Run `code` (`python -c code *argv CONFIG train.steps=STEPS ...`) with the repository on its
    path and `env` as its environment (default: this one's); return its BENCH line's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [config, f"train.steps={steps}", f"log.dir={tmp}", f"log.name={name}", "train.save_every=0",
                "train.resume=never", "log.progress=false", "log.tensorboard=false", *overrides]
        env = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code, *argv, *args], capture_output=True, text=True, env=env,
                             timeout=timeout_s)
    if out.returncode != 0:
        raise SystemExit(f"the {name} arm failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(next(line[6:] for line in out.stdout.splitlines() if line.startswith("BENCH ")))


def add_arm_arguments(p) -> None:
    """The options every such bench takes: the config, the steps, the per-arm timeout, --out and
    the overrides for both arms."""
    p.add_argument("--config", default=str(ROOT / "examples" / "tiny_grpo.yaml"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per arm")
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("overrides", nargs="*", help="section.key=value, for both arms")


def add_run_arguments(p, out: str) -> None:
    """The options of a bench of whole `seekrl train` runs as child processes (bench/parallel_runs.py,
    bench/grpo_engines.py): the config and its overrides, the torch threads, the output folder and
    each arm's timeout."""
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--out", default=out)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds each arm may take")


def fresh_out(args) -> tuple[Path, str]:
    """(--out, emptied and made; the config's absolute path): where the arms' run folders go."""
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out, str(Path(args.config).resolve())
