"""Trainer ranks under torchrun (gloo on CPU): exact against one process, resumable N -> M, no hang.

Each test starts `torchrun --nproc-per-node 2` as a subprocess in its own process group, with a
timeout, and kills the group on any failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = str(ROOT / "examples" / "tiny_grpo.yaml")
KEYS = ("reward/mean", "loss/policy", "grad_norm/policy", "entropy")
pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a command in its own process group; kill the whole group on timeout."""
    p = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, "")


def torchrun(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(_free_port()), *args], cwd, timeout)


def _free_port() -> int:
    from seekrl.engines.launch import free_port

    return free_port()


def train(cwd: Path, ranks: int, *overrides: str) -> None:
    args = ["-m", "seekrl", "train", TINY, "log.progress=false", "data.max_eval=8", *overrides]
    r = torchrun(args, cwd) if ranks > 1 else run([sys.executable, *args], cwd)
    assert r.returncode == 0, r.stdout[-4000:]


def metrics(cwd: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (cwd / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def assert_same(a: list[dict], b: list[dict], steps: list[int], keys=KEYS, tol: float = 1e-4) -> None:
    rows_a, rows_b = {r["step"]: r for r in a}, {r["step"]: r for r in b}
    for s in steps:
        for k in keys:
            assert abs(rows_a[s][k] - rows_b[s][k]) <= tol, f"step {s} {k}: {rows_a[s][k]} vs {rows_b[s][k]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """GRPO on examples/tiny_grpo.yaml, 5 steps: one process; 2 ranks; 2 ranks for 2 steps then
    one process; one process for 2 steps then 2 ranks."""
    cwd = tmp_path_factory.mktemp("dist")
    five = "train.steps=5"
    train(cwd, 1, five, "log.name=one")
    train(cwd, 2, five, "log.name=two")
    train(cwd, 2, five, "log.name=two_one", "train.max_steps_this_run=2")
    train(cwd, 1, five, "log.name=two_one")
    train(cwd, 1, five, "log.name=one_two", "train.max_steps_this_run=2")
    train(cwd, 2, five, "log.name=one_two")
    return cwd


def test_two_ranks_equal_one_process(runs):
    one, two = metrics(runs, "one"), metrics(runs, "two")
    assert [r["step"] for r in two] == [0, 1, 2, 3, 4, 5]  # only rank 0 logs: one row per step
    assert_same(one, two, [1, 2, 3, 4, 5])
    assert one[-1]["reward/mean"] != one[1]["reward/mean"]  # it trained (the comparison is not of constants)
    ckpt = runs / "runs" / "two" / "checkpoints" / "step_5"
    assert (ckpt / "optimizer_dcp" / ".metadata").is_file() and not (ckpt / "optimizer.json").exists()
    shards = sorted(p.name for p in (ckpt / "optimizer_dcp").glob("*.distcp"))
    assert len(shards) == 2  # each rank wrote its shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt / "model")  # the gathered model loads as it is
    ref = load_file(str(runs / "runs" / "one" / "checkpoints" / "step_5" / "model" / "model.safetensors"))
    for name, p in model.state_dict().items():
        if name in ref:
            # atol: float rounding of other micro-batch shapes (rows split over ranks, and the rows
            # train.skip_zero_advantage leaves out), grown by 5 AdamW steps at lr up to 1e-3: about 2e-5
            # measured, against ~3e-3 of movement; a lost micro-batch or a wrong scale moves ~1e-3
            assert torch.allclose(p, ref[name], atol=1e-4), name


def test_resume_two_ranks_on_one_and_one_on_two(runs):
    one = metrics(runs, "one")
    for name in ("two_one", "one_two"):
        rows = metrics(runs, name)
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5], name
        assert_same(one, rows, [3, 4, 5])  # optimizer state, data order and RNG restored across 2 <-> 1


def test_ppo_with_reference_two_ranks_equal_one_process(tmp_path):
    """Critic (sharded, its optimizer sharded too) and the KL reference model over 2 ranks."""
    common = ("algo.name=ppo", "algo.kl_coef=0.05", "train.steps=2", "rollout.batch_size=32", "data.eval=")
    train(tmp_path, 1, *common, "log.name=one")
    train(tmp_path, 2, *common, "log.name=two")
    keys = (*KEYS, "loss/value", "grad_norm/critic", "loss/kl")
    assert_same(metrics(tmp_path, "one"), metrics(tmp_path, "two"), [1, 2], keys)
    assert (tmp_path / "runs" / "two" / "checkpoints" / "step_2" / "critic_optimizer_dcp" / ".metadata").is_file()


def test_async_rollout_on_two_ranks(tmp_path):
    """rollout.mode=async on rank 0 (episodes run while the ranks update) keeps the staleness bound."""
    train(tmp_path, 2, "train.steps=5", "data.eval=", "rollout.mode=async", "rollout.max_staleness=1", "log.name=a")
    rows = metrics(tmp_path, "a")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert max(r["rollout/staleness/max"] for r in rows) == 1.0  # reached, never exceeded
    assert all(r["grad_norm/policy"] > 0 for r in rows)


def test_gradients_equal_on_a_fixed_batch(tmp_path):
    """Policy and critic gradients of one update (micro-batches of unequal count per rank, dummies
    included) equal the one-process gradients within 1e-5, and so do the logged statistics: FSDP2
    with token-mean and sequence-mean aggregation, and train.fsdp=none."""
    worker = str(ROOT / "tests" / "fixtures" / "dist" / "grad_worker.py")
    variants = ["full:token-mean", "full:seq-mean-token-mean", "none:token-mean"]
    for name, launch in (("one", lambda argv: run([sys.executable, *argv], tmp_path)), ("two", lambda argv: torchrun(argv, tmp_path))):
        (tmp_path / name).mkdir()
        r = launch([worker, str(tmp_path / name), *variants])
        assert r.returncode == 0, r.stdout[-3000:]
    for v in variants:
        f = v.replace(":", "_") + ".safetensors"
        one, two = load_file(str(tmp_path / "one" / f)), load_file(str(tmp_path / "two" / f))
        assert set(one) == set(two) and any(k.startswith("v.") for k in one)
        for k in one:
            assert torch.allclose(one[k], two[k], atol=1e-5, rtol=0), (v, k)
        assert sum(float(g.abs().sum()) for g in one.values()) > 0
        m1, m2 = (safe_open(str(tmp_path / d / f), "pt").metadata() for d in ("one", "two"))
        assert m1.keys() == m2.keys()
        for k in m1:
            assert abs(float(m1[k]) - float(m2[k])) <= 1e-5, (v, k, m1[k], m2[k])


def test_hybrid_sharding_two_nodes_of_one_rank(tmp_path):
    """train.fsdp=hybrid over 2 "nodes" of one rank each (LOCAL_WORLD_SIZE=1): a 2-D (replicate,
    shard) mesh; the gradients equal one process's."""
    worker = str(ROOT / "tests" / "fixtures" / "dist" / "grad_worker.py")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    assert run([sys.executable, worker, str(tmp_path / "one"), "full:token-mean"], tmp_path).returncode == 0
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, worker, str(tmp_path / "two"), "hybrid:token-mean"], cwd=tmp_path,
                              env={**_env(), "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    assert all(p.returncode == 0 for p in procs), outs[0][-2000:]
    one = load_file(str(tmp_path / "one" / "full_token-mean.safetensors"))
    two = load_file(str(tmp_path / "two" / "hybrid_token-mean.safetensors"))
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-5, rtol=0), k


def _children(pid: int) -> list[int]:
    out = []
    for task in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((task / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(task.name))
    return out


def _rank_of(pid: int) -> str | None:
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RANK=")), None)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stuck"])
def test_dead_or_stuck_rank_ends_the_job(tmp_path, sig):
    """SIGKILL one rank mid-run, or stop it (a hang): the job ends with a line naming the failed rank,
    a stuck one within train.dist_timeout_s, and no process is left."""
    argv = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(_free_port()), "-m", "seekrl", "train", TINY,
            "log.progress=false", "data.eval=", "train.steps=10000", "train.dist_timeout_s=15", "log.name=kill"]
    p = subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        log = tmp_path / "runs" / "kill" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count("\n") >= 2):
            assert p.poll() is None and time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.5)
        ranks = {_rank_of(pid): pid for pid in _children(p.pid)}
        assert set(ranks) == {"0", "1"}, ranks
        os.kill(ranks["1"], sig)
        t0 = time.monotonic()
        out, _ = p.communicate(timeout=120)
        took = time.monotonic() - t0
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    assert p.returncode != 0
    if sig == signal.SIGKILL:
        assert "rank      : 1" in out and "SIGKILL" in out, out[-3000:]  # torchrun's failure summary names rank 1
    else:  # rank 0's collective times out: its one line, then torchrun stops the stuck rank
        assert "seekrl: error: rank 0 of 2 failed:" in out, out[-3000:]
        assert took < 15 + 60, took
    assert not [pid for pid in ranks.values() if _alive(pid)]  # rank 0 stopped too: nothing left behind


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
