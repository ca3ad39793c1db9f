"""Asynchronous rollout: the admission rule and its staleness bound, interruptible generation, and
async training runs (rollout/executor.py, rollout/interrupt.py, train/offpolicy.py).

The executor tests drive AsyncRollout with a simulated engine whose episodes have long-tailed
lengths and whose tokens are a function of (seed, position), so a turn continued after a cut must
give exactly the tokens of an uncut one. The interruption tests cut real LocalEngine episodes of
a multi-turn search workflow at random moments and compare them with uncut ones.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seekrl.config import ConfigError, load_config
from seekrl.data.iterator import TaskIterator
from seekrl.engines.base import text_decoder
from seekrl.engines.local import LocalEngine
from seekrl.jobs import train
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import reproducible, undocumented
from seekrl.rewards.rubric import Rubric
from seekrl.rollout import episode_params, stable_seed
from seekrl.rollout.executor import AsyncRollout, staleness
from seekrl.rollout.interrupt import InterruptibleEngine, _stop_across
from seekrl.tools import ToolExecutor, ToolRegistry, get_format, tool
from seekrl.types import Completion, SamplingParams, Task, Trajectory, TrajectoryGroup
from seekrl.workflows.tool_agent import ToolAgentWorkflow

ROOT = Path(__file__).resolve().parents[2]


# ---- a simulated engine ------------------------------------------------------------------------
def _length(seed: int) -> int:
    """Tokens of an episode: most are short, one in eight is 8x longer (a long tail)."""
    r = random.Random(seed)
    return r.randint(3, 8) * (8 if r.random() < 0.125 else 1)


def _token(seed: int, pos: int) -> int:
    return stable_seed(seed, pos) % 1000


class SimEngine:
    """Samples `_length(seed)` tokens, one per `delay` seconds; token i is `_token(seed, i)`, so a
    continued request (seed_offset = tokens already sampled) gives what an uncut one would.
    pause("abort") ends every request in flight with its tokens so far."""

    def __init__(self, delay: float = 0.001):
        self.version, self.delay = 0, delay
        self._cut = 0
        self._go = asyncio.Event()
        self._go.set()
        self.in_flight = self.max_in_flight = 0

    async def generate(self, prompt_ids, params, *, rid=None):
        await self._go.wait()
        cut, total = self._cut, _length(params.seed)
        toks, vers = [], []
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for pos in range(params.seed_offset, total):
                if len(toks) >= params.max_new_tokens:
                    return Completion(toks, [-1.0] * len(toks), "length", vers[0], vers)
                await asyncio.sleep(self.delay)
                if self._cut != cut:
                    return Completion(toks, [-1.0] * len(toks), "abort", vers[0] if vers else self.version, vers or None)
                toks.append(_token(params.seed, pos))
                vers.append(self.version)
            return Completion(toks, [-1.0] * len(toks), "stop", vers[0] if vers else self.version, vers or None)
        finally:
            self.in_flight -= 1

    def pause(self, mode="hold"):
        if mode == "abort":
            self._cut += 1
        self._go.clear()

    def resume(self):
        self._go.set()

    async def update_weights(self, source, version):
        await asyncio.sleep(self.delay)
        self.version = version


class SimWorkflow:
    params = SamplingParams(max_new_tokens=1000, temperature=1.0)

    def prompt_ids(self, task):
        return [1, 2, 3]

    def close(self):
        pass

    async def run(self, task, engine, n, params=None):
        async def one(p):
            c = await engine.generate([1, 2, 3], p)
            t = Trajectory(task=task, prompt_ids=[1, 2, 3], completion_ids=[], loss_mask=[], logprobs=[], versions=[])
            t.append(c.token_ids, sampled=True, logprobs=c.logprobs, version=c.token_versions())
            t.metrics["seed"] = float(p.seed)
            return t

        trajs = await asyncio.gather(*(one(p) for p in episode_params(params, task, n)))
        return TrajectoryGroup(task, list(trajs))


TASKS = [Task(id=f"t{i}", prompt=[{"role": "user", "content": str(i)}], answer="x") for i in range(40)]


def _drive(eta: int, steps: int, B: int = 4, G: int = 2, max_concurrent: int | None = None, start: int = 0, train_s: float = 0.004):
    """Run the trainer's side against AsyncRollout on SimEngine; return per-step records."""
    admitted = []

    async def main():
        engine = SimEngine()
        it = TaskIterator(TASKS, B, seed=0)
        ex = AsyncRollout(SimWorkflow(), engine, it, SimWorkflow.params, group_size=G, tasks_per_step=B, max_staleness=eta,
                          max_concurrent=max_concurrent or B * G, seed=7)
        admit = ex._admit

        def recording_admit():  # the rule holds at every admission
            admitted.append((ex.next_index, ex.version, ex.running))
            admit()

        ex._admit = recording_admit
        await ex.publish(None, start)
        ex.start(start)
        out = []
        try:
            for step in range(start + 1, start + steps + 1):
                batch = await ex.next_batch(step)
                out.append((step, batch, ex.data_state(step)))
                await asyncio.sleep(train_s)  # the update
                await ex.publish(None, step)
        finally:
            await ex.aclose()
        return out, engine, ex

    return (*asyncio.run(main()), admitted)


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_staleness_is_bounded_at_admission_and_nothing_is_lost(eta):
    B, G, steps = 4, 2, 12
    out, engine, ex, admitted = _drive(eta, steps, B, G)
    # the admission rule: index k < (eta + version + 1) * B, and at most max_concurrent / G groups in flight
    for k, version, running in admitted:
        assert k < (eta + version + 1) * B and running < B
    assert engine.max_in_flight <= B * G
    # every batch: staleness within the bound, in the data order of the sync loop, nothing twice
    order = TaskIterator(TASKS, B, seed=0)
    worst = []
    for step, batch, _ in out:
        assert [g.task.id for g in batch.groups] == [t.id for t in order.next_batch()]
        mean, top = staleness(batch.groups, step - 1)
        assert batch.metrics["rollout/staleness/max"] == top <= eta
        worst.append(top)
        for g in batch.groups:  # each episode: exactly the tokens of an uncut one (cut turns continued)
            for t in g.trajectories:
                seed = int(t.metrics["seed"])
                assert t.completion_ids == [_token(seed, i) for i in range(_length(seed))]
                assert t.versions == sorted(t.versions) and min(t.versions) >= step - 1 - eta
    if eta == 0:
        assert worst == [0.0] * steps and sum(b.metrics["rollout/interrupted"] for _, b, _ in out) == 0
    else:
        assert max(worst) > 0
        assert sum(b.metrics["rollout/interrupted"] for _, b, _ in out) > 0
        assert any(len(set(t.versions)) > 1 for _, b, _ in out for g in b.groups for t in g.trajectories)


