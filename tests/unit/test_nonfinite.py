"""Non-finite updates: `NonFiniteGuard` counts and stops; the policy and critic trainers skip the
optimizer step of a minibatch whose loss or gradient norm is nan/inf, leaving the weights and the
optimizer state untouched while the lr schedule advances."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from seekrl.build import critic_trainer, policy_trainer
from seekrl.config import load_config
from seekrl.errors import NonFiniteError, SeekrlError
from seekrl.models import make_value_model
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.optim import NonFiniteGuard
from seekrl.types import Task, Trajectory


def test_guard_counts_consecutive_steps_and_stops():
    guard = NonFiniteGuard(max_consecutive=2)
    assert guard.finite({"loss/policy": 0.5, "grad_norm/policy": 3.0})
    assert guard.end_step() == {"train/nonfinite_skipped": 0.0, "train/nonfinite_skipped_total": 0.0}
    guard.raise_if_stuck(1)
    # two bad values in one step: the first is the one named; the step counts once
    assert not guard.finite({"loss/value": 1.0, "loss/policy": math.inf})
    assert not guard.finite({"grad_norm/policy": math.nan})
    assert guard.end_step() == {"train/nonfinite_skipped": 1.0, "train/nonfinite_skipped_total": 1.0}
    guard.raise_if_stuck(2)  # 1 in a row < 2
    assert guard.end_step()["train/nonfinite_skipped"] == 0.0  # a clean step resets the run of skips
    guard.raise_if_stuck(3)
    for step in (4, 5):
        guard.finite({"loss/policy": math.nan})
        assert guard.end_step() == {"train/nonfinite_skipped": 1.0, "train/nonfinite_skipped_total": float(step - 2)}
    with pytest.raises(NonFiniteError) as e:
        guard.raise_if_stuck(5)
    assert isinstance(e.value, SeekrlError) and e.value.exit_status == 2  # the CLI prints it in one line and exits 2
    assert str(e.value) == (
        "step 5: loss/policy is nan; 2 consecutive steps had a non-finite loss or gradient norm and their updates "
        "were skipped (train.max_nonfinite=2); lower train.lr or check the rewards (the checkpoints hold the last finite weights)"
    )
    # state survives a checkpoint; 0 never stops
    restored = NonFiniteGuard(2)
    restored.load_state_dict(guard.state_dict())
    assert (restored.consecutive, restored.total) == (2, 3)
    never = NonFiniteGuard(0)
    for _ in range(10):
        never.finite({"loss": math.inf})
        never.end_step()
    never.raise_if_stuck(10)


def _model(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(config)


def _trajs(n=4):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        t = Trajectory(Task(str(i), [], ""), torch.randint(1, 32, (5,), generator=g).tolist(), [], [], [], [])
        t.append(torch.randint(1, 32, (4,), generator=g).tolist(), sampled=True, logprobs=[-3.0] * 4, version=0)
        out.append(t)
    return out


def _update(trainer, trajs, adv, stats):
    """The policy update on `trajs` with these advantages and the engine's log-probs as old ones."""
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC, batch.adv_BC = batch.behav_logp_BC, pad_completion(adv, batch.width)
    trainer.update(batch, stats)


def _critic(critic, trajs, returns=None):
    """A TokenBatch with the critic's values (and `returns` as its targets)."""
    batch = TokenBatch.from_trajectories(trajs)
    batch.values_BC = critic.values(batch)
    if returns is not None:
        batch.returns_BC = pad_completion(returns, batch.width)
    return batch


def _snapshot(module):
    return [p.detach().clone() for p in module.parameters()]


def _same(a, module):
    return all(torch.equal(x, y) for x, y in zip(a, module.parameters()))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_policy_update_with_nonfinite_loss_is_skipped(bad):
    cfg = load_config(None, ["train.lr=1e-2", "train.minibatches=2", "rollout.batch_size=4", "rollout.group_size=2",
                             "train.warmup_steps=4", "train.micro_batch_tokens=16"])
    model = _model()
    trainer = policy_trainer(cfg, model, 0, total_steps=10)
    trajs = _trajs()
    good_adv = [[1.0, -1.0, 0.5, 0.0] for _ in trajs]
    bad_adv = [[bad] * 4 for _ in trajs]
    before, stats = _snapshot(model), StatsTracker()
    _update(trainer, trajs, bad_adv, stats)
    metrics = {**stats.export(), **trainer.guard.end_step()}
    assert _same(before, model), "a non-finite update changed the weights"
    assert not trainer.optimizer.state  # AdamW's moments were never created
    assert all(p.grad is None for p in model.parameters())  # gradients zeroed
    assert trainer.scheduler.last_epoch == 1  # the schedule counts RL steps: it advanced
    assert metrics["train/nonfinite_skipped"] == 1.0 and trainer.guard.last_bad[0] == "loss/policy"
    assert math.isnan(metrics["loss/policy"]) or math.isinf(metrics["loss/policy"])  # logged as it was (null in metrics.jsonl)
    # one bad minibatch of two: the other one updates
    mixed = [good_adv[0], good_adv[1], good_adv[2], bad_adv[3]]
    _update(trainer, trajs, mixed, StatsTracker())
    assert trainer.guard.end_step()["train/nonfinite_skipped"] == 1.0 and not _same(before, model)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    after_mixed = _snapshot(model)
    _update(trainer, trajs, good_adv, StatsTracker())
    assert trainer.guard.end_step() == {"train/nonfinite_skipped": 0.0, "train/nonfinite_skipped_total": 2.0}
    assert not _same(after_mixed, model)


def test_policy_update_with_nonfinite_gradient_is_skipped(monkeypatch):
    cfg = load_config(None, ["train.lr=1e-2", "rollout.batch_size=4", "rollout.group_size=2"])
    model = _model()
    trainer = policy_trainer(cfg, model, 0, total_steps=10)
    trajs = _trajs()
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: real(params, max_norm) * math.inf)
    before = _snapshot(model)
    _update(trainer, trajs, [[1.0] * 4 for _ in trajs], StatsTracker())
    assert _same(before, model) and not trainer.optimizer.state
    assert trainer.guard.last_bad is None and trainer.guard.first_bad == ("grad_norm/policy", math.inf)


def test_critic_update_with_nonfinite_returns_is_skipped_and_reported_to_the_shared_guard():
    cfg = load_config(None, ["algo.name=ppo", "train.critic_lr=1e-2", "rollout.batch_size=4", "rollout.group_size=2"])
    critic = critic_trainer(cfg, make_value_model(_model()), 0, total_steps=10)
    trajs = _trajs()
    guard = NonFiniteGuard(3)
    before = _snapshot(critic.model)
    critic.update(_critic(critic, trajs, [[math.inf] * 4 for _ in trajs]), StatsTracker(), guard=guard)
    assert _same(before, critic.model) and not critic.optimizer.state
    assert guard.first_bad[0] == "loss/value" and critic.guard.first_bad is None
    assert critic.scheduler.last_epoch == 1
    critic.update(_critic(critic, trajs, [[1.0] * 4 for _ in trajs]), StatsTracker(), guard=guard)
    assert not _same(before, critic.model)
