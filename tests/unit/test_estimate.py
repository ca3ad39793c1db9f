"""train/estimate.py and train/plan.py against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.estimate import estimate_advantages
from seekrl.train.plan import plan_micro_batches
from seekrl.types import Task, Trajectory


def traj(reward, mask, logprobs=None):
    t = Trajectory(Task(id="t", prompt=[], answer=""), [1, 2], list(range(len(mask))), list(mask),
                   logprobs or [0.0] * len(mask), [0] * len(mask), reward=reward)
    return t


class Rows:
    """An Estimate's tensors as per-trajectory lists (each as long as its completion)."""

    def __init__(self, est, trajs):
        def rows(x):
            return None if x is None else [x[i, : len(t.completion_ids)].tolist() for i, t in enumerate(trajs)]

        self.adv, self.returns, self.kl_mean = rows(est.adv_BC), rows(est.returns_BC), est.kl_mean


def estimate(algo, trajs, group_ids, old_logp=None, ref_logp=None, values=None, **kw):
    batch = TokenBatch.from_trajectories(trajs, group_ids)
    C = batch.width
    if old_logp is not None:
        batch.old_logp_BC = pad_completion(old_logp, C)
    return Rows(estimate_advantages(algo, batch, ref_logp_BC=None if ref_logp is None else pad_completion(ref_logp, C),
                                    values_BC=None if values is None else pad_completion(values, C), **kw), trajs)


def test_grpo_broadcasts_group_advantage_to_sampled_tokens_only():
    # rewards [1, 0] in one group: mean .5, unbiased std .7071 -> adv +-.7071
    trajs = [traj(1.0, [1, 1]), traj(0.0, [1, 0])]
    est = estimate("grpo", trajs, [0, 0])
    a = 0.5 / math.sqrt(0.5)
    assert est.adv[0] == pytest.approx([a, a], abs=1e-5)
    assert est.adv[1] == pytest.approx([-a, 0.0], abs=1e-5)  # the inserted token gets 0
    assert est.returns is None


def test_dr_grpo_and_rloo():
    trajs = [traj(1.0, [1]), traj(0.0, [1]), traj(0.0, [1])]
    dr = estimate("dr_grpo", trajs, [0, 0, 0])
    assert [x[0] for x in dr.adv] == pytest.approx([2 / 3, -1 / 3, -1 / 3])  # r - mean, no std
    rloo = estimate("rloo", trajs, [0, 0, 0])
    assert [x[0] for x in rloo.adv] == pytest.approx([1.0, -0.5, -0.5])  # r - mean of the others


def test_kl_in_reward_for_group_estimators():
    # k1 per token = old - ref = [1, 0] -> sum 1; rewards become [1 - 0.5, 0 - 0] = [.5, 0]
    trajs = [traj(1.0, [1, 1]), traj(0.0, [1, 1])]
    old = [[-1.0, -1.0], [-1.0, -1.0]]
    ref = [[-2.0, -1.0], [-1.0, -1.0]]
    est = estimate("dr_grpo", trajs, [0, 0], old_logp=old, ref_logp=ref, kl_coef_in_reward=0.5, kl_estimator="k1")
    assert est.adv[0] == pytest.approx([0.25, 0.25])  # .5 - mean(.5, 0)
    assert est.kl_mean == pytest.approx(0.25)  # (1 + 0 + 0 + 0) / 4 sampled tokens


def test_reinforce_pp_whitens_returns_over_the_batch():
    # returns per token [1, 1], [0, 0]; mean .5, unbiased var (4 * .25) / 3 -> std .5774
    trajs = [traj(1.0, [1, 1]), traj(0.0, [1, 1])]
    est = estimate("reinforce_pp", trajs, [0, 1])
    z = 0.5 / math.sqrt(1 / 3)
    assert est.adv[0] == pytest.approx([z, z], abs=1e-4)
    assert est.adv[1] == pytest.approx([-z, -z], abs=1e-4)


def test_ppo_gae_skips_inserted_tokens():
    # tokens t0 (sampled), t1 (inserted), t2 (sampled); values .5, .25, 0; reward 1; gamma = lam = 1
    # t2: delta = 1 + 0 - 0 = 1 -> A2 = 1, R2 = 1
    # t0: next valid token is t2: delta = 0 + v2 - v0 = -.5 -> A0 = -.5 + A2 = .5, R0 = A0 + v0 = 1
    trajs = [traj(1.0, [1, 0, 1])]
    est = estimate("ppo", trajs, [0], values=[[0.5, 0.25, 0.0]], gamma=1.0, lam=1.0)
    assert est.returns[0] == pytest.approx([1.0, 0.0, 1.0])
    # advantages [.5, 1] whitened over the two valid tokens: (x - .75) / std([.5, 1]) (unbiased .3536)
    s = math.sqrt(0.125)
    assert est.adv[0] == pytest.approx([-0.25 / s, 0.0, 0.25 / s], abs=1e-4)


def test_ppo_needs_values():
    with pytest.raises(ValueError, match="critic"):
        estimate("ppo", [traj(1.0, [1])], [0])


def test_micro_batch_plan_respects_the_budget():
    lengths = [5, 30, 6, 7, 29, 8]
    groups = plan_micro_batches(lengths, token_budget=60)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= 60
    # sorted by length: [5, 6, 7, 8] fit in 4 * 8 = 32; then 29 and 30 fit together (2 * 30 = 60)
    assert groups == [[0, 2, 3, 5], [4, 1]]
    assert plan_micro_batches([100], token_budget=10) == [[0]]  # a long sequence still gets a batch