def test_resumed_executor_keeps_the_bound_and_the_data_order():
    """start(step) after a restore: accepted = step * B, so the bound and the data order continue."""
    B, eta = 4, 2
    first, _, _, _ = _drive(eta, 5, B)
    saved = first[2][2]  # the data position after step 3
    out = []

    async def main():
        it = TaskIterator(TASKS, B, seed=0)
        it.load_state_dict(saved)
        ex = AsyncRollout(SimWorkflow(), SimEngine(), it, SimWorkflow.params, group_size=2, tasks_per_step=B, max_staleness=eta, max_concurrent=8, seed=7)
        await ex.publish(None, 3)
        ex.start(3)
        try:
            for step in (4, 5, 6):
                out.append(await ex.next_batch(step))
                await ex.publish(None, step)
        finally:
            await ex.aclose()

    asyncio.run(main())
    assert [g.task.id for g in out[0].groups] == [g.task.id for g in first[3][1].groups]
    assert [g.task.id for g in out[1].groups] == [g.task.id for g in first[4][1].groups]
    assert all(b.metrics["rollout/staleness/max"] <= eta for b in out)


def test_max_concurrent_limits_episodes_in_flight():
    out, engine, _, admitted = _drive(3, 6, B=4, G=2, max_concurrent=4)
    assert engine.max_in_flight <= 4 and all(running < 2 for _, _, running in admitted)


