"""`seekrl train ... engine.servers=N` end to end, as a user runs it (real processes, real servers).

The run starts its `seekrl serve engine` processes, syncs weights by disk every step, and stops
them when it ends; killing a server mid-run is routed around (one of two) or ends the run with one
line naming it (the only one); SIGTERM to the trainer leaves no server behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "model.tiny_hidden=64", "rollout.batch_size=32", "rollout.group_size=8", "data.eval=null",
    "log.progress=false", "log.tensorboard=false", "log.samples_every=0", "train.save_every=0",
]


def train_cmd(tmp_path: Path, name: str, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "seekrl", "train", str(ROOT / "examples" / "tiny_grpo.yaml"), *BASE,
            f"log.dir={tmp_path}", f"log.name={name}", *overrides]


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def server_pids(run: Path, timeout: float = 60.0) -> list[int]:
    path = run / "engine" / "servers.json"
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < deadline, "the run did not start its engine servers"
        time.sleep(0.1)
    return [s["pid"] for s in json.loads(path.read_text())]


def wait_steps(proc, run: Path, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(metrics(run)) < n:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "the run ended early"
        assert time.monotonic() < deadline, f"fewer than {n} steps in {timeout} s"
        time.sleep(0.1)


def assert_gone(pids: list[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"engine servers still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.1)


def test_a_run_on_one_server_equals_the_local_run(tmp_path):
    local = subprocess.run(train_cmd(tmp_path, "local", "train.steps=3"), capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    remote = subprocess.run(train_cmd(tmp_path, "remote", "train.steps=3", "engine.servers=1"),
                            capture_output=True, text=True, timeout=300)
    assert remote.returncode == 0, remote.stderr
    a, b = metrics(tmp_path / "local"), metrics(tmp_path / "remote")
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        assert y["reward/mean"] == pytest.approx(x["reward/mean"], abs=1e-6)
        assert y["loss/policy"] == pytest.approx(x["loss/policy"], abs=1e-4)
        assert y["entropy"] == pytest.approx(x["entropy"], abs=1e-4)
        assert y["engine/weight_syncs"] >= 1 and y["engine/server_failures"] == 0
    pids = [s["pid"] for s in json.loads((tmp_path / "remote" / "engine" / "servers.json").read_text())]
    assert_gone(pids, timeout=1.0)  # stopped by the run itself, before it returned
    folders = sorted(p.name for p in (tmp_path / "remote" / "engine" / "weights").iterdir())
    assert folders == ["v2", "v3"]  # engine.keep_weights=2


def test_killing_the_only_server_ends_the_run_with_one_line(tmp_path):
    """Also: the token in $SEEKRL_TEST_ENGINE_TOKEN (engine.token_env) guards the started server."""
    run = tmp_path / "dies"
    env = {**os.environ, "SEEKRL_TEST_ENGINE_TOKEN": "t0ken"}
    proc = subprocess.Popen(train_cmd(tmp_path, "dies", "train.steps=500", "engine.servers=1", "engine.timeout_s=20",
                                      "engine.token_env=SEEKRL_TEST_ENGINE_TOKEN"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        pids = server_pids(run)
        wait_steps(proc, run, 2)
        url = json.loads((run / "engine" / "servers.json").read_text())[0]["url"]
        assert httpx.get(url + "/model_info", timeout=10).status_code == 401
        assert httpx.get(url + "/model_info", headers={"Authorization": "Bearer t0ken"}, timeout=10).json()["weight_version"] >= 1
        assert "t0ken" not in (run / "config.yaml").read_text()  # the secret stays out of the saved config
        os.kill(pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=20 + 60)
        assert time.monotonic() - t0 < 20 + 60
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert lines[-1].startswith("seekrl: error: engine server http://127.0.0.1:") and "unreachable" in lines[-1]


def test_one_of_two_servers_dies_and_the_run_goes_on(tmp_path):
    run = tmp_path / "half"
    proc = subprocess.Popen(train_cmd(tmp_path, "half", "train.steps=8", "engine.servers=2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = server_pids(run)
        wait_steps(proc, run, 2)
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    m = metrics(run)
    assert len(m) == 8 and m[-1]["engine/server_failures"] == 1.0 and m[-1]["engine/servers_alive"] == 1.0
    assert_gone(pids)


def test_sigterm_to_the_trainer_leaves_no_server_behind(tmp_path):
    run = tmp_path / "term"
    proc = subprocess.Popen(train_cmd(tmp_path, "term", "train.steps=500", "engine.servers=2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = server_pids(run)
        wait_steps(proc, run, 1)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert_gone(pids)


def test_a_server_that_cannot_start_is_one_line(tmp_path):
    """SGLang is not installed here: its server exits at once, and the run says so in one line
    with the last line of the server's log (and leaves nothing running)."""
    r = subprocess.run(train_cmd(tmp_path, "nosglang", "train.steps=1", "engine.servers=1", "engine.server_kind=sglang"),
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[-1].startswith("seekrl: error: engine server http://127.0.0.1:") and "before it answered /health" in lines[-1]
    assert "sglang" in lines[-1] and "server_0.log" in lines[-1]
    pids = [s["pid"] for s in json.loads((tmp_path / "nosglang" / "engine" / "servers.json").read_text())]
    assert_gone(pids, timeout=1.0)


def test_seekrl_eval_on_a_started_server_equals_eval_in_process(tmp_path):
    """`seekrl eval` builds the same engine as `seekrl train`: on one started server the metrics are
    those of the in-process evaluation (greedy, same weights), and the server is stopped after."""
    common = [sys.executable, "-m", "seekrl", "eval", str(ROOT / "examples" / "tiny_grpo.yaml"), "model.tiny_hidden=64",
              "data.eval=tiny:copy:test", "data.max_eval=16", "log.progress=false", f"log.dir={tmp_path}"]
    local = subprocess.run([*common, "log.name=local"], capture_output=True, text=True, timeout=300)
    remote = subprocess.run([*common, "log.name=remote", "engine.servers=1"], capture_output=True, text=True, timeout=300)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    a = json.loads((tmp_path / "local" / "eval" / "eval.json").read_text())
    b = json.loads((tmp_path / "remote" / "eval" / "eval.json").read_text())
    assert a["eval/count"] == b["eval/count"] == 16

    def scores(m):  # every score; not the times, nor the process's memory (memory/peak_rss_gib)
        return {k: v for k, v in m.items() if k.startswith("eval/") and not k.startswith("eval/time")}

    assert scores(a) == pytest.approx(scores(b), abs=1e-9) and len(scores(a)) > 5
    pids = [s["pid"] for s in json.loads((tmp_path / "remote" / "eval" / "engine" / "servers.json").read_text())]
    assert_gone(pids, timeout=1.0)


def test_a_hung_server_times_out_and_ends_the_run_with_one_line(tmp_path):
    """A server that stops answering (SIGSTOP) is a dead server after engine.timeout_s: the run
    ends with one line naming it, no hang; the stopped process is killed on the way out."""
    run = tmp_path / "hung"
    proc = subprocess.Popen(train_cmd(tmp_path, "hung", "train.steps=500", "engine.servers=1", "engine.timeout_s=3",
                                       "engine.weight_sync_timeout_s=3"),  # the hang may land in a weight sync
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = server_pids(run)
        wait_steps(proc, run, 2)
        os.kill(pids[0], signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=3 + 60)
        assert time.monotonic() - t0 < 3 + 60
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "unreachable" in lines[-1] and ("engine.timeout_s=3" in lines[-1] or "engine.weight_sync_timeout_s=3" in lines[-1])
    assert_gone(pids)
