"""`seekrl launch` on a local Ray, as a user runs it: trainer rank and engine server actors, the run
folder of `seekrl train`, one line when a rank fails, and nothing left running after.

Every process the launch starts (Ray's own, its actors, the engine servers they start) inherits
the environment, so a marker variable set for the launch finds them all in /proc afterwards.
The config checks need no Ray; the rest is marked `ray` and skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from seekrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
HAS_RAY = importlib.util.find_spec("ray") is not None
BASE = [
    "cluster.num_cpus=2", "cluster.cpus_per_trainer=1", "cluster.cpus_per_engine=1", "cluster.timeout_s=120",
    "model.tiny_hidden=64", "rollout.batch_size=32", "data.eval=null",
    "log.progress=false", "log.tensorboard=false", "log.samples_every=0", "train.save_every=0",
]


def launch(tmp_path: Path, name: str, *overrides: str, marker: str, popen: bool = False, env: dict | None = None):
    cmd = [sys.executable, "-m", "seekrl", "launch", str(ROOT / "examples" / "tiny_grpo.yaml"), *BASE,
           f"log.dir={tmp_path}", f"log.name={name}", *overrides]
    env = {**os.environ, **(env or {}), "SEEKRL_TEST_LAUNCH": marker}
    if popen:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def wait_for_a_step(proc, run: Path, timeout_s: float = 600) -> None:
    """Until the launched run logged a step (the launch still running), at most `timeout_s`.

    The bound is against a hang, not a speed check: the whole test takes 21-23 s on an idle
    2-core machine, and the first step took over 180 s there beside a training run."""
    deadline = time.monotonic() + timeout_s
    while not metrics(run):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"no step in {timeout_s:g} s"
        time.sleep(0.2)


def marked(marker: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds the marker."""
    needle = f"SEEKRL_TEST_LAUNCH={marker}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def assert_nothing_left(marker: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while left := marked(marker):
        if time.monotonic() > deadline:
            for pid in left:  # do not leave them to the next test
                kill_quietly(pid)
            pytest.fail(f"processes of the launch still running: {left}")
        time.sleep(0.2)


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("seekrl: error:")]


# ---- config errors: before Ray starts (no Ray needed) ---------------------------------------------
@pytest.mark.parametrize("overrides, says", [
    (["cluster.address=somewhere"], "cluster.address: 'somewhere' is not local, auto or ray://host:port"),
    (["cluster.address=auto", "cluster.num_nodes=2", "cluster.trainer_ranks=3"], "must be a multiple of cluster.num_nodes"),
    (["cluster.num_nodes=2", "cluster.trainer_ranks=2"], "a local Ray (cluster.address=local) is one node"),
    (["cluster.engine_servers=1", "engine.servers=1"], "set engine.servers=0"),
    (["cluster.cpus_per_trainer=0"], "cluster.cpus_per_trainer and cluster.gpus_per_trainer are both 0"),
    (["cluster.runtime_env=[pip]"], "cluster.runtime_env"),
    (["cluster.num_cpus=2", "cluster.trainer_ranks=2", "cluster.engine_servers=1"], "= 3 CPUs, but the local Ray has 2"),
    (["cluster.engine_servers=1", "engine.api=vllm", "rollout.top_p=0.9"], "set rollout.top_p=1"),  # the ranks' remote config
])
def test_cluster_config_errors_fail_before_ray_starts(overrides, says, tmp_path, capsys, monkeypatch):
    if HAS_RAY:
        import ray

        monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started on a bad config"))
    code = main(["launch", str(ROOT / "examples" / "tiny_grpo.yaml"), f"log.dir={tmp_path}", *overrides])
    lines = error_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and says in lines[0], lines
    assert not (tmp_path / "tiny_grpo").exists()  # nothing was built


def test_without_ray_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code = main(["launch", str(ROOT / "examples" / "tiny_grpo.yaml"), f"log.dir={tmp_path}", "cluster.num_cpus=1"])
    lines = error_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and "pip install seekrl[ray]" in lines[0], lines


