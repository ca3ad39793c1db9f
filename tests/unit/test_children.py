"""recipes/children.py: commands run at once with a share of the cores each, pinned to cores of
their own (which what they start inherits); a failure, a timeout or Ctrl-C stops every one of
them, the processes they started too."""

from __future__ import annotations

import os
import sys
import time

import pytest

from seekrl.recipes.children import Child, ChildFailed, core_sets, core_share, run_at_once, steps_done

STAMPS = """
import os, sys, time
open(sys.argv[1] + '.start', 'w').write(repr(time.time()))
print('threads', os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS'], flush=True)
time.sleep(float(sys.argv[2]))
open(sys.argv[1] + '.end', 'w').write(repr(time.time()))
print('done', flush=True)
"""


def _child(tmp_path, name, code, *args):
    return Child(name, [sys.executable, "-c", code, str(tmp_path / name), *map(str, args)], tmp_path / f"{name}.log")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as stopped
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_children_run_at_once_with_their_share_of_threads(tmp_path):
    kids = [_child(tmp_path, n, STAMPS, 1.5) for n in ("a", "b")]
    ended = run_at_once(kids, threads=3, poll_s=0.05)
    assert set(ended) == {"a", "b"}
    start = {n: float((tmp_path / f"{n}.start").read_text()) for n in "ab"}
    end = {n: float((tmp_path / f"{n}.end").read_text()) for n in "ab"}
    assert max(start.values()) < min(end.values())  # each had started before either ended: at the same time
    for n in "ab":
        assert (tmp_path / f"{n}.log").read_text().splitlines() == ["threads 3 3", "done"]


def test_a_childs_next_commands_start_when_its_last_one_ends_not_when_the_others_do(tmp_path):
    quick = _child(tmp_path, "quick", STAMPS, 0.2)
    quick.then = [[sys.executable, "-c", STAMPS, str(tmp_path / "quick2"), "0.2"]]
    slow = _child(tmp_path, "slow", STAMPS, 3.0)
    ended = run_at_once([quick, slow], threads=1, poll_s=0.05)
    stamp = {n: float((tmp_path / n).read_text()) for n in ("quick.end", "quick2.start", "quick2.end", "slow.end")}
    assert stamp["quick.end"] <= stamp["quick2.start"] < stamp["quick2.end"] < stamp["slow.end"]  # after its own, before the other's end
    assert (tmp_path / "quick.log").read_text().splitlines() == ["threads 1 1", "done"] * 2  # one log, appended to
    assert ended["quick"] < ended["slow"]  # its wall time runs to the end of its last command
    bad = _child(tmp_path, "bad", STAMPS, 0.1)
    bad.then = [[sys.executable, "-c", "import sys; print('eval: no model', flush=True); sys.exit(2)"], [sys.executable, "-c", STAMPS, str(tmp_path / "never"), "0"]]
    with pytest.raises(ChildFailed, match=r"^bad \(command 2 of 3\) exited with code 2: eval: no model"):
        run_at_once([bad], threads=1, poll_s=0.05, grace_s=5)
    assert not (tmp_path / "never.start").exists()  # a failed command stops its child's next ones


def test_a_failing_child_stops_the_others_and_what_they_started(tmp_path):
    sleeper = ("import subprocess, sys, time\n"
               "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
               "open(sys.argv[1] + '.pids', 'w').write(f'{p.pid}')\n"
               "print('waiting', flush=True); time.sleep(120)\n")
    failing = "import sys, time; time.sleep(1.0); print('loading'); print('boom: no such file', flush=True); sys.exit(3)"
    kids = [_child(tmp_path, "slow", sleeper), _child(tmp_path, "bad", failing)]
    start = time.monotonic()
    with pytest.raises(ChildFailed, match=r"^bad exited with code 3: boom: no such file \(log: .*bad\.log\)$"):
        run_at_once(kids, threads=1, poll_s=0.05, grace_s=5)
    assert time.monotonic() - start < 60  # not the sleeper's 120 s
    grandchild = int((tmp_path / "slow.pids").read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)  # SIGTERM reached the sleeper's whole process group


def _is_subreaper() -> bool:
    import ctypes

    flag = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    return bool(flag.value)


