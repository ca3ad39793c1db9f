"""The process's resident memory under glibc: fewer malloc arenas, and freed pages given back.

A training process frees tensors of ever-changing sizes from several threads (the engine's
sampling thread, the update's worker thread, the trainer). glibc keeps freed memory in its arenas
for reuse instead of returning it to the operating system, so the resident set grows far past what
the live tensors hold:

- `limit_malloc_arenas()` caps the arenas at 2 (importing seekrl calls it, before seekrl imports
  torch; an explicit `MALLOC_ARENA_MAX` wins). Without it SmolLM2 GRPO on a CPU grew from 7 to
  24 GiB in 9 steps (RESULTS.md, the HotpotQA recipe).
- `release()` calls `malloc_trim(0)`, which hands the arenas' free pages back. The RL and SFT
  loops call it after every step (metrics `memory/rss_gib`, `memory/trimmed_gib`), and every job
  of seekrl/jobs.py once it has released its components, so a recipe that runs many stages in one
  process does not carry one stage's free pages into the next. Measured on SmolLM2-135M GRPO (the
  HotpotQA recipe's branch configuration, one step of 16 episodes x 4 answers, 2-core CPU): 4.49
  GiB resident after the step, 1.61 GiB after the trim, 1.10 GiB of it live tensors
  (BENCHMARKS.md, "Resident memory").

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


def resident_gib() -> float | None:
    """This process's resident set in GiB (VmRSS), or None where /proc is not there."""
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / _GIB
    except OSError:
        pass
    return None


def release() -> dict[str, float]:
    """Give glibc's free pages back to the system (`malloc_trim(0)`); returns the metrics
    `memory/rss_gib` (resident after it) and `memory/trimmed_gib` (what it gave back), or {}
    where the resident set cannot be read."""
    before = resident_gib()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    after = resident_gib()
    if before is None or after is None:
        return {}
    return {"memory/rss_gib": after, "memory/trimmed_gib": max(0.0, before - after)}
