"""SIGTERM ends a job within its grace period even while a worker thread is busy: `asyncio.run`
waits for its `to_thread` workers (a decode batch, an update) at shutdown, and a thread stuck in a
long kernel must not hold the process (engines/launch.py `terminate_as_exit`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from procs import stop_process

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, sys, time
from seekrl.engines.launch import terminate_as_exit

async def main():
    print("ready", flush=True)
    await asyncio.to_thread(time.sleep, {busy})

done = []
with terminate_as_exit(grace_s={grace}):
    try:
        asyncio.run(main())
    finally:
        done.append(1)
        print("finally ran", flush=True)
"""


def run_and_terminate(busy: float, grace: float) -> tuple[int, str, float]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(busy=busy, grace=grace)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        return proc.returncode, out, time.monotonic() - start
    finally:
        stop_process(proc)


def test_sigterm_ends_a_job_whose_worker_thread_is_stuck_within_the_grace_period():
    code, _, took = run_and_terminate(busy=120, grace=2)
    assert code == 143 and took < 30, (code, took)


def test_sigterm_with_an_idle_worker_still_runs_the_finally_blocks():
    code, out, took = run_and_terminate(busy=1, grace=30)
    assert code == 143 and "finally ran" in out and took < 20, (code, out, took)
