"""The test suite's own guard: a disk without room for what the tests write stops the run at once
with one line (tests/conftest.py), instead of failing most tests and stalling the rest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def _run_suite(folder: Path, min_free_gib: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SEEKRL_TEST_MIN_FREE_GIB": min_free_gib}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(folder)], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_disk_without_room_stops_the_run_at_once_with_one_line(tmp_path):
    shutil.copy(Path(__file__).parent.parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    room = _run_suite(tmp_path, "0")
    assert room.returncode == 0 and "1 passed" in room.stdout, room.stdout + room.stderr
    full = _run_suite(tmp_path, "1e9")  # more than any disk has
    said = full.stdout + full.stderr
    assert full.returncode == 1 and "passed" not in said, said
    line = next(x for x in said.splitlines() if "GiB free on the disk of" in x)
    assert "the tests need 1e+09 GiB" in line and "free space there, or set TMPDIR and HOME" in line
