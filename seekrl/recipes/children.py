"""Commands of a recipe run at the same time, each in its own process with a share of the cores.

On a small CPU a training run of SmolLM2 does not use its second core well (the engine's decode
steps are bound by per-layer dispatch and small matmuls), so two GRPO seeds at one torch thread
each finished in 0.71 of the time of the two one after the other with both (BENCHMARKS.md,
"Several runs on one CPU").
`run_at_once` starts each command in a new session (a Ctrl-C of the recipe reaches it only
through this module), with `OMP_NUM_THREADS` set to its share and its output in its own log file,
shows each one's progress, and waits for all of them; a child's `then` commands follow its own
first one (a seed's eval after its training), not the last of the others. Each child is pinned
to cores of its own (`core_sets`: the cores this process may use, split in order), which it
inherits from the thread that forks it (pinned to them while it does, so no child runs a moment
on others): whatever the child starts inherits them too, so a vLLM CPU server a GRPO run starts
binds its OpenMP threads to that child's cores (engines/adapters.py reads the affinity), not to
every core, where two servers' spinning threads would take each other's cores. With more
children than cores every child may use every core, and a vLLM server of one runs its one
thread unbound (OMP_NUM_THREADS below its cores: "nobind").
When one fails, when one passes the timeout, on Ctrl-C, or when this process gets SIGTERM
(`terminate_as_exit`: a SystemExit, so the stopping runs), the others are stopped too (SIGTERM
to the process group: `seekrl train` then stops as on a kill and resumes from its last
checkpoint; SIGKILL after a grace period), and the error names the command, its exit code and
its log's last line.
While the children run, this process is their descendants' subreaper (Linux
`PR_SET_CHILD_SUBREAPER`): what a child started in a session of its own, as a GRPO run starts its
vLLM server (engines/launch.py), is reparented here when that child dies, and is stopped with the
others, and so is what stopping it orphans in turn. A child killed outright (the kernel's OOM killer, SIGKILL) cannot stop its servers, and
the parent-death SIGTERM they get is not enough where a server hangs in its shutdown: a vLLM API
server whose trainer the OOM killer ended was still waiting on its HTTP server's background tasks
45 s later, when it was killed by hand.
Run one `run_at_once` at a time in a process: any child of this process that appears while it runs
and is not one of its commands counts as such an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from seekrl.engines.launch import terminate_as_exit

__all__ = ["Child", "ChildFailed", "available_memory_gib", "core_sets", "core_share", "run_at_once", "steps_done"]

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


@dataclass
class Child:
    name: str
    """What the progress and the errors call it (a run folder's name)."""
    argv: list[str]
    """The whole command line (e.g. [sys.executable, "-m", "seekrl.cli", "train", ...])."""
    log: Path
    """Where its stdout and stderr go (overwritten)."""
    done: Callable[[], int] | None = None
    """Units of work done so far (e.g. the steps in its metrics.jsonl), polled for the progress bar."""
    total: int | None = None
    """Units of work in all (the bar's end); None: no bar, only the elapsed time."""
    then: list[list[str]] = field(default_factory=list)
    """Command lines run after `argv` has succeeded, one after the other, each as `argv` was (its
    cores, its threads, its log, appended to): a trained seed's eval, which so starts while the
    other children still train, instead of after the last of them."""


class ChildFailed(RuntimeError):
    """A child exited with a nonzero code or passed the timeout; the others were stopped."""


def available_memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """The memory new processes can take without swapping, in GiB: Linux's MemAvailable (free
    memory plus the page cache the kernel can drop); None where the file or the field is missing."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20  # kB
    return None


def core_share(n: int) -> int:
    """Torch threads for each of `n` processes run at once: the cores this process may use, split
    evenly (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, n))


def core_sets(n: int) -> list[list[int]]:
    """The cores of each of `n` processes run at once: this process's cores split in order into
    `core_share(n)` each, disjoint while there are enough. With more processes than cores each may
    run on every one, and the kernel shares them out: pinned in turn, three processes on two
    cores would give one a core of its own and the other two half a core each."""
    cores = sorted(os.sched_getaffinity(0))
    if n > len(cores):
        return [list(cores) for _ in range(n)]
    k = core_share(n)
    return [cores[i * k:(i + 1) * k] for i in range(n)]


