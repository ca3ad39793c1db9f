"""Start N inference servers for a run, wait until they answer, and stop them whatever happens.

    group = ServerGroup.start([cmd0, cmd1], log_dir=run_dir / "engine", health_path="/health", timeout_s=600)
    group.urls          # ["http://127.0.0.1:41233", ...]
    group.stop()        # SIGTERM to each server's process group, SIGKILL after a grace period

`<log_dir>/servers.json` lists each server's URL, pid, log and command. Each server is its own process group (so a server that forks workers, as vLLM and SGLang do, is
stopped whole), logs to `<log_dir>/server_<i>.log`, and is started with the parent-death signal
set (Linux `prctl(PR_SET_PDEATHSIG, SIGTERM)`): if the training process dies, even by SIGKILL, its
servers get SIGTERM. `stop()` is also registered with atexit, and `terminate_as_exit()` turns
SIGTERM into SystemExit in the trainer so that its `finally` blocks (this `stop()` among them)
run. A server that exits before it answers /health ends the start with one line naming it and
the last line of its log.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["ServerCommand", "ServerGroup", "free_port", "terminate_as_exit", "TERM_GRACE_S", "seekrl_server_command", "ENGINE_TOKEN_ENV"]

PR_SET_PDEATHSIG = 1
ENGINE_TOKEN_ENV = "SEEKRL_ENGINE_TOKEN"  # the bearer token `seekrl serve engine` reads (servers/engine.py)


@dataclass
class ServerCommand:
    """How to start one server: argv (with the port already in it), extra environment, its URL."""

    argv: list[str]
    env: dict[str, str]
    url: str


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def seekrl_server_command(model_dir: str, port: int, *, host: str = "127.0.0.1", dtype: str = "float32",
                          device: str = "auto", max_batch_size: int = 64, seed: int = 0,
                          extra_args: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """argv + env of `seekrl serve engine` (as `python -m seekrl`, the interpreter running now)."""
    argv = [sys.executable, "-m", "seekrl", "serve", "engine", "--model", str(model_dir), "--host", host,
            "--port", str(port), "--dtype", dtype, "--device", device, "--max-batch-size", str(max_batch_size),
            "--seed", str(seed), *(extra_args or [])]
    return argv, {}


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: atexit and the SIGTERM handler still stop the servers
        pass


class ServerGroup:
    """Server processes owned by one run (see the module docstring)."""

    def __init__(self, commands: list[ServerCommand], procs: list[subprocess.Popen], logs: list[Path]):
        self.commands, self.procs, self.logs = commands, procs, logs
        self.urls = [c.url for c in commands]
        self._stopped = False
        atexit.register(self.stop)

    @classmethod
    def start(cls, commands: list[ServerCommand], log_dir: str | os.PathLike, *, health_path: str = "/health",
              timeout_s: float = 600.0, token: str | None = None) -> ServerGroup:
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        procs, logs = [], []
        group = cls(commands, procs, logs)
        try:
            for i, c in enumerate(commands):
                log = log_dir / f"server_{i}.log"
                logs.append(log)
                with open(log, "ab") as out:
                    procs.append(subprocess.Popen(
                        c.argv, env={**os.environ, **c.env}, stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                    ))
            (log_dir / "servers.json").write_text(json.dumps(
                [{"url": c.url, "pid": p.pid, "log": str(lg), "argv": c.argv} for c, p, lg in zip(commands, procs, logs)], indent=1))
            group.wait_healthy(health_path, timeout_s, token)
        except BaseException:
            group.stop()
            raise
        return group

    def wait_healthy(self, health_path: str, timeout_s: float, token: str | None = None) -> None:
        """Poll every server's health endpoint until all answer 200; a server that exits or a
        deadline that passes raises EngineUnavailable with one line."""
        from seekrl.errors import EngineUnavailable

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + timeout_s
        waiting = set(range(len(self.procs)))
        with httpx.Client(timeout=2.0, headers=headers) as client:
            while waiting:
                for i in sorted(waiting):
                    code = self.procs[i].poll()
                    if code is not None:
                        raise EngineUnavailable(
                            f"engine server {self.urls[i]} exited with code {code} before it answered {health_path}: "
                            f"{self.last_line(i)} (log: {self.logs[i]})"
                        )
                    try:
                        if client.get(self.urls[i] + health_path).status_code == 200:
                            waiting.discard(i)
                    except httpx.HTTPError:
                        pass
                if waiting and time.monotonic() > deadline:
                    i = min(waiting)
                    raise EngineUnavailable(
                        f"engine server {self.urls[i]} did not answer {health_path} within engine.startup_timeout_s="
                        f"{timeout_s:g} s: {self.last_line(i)} (log: {self.logs[i]})"
                    )
                if waiting:
                    time.sleep(0.1)

    def last_line(self, i: int) -> str:
        try:
            lines = [ln for ln in self.logs[i].read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        return lines[-1].strip()[:300] if lines else "empty log"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every server's process group, then SIGKILL to what is left after `grace_s`."""
        if self._stopped:
            return
        self._stopped = True
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # the group: workers a server forked too
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        atexit.unregister(self.stop)


TERM_GRACE_S = 60.0


@contextlib.contextmanager
def terminate_as_exit(grace_s: float = TERM_GRACE_S):
    """Within the block, SIGTERM raises SystemExit(143) (so `finally` blocks run); restored after.

    The exit is bounded: `asyncio.run` waits for its worker threads (a decode batch or an update
    in `asyncio.to_thread`) before the `finally` blocks finish, and a thread stuck in a long or
    hung kernel would hold the process for minutes. `grace_s` seconds after SIGTERM the process
    ends with `os._exit(143)` whatever it is waiting for (engine servers still get SIGTERM from
    their parent-death signal)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    timers: list[threading.Timer] = []

    def handler(signum, frame):
        timers.append(threading.Timer(grace_s, os._exit, args=(128 + signum,)))
        timers[-1].daemon = True
        timers[-1].start()
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    exiting = False
    try:
        yield
    except SystemExit:
        exiting = bool(timers)  # the process is ending: the timer bounds the rest of its shutdown
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
        if not exiting:
            for t in timers:
                t.cancel()
