"""`collect`'s `max_in_flight` (evals and curriculum measurements on the in-process engine with the
KV store: build.eval_in_flight): at most that many episodes run at once, whole groups; the groups
come back in task order; None runs every task at once."""

from __future__ import annotations

import asyncio

from seekrl.build import eval_in_flight
from seekrl.config import load_config
from seekrl.rollout import collect
from seekrl.types import Task, TrajectoryGroup


class _Counting:
    """A workflow that only counts the episodes running at once."""

    def __init__(self):
        self.now = self.most = 0

    async def run(self, task, engine, n, params):
        self.now += n
        self.most = max(self.most, self.now)
        await asyncio.sleep(0.001 * (int(task.id) % 3))
        self.now -= n
        return TrajectoryGroup(task, [])


def _tasks(k):
    return [Task(id=str(i), prompt=[{"role": "user", "content": f"q{i}"}], answer="a") for i in range(k)]


def test_max_in_flight_bounds_the_episodes_and_keeps_the_order():
    for limit, n, most in ((8, 4, 8), (6, 4, 4), (2, 4, 4), (None, 4, 4 * 20)):
        wf = _Counting()
        groups = asyncio.run(collect(wf, None, _tasks(20), n, max_in_flight=limit))
        assert [g.task.id for g in groups] == [str(i) for i in range(20)]
        assert wf.most == most, (limit, n, wf.most)


def test_eval_in_flight_is_one_engine_batch_with_the_kv_store_only():
    assert eval_in_flight(load_config(None, ["rollout.reuse_kv_tokens=1000", "rollout.engine_batch_size=48"])) == 48
    assert eval_in_flight(load_config(None, ["rollout.reuse_kv_tokens=0"])) is None
    assert eval_in_flight(load_config(None, ["rollout.reuse_kv_tokens=1000", "engine.kind=remote",
                                             "engine.urls=[http://127.0.0.1:1]"])) is None


def test_the_rl_loops_eval_takes_the_same_bound(tmp_path):
    """`eval.every`'s eval runs on the training engine and its KV store: the same bound as `seekrl eval`."""
    from seekrl.build import build_rl

    for extra, want in ((["rollout.reuse_kv_tokens=1000", "rollout.engine_batch_size=16"], 16), ([], None)):
        cfg = load_config("examples/tiny_grpo.yaml", [f"log.dir={tmp_path}", f"log.name=r{len(extra)}", "log.progress=false",
                                                      "train.steps=1", *extra])
        run = build_rl(cfg)
        try:
            assert run.eval_in_flight == want
        finally:
            run.close()