def steps_done(run_dir: Path) -> Callable[[], int]:
    """A `Child.done` for a training run: the last step its metrics.jsonl has logged (0 before the first)."""

    from seekrl.observe.loggers import read_metrics

    def done() -> int:
        return max((r.get("step", 0) for r in read_metrics(run_dir)), default=0)

    return done


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").replace("\r", "\n").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip()[:300] if lines else "empty log"


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # the group: whatever the child started too
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def _subreaper(on: bool) -> bool | None:
    """Set whether this process is its descendants' subreaper; returns what it was (None where the
    platform has no such thing: then orphans go to init, as before)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
            return None
        libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(was.value)
    except (OSError, AttributeError):
        return None


def _own_children() -> set[int]:
    """The pids whose parent is this process (/proc; empty where there is none)."""
    me, kids = os.getpid(), set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{entry.name}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                            kids.add(int(entry.name))
    return kids


def _stop_orphans(pids: set[int], grace_s: float) -> None:
    """SIGTERM to each orphan's process group (the orphan alone where it shares this process's),
    SIGKILL after `grace_s`, and reap them: they are this process's children now."""
    mine = os.getpgid(0)

    def send(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group == mine:  # never signal this process's own group
                os.kill(pid, sig)
            else:
                os.killpg(group, sig)

    def reap(until: float) -> set[int]:
        left = set(pids)
        while left:
            for pid in list(left):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                left.discard(pid)
            if not left or time.monotonic() >= until:
                break
            time.sleep(0.1)
        return left

    for pid in pids:
        send(pid, signal.SIGTERM)
    left = reap(time.monotonic() + grace_s)
    for pid in left:
        send(pid, signal.SIGKILL)
    reap(time.monotonic() + 5)


def run_at_once(children: list[Child], threads: int, console: Console | None = None, timeout_s: float | None = None,
                grace_s: float = 60.0, poll_s: float = 2.0, pin: bool = True) -> dict[str, float]:
    """Run every child at once with `threads` torch threads each, each pinned to its `core_sets`
    (`pin`), each child's `then` commands after its `argv`; returns each one's wall seconds, to the
    end of its last command. Raises ChildFailed when a command fails or a child passes `timeout_s`
    (the others stopped first). What a child started and left running when it died is stopped too
    (the module docstring: this process is the subreaper meanwhile)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cores = core_sets(len(children)) if pin else []
    was_reaper = _subreaper(True)
    before = _own_children()
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    queued = [list(c.then) for c in children]  # each child's commands still to start
    ended: dict[str, float] = {}
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console or Console(stderr=True), transient=False)

    def launch(i: int, argv: list[str], mode: str) -> subprocess.Popen:
        c = children[i]
        c.log.parent.mkdir(parents=True, exist_ok=True)
        own = os.sched_getaffinity(0)
        if cores:  # this thread's cores while it forks: the child has them from its first instruction on
            os.sched_setaffinity(0, cores[i])
        try:
            with c.log.open(mode) as log:
                return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        finally:
            if cores:
                os.sched_setaffinity(0, own)

    try:
        with progress, terminate_as_exit(grace_s + 30):  # a SIGTERM of this process stops them too
            for i, c in enumerate(children):
                procs.append(launch(i, c.argv, "w"))
            bars = [progress.add_task(c.name, total=c.total) for c in children]
            while len(ended) < len(children):
                for i, (c, bar) in enumerate(zip(children, bars)):
                    if c.name in ended:
                        continue
                    if c.done is not None:
                        with contextlib.suppress(OSError, ValueError):
                            progress.update(bar, completed=c.done())
                    code = procs[i].poll()
                    if code is None:
                        continue
                    if code != 0:
                        which = f" (command {1 + len(c.then) - len(queued[i])} of {1 + len(c.then)})" if c.then else ""
                        raise ChildFailed(f"{c.name}{which} exited with code {code}: {_last_line(c.log)} (log: {c.log})")
                    if queued[i]:  # its next command, on the same cores
                        procs[i] = launch(i, queued[i].pop(0), "a")
                        continue
                    ended[c.name] = round(time.monotonic() - start, 1)
                    progress.update(bar, completed=c.total)
                if timeout_s is not None and time.monotonic() - start > timeout_s and len(ended) < len(children):
                    late = next(c for c in children if c.name not in ended)
                    raise ChildFailed(f"{late.name} did not finish within {timeout_s:g} s: {_last_line(late.log)} (log: {late.log})")
                time.sleep(poll_s if len(ended) < len(children) else 0)
    finally:
        _stop(procs, grace_s)
        if was_reaper is not None:  # orphans of the children's descendants, reparented here
            for _ in range(3):  # stopping an orphan reparents its own children here: those next
                orphans = _own_children() - before - {p.pid for p in procs}
                if not orphans:
                    break
                _stop_orphans(orphans, grace_s)
            if not was_reaper:
                _subreaper(False)
    return ended