# ---- runs on a local Ray ---------------------------------------------------------------------------
def ray_test(fn):
    return pytest.mark.ray(pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed (pip install seekrl[ray])")(fn))


@ray_test
@pytest.mark.parametrize("address", ["ray://127.0.0.1:{port}", "auto"])
def test_a_cluster_address_nothing_answers_at_is_one_line_at_once(address, tmp_path, capsys, monkeypatch):
    """ray.init alone would retry for many minutes."""
    from seekrl.engines.launch import free_port

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")  # what `auto` finds
    monkeypatch.setenv("RAY_IGNORE_UNHANDLED_ERRORS", "1")  # (launch sets it in this process)
    address = address.format(port=free_port())
    t0 = time.monotonic()
    code = main(["launch", str(ROOT / "examples" / "tiny_grpo.yaml"), f"log.dir={tmp_path}", f"cluster.address={address}"])
    lines = error_lines(capsys.readouterr().err)
    assert code == 1 and len(lines) == 1 and "nothing answers at " in lines[0], lines  # (auto: 127.0.0.1 as the node IP)
    assert time.monotonic() - t0 < 30


@ray_test
def test_a_launch_trains_on_a_placed_engine_server_and_leaves_nothing(tmp_path):
    """Also: the bearer token in $SEEKRL_TEST_LAUNCH_TOKEN (engine.token_env) guards the placed server."""
    marker = uuid.uuid4().hex
    r = launch(tmp_path, "ok", "train.steps=3", "cluster.trainer_ranks=1", "cluster.engine_servers=1",
               "engine.token_env=SEEKRL_TEST_LAUNCH_TOKEN", marker=marker, env={"SEEKRL_TEST_LAUNCH_TOKEN": "s3cret"})
    assert r.returncode == 0, r.stderr
    run = tmp_path / "ok"
    rows = metrics(run)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert rows[-1]["engine/weight_syncs"] >= 3 and rows[-1]["engine/requests"] == 3 * 32  # sampled on the server
    assert rows[-1]["engine/server_failures"] == 0
    saved = (run / "config.yaml").read_text()
    url = json.loads((run / "engine" / "server_0" / "servers.json").read_text())[0]["url"]
    assert "kind: remote" in saved and url in saved  # rank 0 ran with engine.urls = the placed server
    assert "bearer token required" in (run / "engine" / "server_0" / "server_0.log").read_text()
    assert "s3cret" not in saved
    assert (run / "checkpoints" / "step_3").is_dir()
    assert f"run folder: {run}" in r.stderr
    assert_nothing_left(marker)


@ray_test
@pytest.mark.skipif(importlib.util.find_spec("seekrl.parallel.ranks") is None, reason="no multi-rank trainer (seekrl/parallel/)")
def test_two_ranks_meet_at_rank_0s_address_and_train_one_run(tmp_path):
    """Two rank actors with torchrun's variables form one job: one run, each step logged once
    (two independent trainers would log every step twice into the same folder)."""
    marker = uuid.uuid4().hex
    r = launch(tmp_path, "two", "train.steps=2", "cluster.trainer_ranks=2", marker=marker)
    assert r.returncode == 0, r.stderr
    assert [row["step"] for row in metrics(tmp_path / "two")] == [1, 2]
    assert_nothing_left(marker)


@ray_test
def test_a_rank_that_raises_ends_the_launch_with_one_line(tmp_path):
    """The bad row is found when rank 0 loads the data (no engine server: the driver does not
    load the tasks), so the failure comes from inside the actor."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\nnot json\n')
    marker = uuid.uuid4().hex
    t0 = time.monotonic()
    r = launch(tmp_path, "bad", "train.steps=3", f"data.train={bad}", marker=marker)
    assert time.monotonic() - t0 < 120
    lines = error_lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("seekrl: error: trainer rank 0 failed: DataError: ") and "bad.jsonl:2" in lines[0]
    assert "Traceback" not in r.stderr
    assert_nothing_left(marker)


@ray_test
def test_a_rank_that_dies_ends_the_launch_and_stops_the_server(tmp_path):
    marker = uuid.uuid4().hex
    run = tmp_path / "dies"
    proc = launch(tmp_path, "dies", "train.steps=500", "cluster.engine_servers=1", marker=marker, popen=True)
    try:
        wait_for_a_step(proc, run)
        ranks = [pid for pid, cmd in marked(marker).items() if cmd.startswith("ray::TrainerRank")]
        server = json.loads((run / "engine" / "server_0" / "servers.json").read_text())[0]["pid"]
        assert len(ranks) == 1 and server in marked(marker)
        os.kill(ranks[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = error_lines(err)
    assert proc.returncode == 1 and len(lines) == 1, err
    assert lines[0].startswith("seekrl: error: trainer rank 0 failed: its process died"), lines
    assert_nothing_left(marker)


@ray_test
def test_sigterm_to_the_launch_stops_the_job_with_one_line(tmp_path):
    """What scancel does: the launch takes everything down and exits 143."""
    marker = uuid.uuid4().hex
    run = tmp_path / "term"
    proc = launch(tmp_path, "term", "train.steps=500", marker=marker, popen=True)
    try:
        wait_for_a_step(proc, run)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = error_lines(err)
    assert proc.returncode == 143 and lines == ["seekrl: error: terminated (SIGTERM); the job's actors and servers were stopped"], err
    assert_nothing_left(marker)


# ---- pieces without Ray -----------------------------------------------------------------------------
def test_metrics_tail_shows_new_rows_once_and_not_those_before_the_launch(tmp_path):
    from seekrl.cluster.ray_launch import MetricsTail

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "eval/em": 0.1}\n{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')  # a run to resume
    tail = MetricsTail(path)
    assert tail.rows() == []
    tmp = tmp_path / "rewritten"
    tmp.write_text('{"step": 0, "eval/em": 0.1}\n{"step": 1, "a": 1}\n{"step": 2, "a": 2.5}\n{"step": 3')  # resume from 1
    os.replace(tmp, path)
    assert [r["step"] for r in tail.rows()] == [2]  # step 2 logged again; step 3 half-written
    with open(path, "a") as f:
        f.write(', "a": 3}\n')
    assert tail.rows() == [{"step": 3, "a": 3}] and tail.rows() == []


def test_rank_env_is_torchruns_and_shares_a_nodes_gpus():
    from seekrl.cluster.ray_launch import rank_env

    env = rank_env(3, 4, 2, ("10.0.0.1", 29400), [["4"], ["6"]])
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(0, 1, 1, ("h", 1), [[]])  # CPU ranks
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(0, 2, 2, ("h", 1), [["0"], ["0"]])  # half a GPU each: Ray's own


# ---- the Slurm scripts, with srun / scontrol / ray / torchrun / python replaced by stubs ------------
STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
case "$(basename "$0")" in
  srun) while [[ "$1" == -* ]]; do [[ "$1" == -w ]] && shift; shift; done; exec "$@" ;;
  scontrol) printf 'node1\\nnode2\\n' ;;
  hostname) echo 10.1.2.3 ;;
  python) [[ "$1" == -c ]] && { grep -c '^ray start' "$STUB_LOG" || true; } ;;  # Ray nodes alive: the `ray start`s that ran
esac
exit 0
"""


@pytest.mark.parametrize("script", ["ray_cluster.sbatch", "torchrun.sbatch"])
def test_slurm_scripts_parse_and_run_the_right_commands(script, tmp_path):
    path = ROOT / "examples" / "slurm" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "hostname", "ray", "torchrun", "python"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(log), "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2",
           "SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_ID": "77"}
    r = subprocess.run(["bash", str(path), "examples/tiny_grpo.yaml", "train.steps=5"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    if script == "torchrun.sbatch":
        assert ("torchrun --nnodes 2 --nproc-per-node 4 --rdzv-id 77 --rdzv-backend c10d --rdzv-endpoint node1:29500 "
                "-m seekrl train examples/tiny_grpo.yaml train.steps=5") in calls
    else:
        assert "ray start --head --node-ip-address=10.1.2.3 --port=6379 --num-cpus=8 --num-gpus=4 --include-dashboard=false --block" in calls
        assert "ray start --address=10.1.2.3:6379 --num-cpus=8 --num-gpus=4 --block" in calls
        assert ("python -m seekrl launch examples/tiny_grpo.yaml cluster.address=auto cluster.num_nodes=2 train.steps=5"
                in calls)
        assert calls[-1] == "ray stop --force"  # the EXIT trap
