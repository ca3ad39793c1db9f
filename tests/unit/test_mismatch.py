"""Engine/trainer mismatch weights (algo/mismatch.py) against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from seekrl.algo.losses import policy_loss
from seekrl.algo.mismatch import Correction, correction_weights, mismatch_stats

# two rows; row 0: log ρ = [ln 3, 0, ln 0.25]; row 1: log ρ = [ln 1.5, (padding)]
OLD = torch.tensor([[math.log(3.0) - 1.0, -1.0, math.log(0.25) - 1.0], [math.log(1.5) - 2.0, 0.0, 0.0]])
BEHAV = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def _w(c):
    return correction_weights(OLD, BEHAV, MASK, c)


def test_token_tis_truncates_at_the_cap():
    w, s = _w(Correction("tis", "token", 2.0))
    assert w[0].tolist() == pytest.approx([2.0, 1.0, 0.25])
    assert w[1, 0].item() == pytest.approx(1.5)
    assert s["truncated_frac"] == pytest.approx(1 / 4) and s["masked_frac"] == 0.0
    assert s["weight_mean"] == pytest.approx((3 + 1 + 0.25 + 1.5) / 4)


def test_token_mis_drops_outside_the_band():
    w, s = _w(Correction("mis", "token", 2.0, 0.5))
    assert w[0].tolist() == pytest.approx([0.0, 1.0, 0.0])  # 3 > 2 and 0.25 < 0.5 dropped; kept ones keep their ratio
    assert w[1, 0].item() == pytest.approx(1.5)
    assert s["masked_frac"] == pytest.approx(2 / 4)


def test_sequence_level_uses_the_product_over_sampled_tokens():
    w, s = _w(Correction("tis", "sequence", 2.0))
    assert w[0].tolist() == pytest.approx([0.75] * 3)  # 3 * 1 * 0.25, below the cap
    assert w[1, 0].item() == pytest.approx(1.5)  # the padding (log ρ = 7) does not count
    w, s = _w(Correction("mis", "sequence", 1.2))
    assert w[0].tolist() == pytest.approx([0.75] * 3) and w[1, 0].item() == 0.0
    assert s["masked_frac"] == pytest.approx(1 / 4)


def test_geometric_level_is_length_independent():
    w, _ = _w(Correction("mis", "geometric", 1.01, 0.99))
    g0 = (3.0 * 1.0 * 0.25) ** (1 / 3)  # 0.9086: outside [0.99, 1.01]
    assert w[0].tolist() == [0.0] * 3 and w[1, 0].item() == 0.0
    w, _ = _w(Correction("tis", "geometric", 10.0))
    assert w[0].tolist() == pytest.approx([g0] * 3)


def test_none_is_the_plain_ratio_and_bad_settings_are_refused():
    w, _ = _w(Correction("none", "token", None))
    assert w[0].tolist() == pytest.approx([3.0, 1.0, 0.25])
    with pytest.raises(ValueError, match="cap_low"):
        Correction("mis", "token", 1.0, 2.0)
    with pytest.raises(ValueError, match="unknown correction mode"):
        Correction("clip")


def test_mismatch_stats_k3():
    s = mismatch_stats(OLD, BEHAV, MASK)
    d = [math.log(3.0), 0.0, math.log(0.25), math.log(1.5)]
    assert s["kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 4)
    assert s["ratio_max"] == pytest.approx(3.0) and s["abs_diff_max"] == pytest.approx(math.log(4.0))
    same = mismatch_stats(BEHAV, BEHAV, MASK)
    assert same["kl"] == 0.0 and same["ratio_max"] == 1.0
    assert mismatch_stats(OLD, BEHAV, torch.zeros_like(MASK))["tokens"] == 0.0


def test_the_weight_multiplies_each_token_loss():
    logp = OLD.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    w, _ = _w(Correction("tis", "token", 2.0))
    plain, _ = policy_loss(logp, OLD, adv, MASK)
    weighted, _ = policy_loss(logp, OLD, adv, MASK, is_weight_BT=w)
    # ratio 1 at the start: token loss -A; token-mean over 4 tokens
    assert plain.item() == pytest.approx((-1 - 1 - 1 + 1) / 4)
    assert weighted.item() == pytest.approx((-2.0 - 1.0 - 0.25 + 1.5) / 4)