def test_what_a_killed_child_left_running_in_its_own_session_is_stopped(tmp_path):
    """A GRPO run the OOM killer ends cannot stop its vLLM server, which runs in a session of its
    own and may hang in its shutdown: here a server that ignores SIGTERM. It is reparented to the
    recipe and stopped with the others (SIGKILL after the grace period)."""
    # the server ignores SIGTERM and has a worker of its own in yet another session, which its
    # SIGKILL orphans in turn (vLLM's engine core and workers)
    server = ("import signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "w = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "time.sleep(120)'], start_new_session=True)\n"
              "open(sys.argv[1], 'w').write(f'{w.pid}'); time.sleep(120)\n")
    killed = ("import os, signal, subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', {server!r}, sys.argv[1] + '.worker'], start_new_session=True)\n"
              "open(sys.argv[1] + '.pids', 'w').write(f'{p.pid}')\n"
              "while not os.path.exists(sys.argv[1] + '.worker'): time.sleep(0.05)\n"
              "time.sleep(0.2); print('killed', flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    was = _is_subreaper()
    start = time.monotonic()
    with pytest.raises(ChildFailed, match=r"^oom exited with code -9: killed \(log: "):
        run_at_once([_child(tmp_path, "oom", killed)], threads=1, poll_s=0.05, grace_s=1)
    assert time.monotonic() - start < 60  # not the server's 120 s
    for pids in ("oom.pids", "oom.worker"):  # the server, then its worker: stopped and reaped before it returned
        assert not _alive(int((tmp_path / pids).read_text())), pids
    assert _is_subreaper() == was  # this process's setting is given back


RUNNER = """
import sys
sys.path.insert(0, {root!r})
from seekrl.recipes.children import Child, run_at_once
from pathlib import Path
sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
run_at_once([Child("s", [sys.executable, "-c", sleeper, {pid!r}], Path({log!r}))], threads=1, poll_s=0.05, grace_s=5)
"""


def test_a_sigterm_of_the_runner_stops_its_children(tmp_path):
    """`kill PID` of a recipe (not only Ctrl-C) stops the seeds it runs: SIGTERM becomes a
    SystemExit inside run_at_once, so its stopping runs; the child does not outlive it."""
    import signal
    import subprocess
    from pathlib import Path

    import seekrl

    root = str(Path(seekrl.__file__).parents[1])
    pid_file = tmp_path / "s.pid"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER.format(root=root, pid=str(pid_file), log=str(tmp_path / "s.log"))])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and runner.poll() is None
            time.sleep(0.05)
        child = int(pid_file.read_text())
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) != 0
        assert not _alive(child)  # stopped, not orphaned
    finally:
        runner.kill()
        runner.wait(timeout=10)


def test_a_child_past_the_timeout_is_stopped(tmp_path):
    kids = [_child(tmp_path, "quick", STAMPS, 0.1), _child(tmp_path, "stuck", STAMPS, 120)]
    with pytest.raises(ChildFailed, match=r"^stuck did not finish within 2 s: threads 1 1 \(log: "):
        run_at_once(kids, threads=1, timeout_s=2, poll_s=0.05, grace_s=5)
    assert (tmp_path / "quick.end").is_file() and not (tmp_path / "stuck.end").exists()


def test_progress_reads_each_childs_work(tmp_path):
    """`done` is polled while the child runs; a child that ends is shown complete."""
    seen = []
    counter = tmp_path / "count"
    counter.write_text("0")

    def done() -> int:
        seen.append(int(counter.read_text() or 0))
        return seen[-1]

    # each count replaces the file whole: a read between a truncate and its write would see "" (0)
    code = ("import os, sys, time\nfor i in range(1, 4):\n    time.sleep(0.3); open(sys.argv[2] + '.t', 'w').write(str(i))"
            "\n    os.replace(sys.argv[2] + '.t', sys.argv[2])\n")
    kid = Child("steps", [sys.executable, "-c", code, "x", str(counter)], tmp_path / "steps.log", done=done, total=3)
    run_at_once([kid], threads=1, poll_s=0.05)
    assert seen[0] == 0 and max(seen) >= 2 and seen == sorted(seen)


def test_core_share_splits_the_cores_evenly():
    cores = len(os.sched_getaffinity(0))
    assert core_share(1) == cores and core_share(cores) == 1 and core_share(4 * cores) == 1
    assert core_share(2) == max(1, cores // 2)


def test_core_sets_split_the_cores_in_order(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 6})
    assert core_sets(1) == [[0, 1, 2, 3, 6]]
    assert core_sets(2) == [[0, 1], [2, 3]]  # 5 cores for 2: 2 each (core_share), disjoint
    assert core_sets(5) == [[0], [1], [2], [3], [6]]
    # more processes than cores: every one on every core, the kernel shares them out (pinned in turn, 3 on 2 cores
    # would give one a core of its own and two half a core each)
    assert core_sets(7) == [[0, 1, 2, 3, 6]] * 7


AFFINITY = """
import os, subprocess, sys
print(sorted(os.sched_getaffinity(0)), flush=True)
subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)), flush=True)'], check=True)
"""


def test_each_child_and_what_it_starts_run_on_cores_of_their_own(tmp_path):
    kids = [_child(tmp_path, n, AFFINITY) for n in ("a", "b")]
    run_at_once(kids, threads=core_share(2), poll_s=0.05)
    want = core_sets(2)
    for n, cores in zip("ab", want):
        assert (tmp_path / f"{n}.log").read_text().splitlines() == [str(cores), str(cores)]  # the child, its child
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(want[0]) & set(want[1])
    run_at_once([_child(tmp_path, "c", AFFINITY)], threads=1, poll_s=0.05, pin=False)
    assert (tmp_path / "c.log").read_text().splitlines()[0] == str(sorted(os.sched_getaffinity(0)))


def test_steps_done_reads_a_training_runs_last_logged_step(tmp_path):
    done = steps_done(tmp_path / "run")
    assert done() == 0  # before the run folder exists
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0, "eval/em": 0.1}\n{"step": 1}\n{"step": 2}\n\n')
    assert done() == 2
