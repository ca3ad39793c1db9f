"""GSPO, GSPO-token and CISPO (seekrl.algo.losses) against values worked out by hand.

A ragged batch of two sequences: row 0 has 3 valid tokens, row 1 has 2 (its third token is
padding, where the log-probs hold garbage that must not leak in). Hand values in the comments.
"""

import math
import typing

import pytest
import torch

from seekrl.algo.config import OBJECTIVE_DEFAULTS, PolicyLoss
from seekrl.algo.losses import POLICY_LOSSES, aggregate, cispo_loss, gspo_loss, policy_loss

T = torch.tensor


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def ragged():
    """old log-probs; per-token log-ratios row 0: (0.1, -0.2, 0.4) (mean 0.1), row 1: (0.3, 0.5) (mean 0.4)."""
    old = T([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    d = T([[0.1, -0.2, 0.4], [0.3, 0.5, float("nan")]])
    logp = (old + torch.nan_to_num(d, nan=0.0)).clone()
    logp[1, 2] = float("-inf")  # padding
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logp.requires_grad_(True), old, mask


def test_every_configured_objective_has_a_loss():
    assert set(POLICY_LOSSES) == set(typing.get_args(PolicyLoss)) == set(OBJECTIVE_DEFAULTS)


def test_gspo_sequence_ratio_clipping_and_gradient_by_hand():
    logp, old, mask = ragged()
    adv = T([1.0, -2.0])
    # s_0 = e^0.1 = 1.10517, s_1 = e^0.4 = 1.49182; with clip (0.2, 0.2) both are above 1.2:
    # row 0 (A=+1): max(-1.10517, -1.10517) -> unclipped, loss -1.10517, grad flows;
    # row 1 (A=-2): max(2*1.49182, 2*1.2) = 2.98365 -> unclipped (pessimistic), grad flows.
    loss, stats = gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    s0, s1 = math.exp(0.1), math.exp(0.4)
    assert close(loss, (-s0 + 2 * s1) / 2)  # seq-mean-token-mean: the mean of the two sequence losses
    assert stats["clip_frac"] == 0.0 and close(stats["ratio_mean"], (s0 + s1) / 2) and close(stats["ratio_max"], s1)
    loss.backward()
    # d/dlogp_it of (1/2) * l_i = (1/2) * (-A_i) * s_i / n_i
    assert close(logp.grad[0], [-s0 / 6] * 3) and close(logp.grad[1, :2], [2 * s1 / 4] * 2)
    assert logp.grad[1, 2] == 0.0

    # now clip at (0.2, 0.2) with A_1 = +1: row 1's ratio 1.4918 > 1.2 is clipped -> no gradient
    logp, old, mask = ragged()
    loss, stats = gspo_loss(logp, old, T([1.0, 1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert close(loss, (-s0 - 1.2) / 2)
    assert close(stats["clip_frac"], 2 / 5) and close(stats["clip_frac_high"], 2 / 5) and stats["clip_frac_low"] == 0.0
    loss.backward()
    assert close(logp.grad[1], [0.0, 0.0, 0.0]) and close(logp.grad[0], [-s0 / 6] * 3)


def test_gspo_default_clip_range_is_tight():
    # the paper's 3e-4 / 4e-4: a sequence ratio of e^0.1 is far outside and gets no gradient
    logp, old, mask = ragged()
    loss, stats = gspo_loss(logp, old, T([1.0, 1.0]), mask)
    assert close(loss, -(1 + 4e-4)) and stats["clip_frac"] == 1.0
    loss.backward()
    assert float(logp.grad.abs().sum()) == 0.0


def test_gspo_token_has_the_sequence_ratio_value_and_per_token_advantages():
    logp, old, mask = ragged()
    adv = T([[1.0, 2.0, 3.0], [-1.0, 1.0, 9.0]])  # per-token advantages; 9.0 sits on padding
    loss, _ = gspo_loss(logp, old, adv, mask, clip_low=0.5, clip_high=0.5, token=True)
    s0, s1 = math.exp(0.1), math.exp(0.4)
    # no clipping (1.49 < 1.5): l_it = -A_it * s_i; seq-mean-token-mean
    assert close(loss, ((-s0 * 6) / 3 + (s1 * 1 - s1 * 1) / 2) / 2)
    loss.backward()
    # d l_it / d logp_it = -A_it * s_i (the token's own ratio's gradient), then 1/(2 n_i)
    assert close(logp.grad[0], [-1 * s0 / 6, -2 * s0 / 6, -3 * s0 / 6])
    assert close(logp.grad[1], [s1 / 4, -s1 / 4, 0.0])


def test_gspo_and_gspo_token_agree_when_the_advantage_is_per_sequence():
    torch.manual_seed(0)
    old = -torch.rand(4, 6) * 3
    base = old + 0.3 * torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[3] = 0.0  # an empty row
    adv = torch.randn(4)
    grads = []
    for token in (False, True):
        logp = base.clone().requires_grad_(True)
        loss, _ = gspo_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1, token=token)
        loss.backward()
        grads.append((loss.detach(), logp.grad))
    assert close(grads[0][0], grads[1][0]) and close(grads[0][1], grads[1][1])


def test_gspo_on_policy_equals_ppo_gradient_of_seq_mean_token_mean():
    # at ratio 1 (on-policy) GSPO's gradient is mean_i A_i * mean_t grad logp: PPO's with seq-mean-token-mean
    torch.manual_seed(1)
    old = -torch.rand(3, 5) * 2
    mask = T([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    adv = T([0.5, -1.0, 2.0])
    g = []
    for fn in (gspo_loss, policy_loss):
        logp = old.clone().requires_grad_(True)
        loss, _ = fn(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg="seq-mean-token-mean")
        loss.backward()
        g.append(logp.grad)
    assert close(g[0], g[1])


def test_cispo_weight_is_clipped_and_detached_and_every_token_keeps_its_gradient():
    logp, old, mask = ragged()
    adv = T([1.0, -1.0])
    # ratios row 0: e^0.1=1.10517, e^-0.2=0.81873, e^0.4=1.49182; row 1: e^0.3=1.34986, e^0.5=1.64872
    # clip (0.1, 0.2): weights row 0: 1.10517, 0.9 (clipped low), 1.2 (clipped high); row 1: 1.2, 1.2
    loss, stats = cispo_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.2)
    w = T([[math.exp(0.1), 0.9, 1.2], [1.2, 1.2, 0.0]])
    lp = logp.detach().clone()
    lp[1, 2] = 0.0
    token_loss = -T([[1.0] * 3, [-1.0] * 3]) * w * lp
    assert close(loss, token_loss[mask.bool()].sum() / 5)
    assert close(stats["clip_frac"], 4 / 5) and close(stats["clip_frac_low"], 1 / 5) and close(stats["clip_frac_high"], 3 / 5)
    loss.backward()
    # d/dlogp = -A * w / 5 on every valid token, clipped ones too (PPO would give 0 there)
    assert close(logp.grad, -T([[1.0] * 3, [-1.0] * 3]) * w / 5)
    assert torch.isfinite(logp.grad).all()


def test_cispo_default_has_no_lower_bound():
    logp, old, mask = ragged()
    loss, stats = cispo_loss(logp, old, T([1.0, 1.0]), mask)  # clip_low=1: weight in [0, 6]
    assert stats["clip_frac"] == 0.0
    loss.backward()
    ratio = torch.exp(logp.detach() - old)
    assert close(logp.grad[0], -ratio[0] / 5)


def test_cispo_on_policy_is_the_policy_gradient():
    # r = 1: the gradient is -A * grad logp, aggregated: exactly REINFORCE's (and PPO's) on-policy gradient
    torch.manual_seed(2)
    old = -torch.rand(3, 4)
    mask = T([[1.0, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    adv = T([1.0, -0.5, 0.25])
    g = []
    for fn in (cispo_loss, policy_loss):
        logp = old.clone().requires_grad_(True)
        loss, _ = fn(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
        loss.backward()
        g.append(logp.grad)
    assert close(g[0], g[1])


def test_gspo_sequence_loss_is_weighed_by_the_mean_of_its_token_weights():
    # one ratio per sequence: a token weight cannot silence one token's gradient, it scales the
    # row's loss by the mean weight of its valid tokens (algo.mismatch_level=sequence|geometric fit GSPO best)
    w = T([[0.5, 1.0, 3.0], [1.0, 0.0, 123.0]])  # mean 1.5 and 0.5 over valid tokens
    kw = dict(clip_low=0.5, clip_high=0.6)
    logp, old, mask = ragged()
    loss_w, _ = gspo_loss(logp, old, T([1.0, -1.0]), mask, is_weight_BT=w, **kw)
    loss_w.backward()
    logp2, old2, mask2 = ragged()
    loss, _ = gspo_loss(logp2, old2, T([1.0, -1.0]) * T([1.5, 0.5]), mask2, **kw)
    loss.backward()
    assert close(loss_w, loss) and close(logp.grad, logp2.grad)


@pytest.mark.parametrize("name", ["gspo_token", "cispo"])
def test_importance_weights_multiply_and_masked_tokens_are_ignored(name):
    logp, old, mask = ragged()
    w = T([[0.5, 1.0, 2.0], [1.0, 0.0, 123.0]])  # 123 sits on padding
    kw = dict(clip_low=0.5, clip_high=0.6)
    loss_w, _ = POLICY_LOSSES[name](logp, old, T([1.0, -1.0]), mask, is_weight_BT=w, **kw)
    loss_w.backward()
    g_w = logp.grad.clone()
    assert torch.isfinite(loss_w) and torch.isfinite(g_w).all() and g_w[1, 2] == 0.0
    assert g_w[1, 1] == 0.0  # weight 0: that token does not train
    logp2, old2, mask2 = ragged()
    loss, _ = POLICY_LOSSES[name](logp2, old2, T([1.0, -1.0]), mask2, **kw)
    loss.backward()
    assert close(g_w[0], logp2.grad[0] * w[0])


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "cispo"])
def test_empty_mask_gives_zero_not_nan(name):
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, stats = POLICY_LOSSES[name](logp, torch.zeros(2, 3), T([1.0, 1.0]), torch.zeros(2, 3))
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in stats.values())
    loss.backward()
    assert float(logp.grad.abs().sum()) == 0.0


def test_bad_arguments():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_low"):
        gspo_loss(z, z, z, z + 1, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        cispo_loss(z, z, z, z + 1, clip_low=1.5)
    with pytest.raises(ValueError, match="rows"):
        cispo_loss(z, z, T([1.0, 2.0]), z + 1)
    with pytest.raises(ValueError, match="aggregation"):
        gspo_loss(z, z, z, z + 1, agg="mean")
    assert aggregate(z, z, "token-mean").item() == 0.0