def test_an_episode_error_reaches_the_trainer():
    class Broken(SimWorkflow):
        async def run(self, task, engine, n, params=None):
            if task.id == TASKS[5].id:
                raise RuntimeError("the retriever is down")
            return await super().run(task, engine, n, params)

    async def main():
        it = TaskIterator(TASKS, 4, seed=0)
        ex = AsyncRollout(Broken(), SimEngine(), it, SimWorkflow.params, group_size=2, tasks_per_step=4, max_staleness=1, max_concurrent=8, seed=0)
        ex.start(0)
        try:
            for step in range(1, 11):
                await ex.next_batch(step)
                await ex.publish(None, step)
        finally:
            await ex.aclose()

    with pytest.raises(RuntimeError, match="retriever is down"):
        asyncio.run(main())


# ---- interruptible generation on a real engine ---------------------------------------------------
TASK = Task(id="q0", prompt=[{"role": "user", "content": "Question: what is the capital of France?"}], answer="Paris")
EPISODE = "<search> capital of France </search>\n\n<information>Doc 1(Title: France) Paris.</information>\n\n<answer> Paris </answer>"


@pytest.fixture(scope="module")
def searching_model(tiny_tokenizer, tiny_model):
    """The tiny model, trained a few hundred steps on one search episode, so that sampling at
    temperature 1 writes search calls and the episodes have several turns."""
    model = copy.deepcopy(tiny_model).train()
    wf = _workflow(tiny_tokenizer)
    ids = wf.prompt_ids(TASK) + tiny_tokenizer.encode(EPISODE, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    x = torch.tensor([ids])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(150):
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _workflow(tokenizer, trajectory: str = "prefix"):
    @tool(timeout_s=1.0)
    async def search(query: str) -> str:
        """Search the corpus.

        Args:
            query: the query.
        """
        return "Doc 1(Title: France) Paris."

    return ToolAgentWorkflow(tokenizer, SamplingParams(max_new_tokens=24, temperature=1.0), Rubric(["qa_em"]), get_format("search_r1"),
                             ToolExecutor(ToolRegistry([search])), max_turns=3, max_obs_tokens=48, max_total_tokens=200,
                             trajectory=trajectory)


@pytest.mark.parametrize("cut_seed, trajectory", [(0, "prefix"), (1, "prefix"), (2, "prefix"), (3, "prefix"), (0, "stepwise"), (1, "stepwise")])
def test_cut_episodes_equal_uncut_ones(tiny_tokenizer, searching_model, cut_seed, trajectory):
    """Weight updates (the same weights) at random moments cut the turns in flight; the assembled
    ids, loss mask and log-probs equal the uncut episodes with the same per-request seeds. In the
    stepwise layout a cut turn is still one sample: the prompt the workflow gave, all its tokens."""
    wf = _workflow(tiny_tokenizer, trajectory)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=1234 + cut_seed)

    async def uncut():
        return await wf.run(TASK, LocalEngine(searching_model, tiny_tokenizer, seed=0), 8, params)

    async def cut():
        engine = InterruptibleEngine(LocalEngine(searching_model, tiny_tokenizer, seed=99), text_decoder(tiny_tokenizer))
        rng = random.Random(cut_seed)
        run = asyncio.ensure_future(wf.run(TASK, engine, 8, params))
        version = 0
        while not run.done() and version < 12:  # a cut before a turn samples anything would only delay it
            await asyncio.sleep(rng.uniform(0.002, 0.02))
            version += 1
            await engine.update_weights(searching_model, version)
        await asyncio.wait_for(run, 60)
        return run.result(), engine.interrupted

    ref = asyncio.run(uncut())
    got, interrupted = asyncio.run(cut())
    assert interrupted > 0
    assert max(t.metrics["turns"] for t in ref.trajectories) >= 2, "the episodes should have several turns"
    spans = 0
    for a, b in zip(ref.trajectories, got.trajectories):
        assert b.completion_ids == a.completion_ids
        assert b.loss_mask == a.loss_mask
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5)
        assert b.finish_reason == a.finish_reason and b.reward == a.reward
        assert all(v == -1 for v, m in zip(b.versions, b.loss_mask) if not m)  # inserted tokens
        sampled = [v for v, m in zip(b.versions, b.loss_mask) if m]
        assert sampled == sorted(sampled)
        spans += len(set(sampled)) > 1
        assert b.turn_spans == a.turn_spans and b.turn_prompts == a.turn_prompts
    assert spans > 0, "some episode should hold tokens of several versions"
    if trajectory == "stepwise":
        from seekrl.train.batch import TokenBatch

        cut_rows, uncut_rows = TokenBatch.from_trajectories(got.trajectories), TokenBatch.from_trajectories(ref.trajectories)
        assert len(cut_rows) == sum(len(t.turn_spans) for t in ref.trajectories) > len(ref.trajectories)
        assert cut_rows.prompt_ids == uncut_rows.prompt_ids and cut_rows.completion_ids == uncut_rows.completion_ids
        assert torch.equal(cut_rows.loss_mask_BC, uncut_rows.loss_mask_BC)
        assert torch.allclose(cut_rows.behav_logp_BC, uncut_rows.behav_logp_BC, atol=1e-5)


