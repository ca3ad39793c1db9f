"""On-policy distillation's math (algo/distill.py) and its advantages (train/estimate.py), by hand.

The reward of a sampled token is log p_teacher - log p_student (the negative reverse KL sample);
inserted tokens (loss_mask 0) get advantage 0 whatever the teacher says; mixed with another
estimator the term is added to its advantages, times algo.distill_coef.
"""

from __future__ import annotations

import math

import pytest
import torch

from seekrl.algo.distill import distill_advantages, mean_reverse_kl, reverse_kl
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.estimate import estimate_advantages
from seekrl.types import Task, Trajectory

S = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])  # student log-probs
T = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -4.25, 0.0]])  # teacher log-probs
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the third column: an inserted token / past the end


def test_reverse_kl_is_student_minus_teacher_on_sampled_tokens():
    assert reverse_kl(S, T, M).tolist() == [[0.5, 0.0, 0.0], [0.0, 4.0, 0.0]]
    assert mean_reverse_kl(S, T, M) == pytest.approx((0.5 + 0 + 0 + 4.0) / 4)
    assert mean_reverse_kl(S, T, torch.zeros_like(M)) == 0.0  # no sampled token: 0, not NaN


def test_distill_advantages_alone_and_added_to_another_estimator():
    assert distill_advantages(S, T, M).tolist() == [[-0.5, 0.0, 0.0], [0.0, -4.0, 0.0]]
    assert distill_advantages(S, T, M, coef=0.5).tolist() == [[-0.25, 0.0, 0.0], [0.0, -2.0, 0.0]]
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])  # e.g. GRPO's, broadcast over the row
    assert distill_advantages(S, T, M, coef=0.5, adv_BT=adv).tolist() == [[0.75, 1.0, 0.0], [-1.0, -3.0, 0.0]]


def test_a_masked_token_stays_masked_whatever_the_teacher_says():
    teacher = T.clone()
    teacher[:, 2] = -math.inf  # vLLM floors at -9999; a local model may say -inf of tool output
    student = S.clone()
    student[1, 2] = math.nan
    out = distill_advantages(student, teacher, M, coef=2.0, adv_BT=torch.ones_like(M))
    assert out[:, 2].tolist() == [0.0, 0.0] and torch.isfinite(out).all()
    assert reverse_kl(student, teacher, M)[:, 2].tolist() == [0.0, 0.0]


def traj(reward, mask, group=0):
    n = len(mask)
    return Trajectory(Task(id=f"t{group}", prompt=[], answer=""), [1, 2], list(range(3, 3 + n)), list(mask), [0.0] * n, [0] * n,
                      reward=reward)


def batch_of(trajs, group_ids, student, teacher):
    batch = TokenBatch.from_trajectories(trajs, group_ids)
    batch.old_logp_BC = pad_completion(student, batch.width)
    batch.teacher_logp_BC = pad_completion(teacher, batch.width)
    return batch


def rows(x, trajs):
    return [x[i, : len(t.completion_ids)].tolist() for i, t in enumerate(trajs)]


def test_distill_estimator_uses_the_teacher_alone_and_masks_inserted_tokens():
    # row 0: sampled, inserted (a tool's output), sampled; row 1: two sampled tokens
    trajs = [traj(1.0, [1, 0, 1]), traj(0.0, [1, 1])]
    batch = batch_of(trajs, [0, 0], [[-1.0, -7.0, -2.0], [-3.0, -0.5]], [[-0.5, -99.0, -2.5], [-1.0, -0.5]])
    est = estimate_advantages("distill", batch)  # distill_coef None: 1 for distill
    assert rows(est.adv_BC, trajs) == [[0.5, 0.0, -0.5], [2.0, 0.0]]  # the task rewards play no part
    assert est.metrics == {"distill/reverse_kl": pytest.approx((-0.5 + 0.5 - 2.0 + 0.0) / 4)}
    assert est.returns_BC is None
    half = estimate_advantages("distill", batch, distill_coef=0.5)
    assert rows(half.adv_BC, trajs) == [[0.25, 0.0, -0.25], [1.0, 0.0]]


def test_grpo_mixed_with_a_teacher_adds_the_dense_term_to_the_group_advantage():
    trajs = [traj(1.0, [1, 1]), traj(0.0, [1, 0])]
    batch = batch_of(trajs, [0, 0], [[-1.0, -1.0], [-2.0, -5.0]], [[-2.0, -1.0], [-1.0, -50.0]])
    plain = estimate_advantages("grpo", batch, distill_coef=0.0)  # a teacher that is not asked changes nothing
    a = 0.5 / math.sqrt(0.5)  # rewards [1, 0]: mean .5, unbiased std .7071
    assert rows(plain.adv_BC, trajs) == [pytest.approx([a, a], abs=1e-5), pytest.approx([-a, 0.0], abs=1e-5)] and plain.metrics == {}
    mixed = estimate_advantages("grpo", batch, distill_coef=0.5)
    assert rows(mixed.adv_BC, trajs) == [pytest.approx([a - 0.5, a], abs=1e-5), pytest.approx([-a + 0.5, 0.0], abs=1e-5)]
    assert mixed.metrics["distill/reverse_kl"] == pytest.approx((1.0 + 0.0 - 1.0) / 3)


def test_distill_with_a_reference_kl_in_the_reward_subtracts_it_per_token():
    trajs = [traj(1.0, [1, 1])]
    batch = batch_of(trajs, [0], [[-1.0, -2.0]], [[-1.0, -1.0]])
    ref = pad_completion([[-2.0, -2.0]], batch.width)  # k1 = old - ref = [1, 0]
    est = estimate_advantages("distill", batch, ref_logp_BC=ref, kl_coef_in_reward=0.1, kl_estimator="k1")
    assert rows(est.adv_BC, trajs) == [pytest.approx([0.0 - 0.1, 1.0])]
    assert est.kl_mean == pytest.approx(0.5)


def test_distill_without_the_teacher_log_probs_is_an_error():
    trajs = [traj(1.0, [1])]
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC = pad_completion([[-1.0]], 1)
    with pytest.raises(ValueError, match="teacher"):
        estimate_advantages("distill", batch)


def test_distill_with_a_zero_coefficient_is_a_config_error():
    from seekrl.config import load_config
    from seekrl.errors import ConfigError

    with pytest.raises(ConfigError, match="no advantage to train on") as err:
        load_config(None, ["algo.name=distill", "algo.teacher.path=tiny", "algo.distill_coef=0"])
    assert "\n" not in str(err.value)


def test_distill_coef_resolves_to_one_with_distill_and_stays_with_grpo():
    from seekrl.config import load_config

    assert load_config(None, ["algo.name=distill", "algo.teacher.path=tiny"]).algo.distill_coef == 1.0
    cfg = load_config(None, ["algo.teacher.url=http://127.0.0.1:9", "algo.teacher.api=vllm", "algo.distill_coef=0.5"])
    assert (cfg.algo.name, cfg.algo.distill_coef, cfg.algo.teacher.api) == ("grpo", 0.5, "vllm")
