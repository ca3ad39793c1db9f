"""The process's resident memory under glibc: fewer malloc arenas, and freed pages given back.

A training process frees tensors of ever-changing sizes from several threads (the engine's
sampling thread, the update's worker thread, the trainer). glibc keeps freed memory in its arenas
for reuse instead of returning it to the operating system, so the resident set grows far past what
the live tensors hold:

- `limit_malloc_arenas()` caps the arenas at 2 (importing seekrl calls it, before seekrl imports
  torch; an explicit `MALLOC_ARENA_MAX` wins). Without it SmolLM2 GRPO on a CPU grew from 7 to
  24 GiB in 9 steps (RESULTS.md, the HotpotQA recipe).
- `release()` calls `malloc_trim(0)`, which hands the arenas' free pages back. The RL and SFT
  loops call it after every step (metrics `memory/rss_gib`, `memory/trimmed_gib`, and the step's
  peak, `memory/peak_rss_gib`, from Linux's high-water mark, reset at each call), and every job
  of seekrl/jobs.py once it has released its components, so a recipe that runs many stages in one
  process does not carry one stage's free pages into the next. Measured on SmolLM2-135M GRPO (the
  HotpotQA recipe's branch configuration, one step of 16 episodes x 4 answers, 2-core CPU): 4.49
  GiB resident after the step, 1.61 GiB after the trim, 1.10 GiB of it live tensors
  (BENCHMARKS.md, "Resident memory"). A vLLM worker seekrl starts calls it after each weight load
  (engines/vllm_worker.py). `SEEKRL_MALLOC_TRIM=0` in the environment turns the trim off everywhere
  (the figures are still read): a benchmark's arm without it, or a process with another allocator.

- PyTorch's own transparent-huge-page switch (`THP_MEM_ALLOC_ENABLE=1`) is left to the user: on
  SmolLM2 SFT and GRPO on a 2-core CPU it cut page faults 2.4-2.6x but doubled the kernel's share of
  the CPU time and made steps slower (BENCHMARKS.md, "Huge pages"; bench/huge_pages.py).

Other C libraries (musl, macOS) have neither call; both functions then do nothing, and
`resident_gib()` reads /proc where it exists.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["limit_malloc_arenas", "release", "resident_gib"]

_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
_GIB = float(1 << 30)


@functools.cache  # loaded once: release() runs every training step
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:  # not glibc
        return None


def limit_malloc_arenas(arenas: int = 2) -> None:
    """At most `arenas` glibc malloc arenas, unless MALLOC_ARENA_MAX is set (it wins). Call it
    before the threads that allocate start (before torch is imported)."""
    libc = _libc()
    if libc is not None and "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(_M_ARENA_MAX, arenas)


def _status_gib(field: str) -> float | None:
    """A field of this process's /proc status in GiB (VmRSS, VmHWM), or None where it is not there."""
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024 / _GIB
    except OSError:
        pass
    return None


def resident_gib() -> float | None:
    """This process's resident set in GiB (VmRSS), or None where /proc is not there."""
    return _status_gib("VmRSS")


def peak_resident_gib() -> float | None:
    """This process's most resident memory in GiB (VmHWM: since it started, or since the last
    `release()` reset it), or None where /proc is not there."""
    return _status_gib("VmHWM")


def _reset_peak() -> bool:
    """Start Linux's resident high-water mark (VmHWM) again from the present resident set; whether
    it could (writing 5 to /proc/self/clear_refs, Linux 4.0 and later)."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


TRIM_ENV = "SEEKRL_MALLOC_TRIM"  # "0": release() leaves glibc's free pages where they are (a benchmark's
# arm without the trim, or a process that preloads another allocator)
_PEAK_SINCE_RELEASE = [False]  # whether VmHWM was reset at the last release(): its peak is then the step's


def release() -> dict[str, float]:
    """Give glibc's free pages back to the system (`malloc_trim(0)`); returns the metrics
    `memory/rss_gib` (resident after it), `memory/trimmed_gib` (what it gave back) and
    `memory/peak_rss_gib` (the most resident since the last call: a step's peak, which is what
    sizes the memory several runs at once need; from the second call on, and only where the
    high-water mark can be reset), or {} where the resident set cannot be read. With
    SEEKRL_MALLOC_TRIM=0 in the environment it trims nothing and only reads the figures."""
    peak = peak_resident_gib() if _PEAK_SINCE_RELEASE[0] else None
    before = resident_gib()
    libc = _libc()
    if libc is not None and os.environ.get(TRIM_ENV, "1") != "0":
        libc.malloc_trim(0)
    after = resident_gib()
    _PEAK_SINCE_RELEASE[0] = _reset_peak()
    if before is None or after is None:
        return {}
    out = {"memory/rss_gib": after, "memory/trimmed_gib": max(0.0, before - after)}
    if peak is not None:
        out["memory/peak_rss_gib"] = peak
    return out