def test_a_stop_string_across_the_cut_ends_the_turn(tiny_tokenizer):
    enc = lambda s: tiny_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    decode = text_decoder(tiny_tokenizer)
    before = enc("<search> capital of France </sea")
    new = enc("rch> and more text")
    keep = _stop_across(decode, before, new, ("</search>",))
    assert keep is not None and "</search>" in decode(before + new[:keep]) and "</search>" not in decode(before + new[: keep - 1])
    assert _stop_across(decode, enc("<search> capital"), enc(" of France"), ("</search>",)) is None


def test_loglinear_weights_by_version():
    """α = (v - v_b) / (v + 1 - v_b): 0 for fresh and inserted tokens, towards 1 as tokens age."""
    from seekrl.train.offpolicy import loglinear_alpha

    assert loglinear_alpha([5, 4, 3, 1, -1], trained_version=5) == [0.0, 0.5, 2 / 3, 0.8, 0.0]


# ---- training runs -------------------------------------------------------------------------------
def tiny_cfg(tmp_path, name, *overrides):
    base = [
        "model.path=tiny", "model.tiny_hidden=64", "model.max_context=64", "data.train=tiny:copy", "data.max_train=64",
        "rollout.group_size=4", "rollout.batch_size=32", "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=32",
        "reward.functions=[qa_f1]", "train.lr=1e-3", "train.warmup_steps=2", "train.steps=6", f"log.dir={tmp_path}",
        f"log.name={name}", "log.progress=false", "log.tensorboard=false",
    ]
    return load_config(None, base + list(overrides))


ASYNC_METRICS = ("rollout/staleness/mean", "rollout/staleness/max", "rollout/interrupted", "rollout/queue", "time/wait_s",
                 "actor/behav_imp_weight/mean", "actor/behav_cap_frac")


def _comparable(rows):
    return [{k: v for k, v in reproducible(r).items() if k != "rollout/queue"} for r in rows]


def test_async_with_zero_staleness_gives_the_sync_results(tmp_path):
    sync = read_metrics(train(tiny_cfg(tmp_path, "sync")))
    run = train(tiny_cfg(tmp_path, "async", "rollout.mode=async", "rollout.max_staleness=0"))
    assert load_config(run / "config.yaml").algo.decoupled is True  # the async default, resolved in the saved config
    rows = read_metrics(run)
    assert _comparable(rows) == _comparable(sync)
    for r in [r for r in sync if r["step"] > 0]:  # the async metrics exist in sync mode too
        assert all(k in r for k in ASYNC_METRICS)
        assert r["rollout/staleness/max"] == r["rollout/interrupted"] == r["rollout/queue"] == 0.0
        assert r["actor/behav_imp_weight/mean"] == 1.0 and r["actor/behav_cap_frac"] == 0.0


@pytest.mark.parametrize("extra", [[], ["algo.prox_logp=loglinear", "algo.behav_imp_cap=1.5"], ["algo.decoupled=false"],
                                   ["algo.name=ppo", "train.critic_lr=1e-3", "train.minibatches=2"]])
