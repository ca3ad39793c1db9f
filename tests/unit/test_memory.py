"""seekrl/memory.py: glibc's free pages go back to the system, and the metrics say how much."""

import json
import subprocess
import sys

import pytest

from seekrl import memory

glibc = pytest.mark.skipif(memory._libc() is None, reason="needs glibc (malloc_trim)")

# 3,200 blocks of 64 KiB (under glibc's mmap threshold: they come from the heap), each followed by
# a small block that stays, so that freeing the big ones leaves holes glibc does not trim on its own.
FRAGMENT = """
import json, sys
sys.path.insert(0, {root!r})
from seekrl import memory
big, small = [], []
for i in range(3200):
    big.append(b"\\x01" * 65536)
    small.append(b"\\x02" * 700)
held = memory.resident_gib()
del big
kept = memory.resident_gib()
print(json.dumps({{"held": held, "kept": kept, **memory.release()}}))
"""


@glibc
def test_release_gives_freed_heap_pages_back():
    root = str(__import__("pathlib").Path(memory.__file__).parents[1])
    # Fixed thresholds: glibc's dynamic ones depend on what the interpreter allocated first (compiling
    # .pyc files or not), and with them free() sometimes gave the blocks back itself, the trim then
    # finding nothing (a flaky failure). At 1 MiB the 64 KiB blocks always come from the heap, and a
    # 1 GiB trim threshold keeps free() from trimming the heap's top: what comes back is the trim's.
    out = subprocess.run([sys.executable, "-c", FRAGMENT.format(root=root)], capture_output=True, text=True, timeout=120,
                         env={"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30),
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    # most of the 200 MiB freed but kept by glibc (the holes), then given back by the trim
    assert m["kept"] > 0.5 * m["held"] > 0.09, m
    assert m["memory/trimmed_gib"] > 0.08, m
    assert m["memory/rss_gib"] < m["kept"] - 0.08, m


def test_resident_and_release_metrics_in_this_process():
    rss = memory.resident_gib()
    if rss is None:
        pytest.skip("no /proc here")
    assert 0.01 < rss < 64
    m = memory.release()
    assert {"memory/rss_gib", "memory/trimmed_gib"} <= set(m) <= {"memory/rss_gib", "memory/trimmed_gib", "memory/peak_rss_gib"}
    assert 0.01 < m["memory/rss_gib"] <= rss + 0.05 and m["memory/trimmed_gib"] >= 0


PEAK = """
import json, sys
sys.path.insert(0, {root!r})
from seekrl import memory
first = memory.release()
big = bytearray(300 * 2**20)  # zero-filled by the kernel on touch: write every page
for i in range(0, len(big), 4096):
    big[i] = 1
del big
step = memory.release()  # the step that held 300 MiB
quiet = memory.release()  # a step that held nothing more
print(json.dumps({{"first": first, "step": step, "quiet": quiet}}))
"""


def test_the_peak_metric_is_each_steps_own_high_water_mark():
    import pathlib

    if memory.resident_gib() is None:
        pytest.skip("no /proc here")
    root = str(pathlib.Path(memory.__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", PEAK.format(root=root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    if not memory._reset_peak():
        assert "memory/peak_rss_gib" not in m["step"]  # no per-step peak where the mark cannot be reset
        return
    assert "memory/peak_rss_gib" not in m["first"]  # the first call has no step before it
    held = m["step"]["memory/peak_rss_gib"]
    assert held >= m["step"]["memory/rss_gib"] + 0.25, m  # the 300 MiB it held, gone by the step's end
    assert m["quiet"]["memory/peak_rss_gib"] < held - 0.25, m  # the mark was reset: the next step's own peak


def test_an_explicit_malloc_arena_max_wins(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))

    monkeypatch.setattr(memory, "_libc", lambda: Libc())
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    memory.limit_malloc_arenas()
    assert calls == []
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    memory.limit_malloc_arenas(3)
    assert calls == [(-8, 3)]


def test_seekrl_malloc_trim_0_leaves_the_free_pages_and_still_reports(monkeypatch):
    trims = []

    class Libc:
        def malloc_trim(self, pad):
            trims.append(pad)

    monkeypatch.setattr(memory, "_libc", lambda: Libc())
    monkeypatch.setenv(memory.TRIM_ENV, "0")
    m = memory.release()
    assert trims == []
    if memory.resident_gib() is not None:
        assert m["memory/trimmed_gib"] >= 0 and m["memory/rss_gib"] > 0
    monkeypatch.delenv(memory.TRIM_ENV)
    memory.release()
    assert trims == [0]
