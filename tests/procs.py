"""Stopping the processes a test started (imported by tests as `from procs import stop_process`)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL when it has not exited within `timeout` seconds; always reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