def test_async_training_keeps_the_bound_and_overlaps(tmp_path, extra):
    run = train(tiny_cfg(tmp_path, "a", "rollout.mode=async", "rollout.max_staleness=1", "train.steps=10",
                         "rollout.max_concurrent=64", *extra))
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert all(r["rollout/staleness/max"] <= 1 for r in rows)
    assert max(r["rollout/staleness/max"] for r in rows) == 1
    assert all(r["rollout/staleness/mean"] <= r["rollout/staleness/max"] for r in rows)
    for r in rows:
        assert all(k in r for k in ASYNC_METRICS)
        assert undocumented(r) == []
    if "algo.decoupled=false" in extra:
        assert all(r["actor/behav_imp_weight/mean"] == 1.0 for r in rows)
    else:  # stale tokens get a weight that is not exactly 1
        assert any(r["actor/behav_imp_weight/mean"] != 1.0 for r in rows)
        assert all(0.0 <= r["actor/behav_cap_frac"] <= 1.0 for r in rows)


def test_async_on_started_servers_interrupts_and_continues_turns(tmp_path):
    """Two `seekrl serve engine` servers: a weight update pauses them with abort, the turns come
    back with their tokens so far and continue on the new weights."""
    run = train(tiny_cfg(tmp_path, "srv", "rollout.mode=async", "rollout.max_staleness=2", "engine.servers=2",
                         "rollout.max_new_tokens=24", "rollout.max_prompt_tokens=32", "train.steps=5", "data.max_eval=8"))
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    assert all(r["rollout/staleness/max"] <= 2 for r in rows) and max(r["rollout/staleness/max"] for r in rows) > 0
    assert rows[-1]["engine/servers_alive"] == 2.0 and rows[-1]["engine/server_failures"] == 0.0
    assert rows[-1]["engine/weight_syncs"] >= 5


def test_killed_async_run_resumes_without_training_an_episode_twice(tmp_path):
    """SIGKILL mid-run; the resumed run trains each step's tasks of the data order exactly once."""
    config = tmp_path / "killed.yaml"
    overrides = ["rollout.mode=async", "rollout.max_staleness=2", "train.steps=8", "train.save_every=2", "log.samples_every=1",
                 "log.samples_groups=100", "data.max_eval=8"]
    config.write_text(tiny_cfg(tmp_path, "killed", *overrides).to_yaml())
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "seekrl", "train", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = tmp_path / "killed" / "checkpoints"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (ckpts / "step_4").is_dir():
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    done = [r["step"] for r in read_metrics(tmp_path / "killed") if r["step"] > 0]
    assert 4 <= len(done) < 8, done
    run = train(load_config(config))
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(r["rollout/staleness/max"] <= 2 for r in rows)
    # the tasks of step s are the s-th batch of the data order, in the killed and the resumed run alike
    sync = train(tiny_cfg(tmp_path, "order", "train.steps=8", "log.samples_every=1", "log.samples_groups=100", "data.max_eval=8"))

    def tasks(folder, step):
        lines = (folder / "trajectories" / f"step_{step}.jsonl").read_text().splitlines()
        for record in map(json.loads, lines):  # written with the versions that sampled it: within the bound
            assert record["policy_versions"] and min(record["policy_versions"]) >= step - 1 - 2
        return [json.loads(x)["task_id"] for x in lines]

    for step in range(1, 9):
        assert tasks(run, step) == tasks(sync, step), step


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rollout.mode=later", "rollout.mode: 'later' is not one of sync, async"),
        ("rollout.max_staleness=-1", "rollout.max_staleness: must be >= 0"),
        ("rollout.max_concurrent=2", "rollout.max_concurrent (2) must be at least rollout.group_size (4)"),
        ("algo.prox_logp=exact", "algo.prox_logp: 'exact' is not one of recompute, loglinear"),
        ("algo.behav_imp_cap=0", "algo.behav_imp_cap: must be > 0"),
        ("algo.behav_imp_cap=5", "algo.behav_imp_cap caps decoupled PPO's behaviour weight"),
    ],
)
def test_async_config_errors(tmp_path, override, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        tiny_cfg(tmp_path, "bad", override)
