"""train.skip_zero_advantage: the policy update leaves out the rows whose trained tokens all have
advantage 0 and still takes the same step: the rows left out count in the loss's normaliser, a
minibatch with no live row still steps AdamW on a zero gradient, and the loss terms that do not
vanish with the advantage (the KL in the loss, the entropy bonus) keep every row."""

from __future__ import annotations

import pytest
import torch

from seekrl.build import policy_trainer
from seekrl.config import load_config
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.types import Task, Trajectory

from tests.unit.test_nonfinite import _model, _snapshot


def _branch_trajs():
    """3 tasks × 2 episodes × 2 answers read from the episode's history (untrained, shared), as
    `rollout.answer_branches` makes them: 12 rows, rows of one episode share prompt and history."""
    g = torch.Generator().manual_seed(1)
    trajs, group_ids = [], []
    for task in range(3):
        prompt = torch.randint(1, 32, (6,), generator=g).tolist()
        for _ in range(2):
            history = torch.randint(1, 32, (7,), generator=g).tolist()
            for _ in range(2):
                t = Trajectory(Task(str(task), [], ""), list(prompt), [], [], [], [])
                t.append(history, sampled=False)
                answer = torch.randint(1, 32, (3 + task,), generator=g).tolist()
                t.append(answer, sampled=True, logprobs=[-3.0] * len(answer), version=0)
                trajs.append(t)
                group_ids.append(task)
    return trajs, group_ids


def _adv(trajs, live_rows):
    """Advantage ±1 over each trained token of the rows in `live_rows`, 0 elsewhere."""
    out = []
    for i, t in enumerate(trajs):
        n = len(t.completion_ids)
        out.append([(1.0 if i % 3 else -1.0) if i in live_rows else 0.0] * n)
    return out


def _update(trainer, trajs, group_ids, adv, seen=None, ref=None):
    batch = TokenBatch.from_trajectories(trajs, group_ids)
    batch.old_logp_BC, batch.adv_BC = batch.behav_logp_BC, pad_completion(adv, batch.width)
    if ref is not None:
        batch.ref_logp_BC, batch.kl_coef = batch.behav_logp_BC - 0.5, ref
    stats = StatsTracker()
    if seen is not None:
        plan = trainer.plan
        original = type(plan).micro_batches
        type(plan).micro_batches = lambda p, b, idx: (seen.append(list(idx)), original(p, b, idx))[1]
        try:
            trainer.update(batch, stats)
        finally:
            type(plan).micro_batches = original
    else:
        trainer.update(batch, stats)
    return stats.export()


def _pair(overrides):
    """The same model and config with the option on and off."""
    out = []
    for skip in (True, False):
        cfg = load_config(None, ["train.lr=1e-2", "rollout.batch_size=4", "rollout.group_size=2",
                                 "train.micro_batch_tokens=40", f"train.skip_zero_advantage={str(skip).lower()}",
                                 *overrides])
        model = _model()
        out.append((model, policy_trainer(cfg, model, 0, total_steps=10)))
    return out


def _close(a, b):
    return all(torch.allclose(x, y, atol=1e-6, rtol=1e-5) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("overrides", [
    [],
    ["algo.loss_agg=seq-mean-token-mean"],
    ["algo.policy_loss=gspo"],
    ["algo.policy_loss=cispo"],
    ["rollout.batch_size=6", "train.minibatches=3"],
])
def test_leaving_out_zero_advantage_rows_takes_the_same_step(overrides):
    trajs, group_ids = _branch_trajs()
    (m_skip, t_skip), (m_all, t_all) = _pair(overrides)
    live = {0, 1, 6, 9}  # one whole episode, one lone answer of another episode, ...
    seen_skip, seen_all = [], []
    s_skip = _update(t_skip, trajs, group_ids, _adv(trajs, live), seen_skip)
    s_all = _update(t_all, trajs, group_ids, _adv(trajs, live), seen_all)
    assert sorted(i for idx in seen_all for i in idx) == list(range(12))
    ran = sorted(i for idx in seen_skip for i in idx)
    minibatches = len(seen_skip)
    assert set(ran) >= live and len(ran) <= len(live) + minibatches - 1  # the live rows (+ one per live-less minibatch)
    assert _close(m_skip, m_all) and not _close(m_skip, _model())  # the same step, and a real one
    assert s_skip["loss/policy"] == pytest.approx(s_all["loss/policy"], abs=1e-6)
    assert s_skip["train/skipped_rows"] == pytest.approx(1 - len(ran) / 12)
    assert "train/skipped_rows" not in s_all
    # a batch with no live row at all: AdamW's moments still move the weights, as on the whole batch
    before = _snapshot(m_skip)
    _update(t_skip, trajs, group_ids, _adv(trajs, set()))
    _update(t_all, trajs, group_ids, _adv(trajs, set()))
    assert _close(m_skip, m_all) and not all(torch.equal(x, y) for x, y in zip(before, m_skip.parameters()))


@pytest.mark.parametrize("overrides, ref", [(["algo.kl_in=loss"], 0.1), (["algo.entropy_coef=0.01"], None)])
def test_loss_terms_that_do_not_vanish_with_the_advantage_keep_every_row(overrides, ref):
    trajs, group_ids = _branch_trajs()
    (m_skip, t_skip), (m_all, t_all) = _pair(overrides)
    seen = []
    stats = _update(t_skip, trajs, group_ids, _adv(trajs, {0, 1}), seen, ref=ref)
    _update(t_all, trajs, group_ids, _adv(trajs, {0, 1}), ref=ref)
    assert sorted(i for idx in seen for i in idx) == list(range(12)) and "train/skipped_rows" not in stats
    assert _close(m_skip, m_all)
