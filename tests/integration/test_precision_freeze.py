"""The two cheaper-update options of the trainer:
- `train.mixed_precision=bf16` in one process: the decoder runs under bf16 autocast, log-probs
  stay float32 and close to the fp32 ones, the weights and their gradients stay float32, and the
  RL loop no longer reuses the fp32 engine's log-probs as old ones (recomputed: ratio 1 exactly).
- `model.freeze_layers=N`: the embeddings (and the tied head) and the first N layers get no
  gradient and never change; the layers above them train; bad values are one-line errors.
"""

from __future__ import annotations

import pytest
import torch

from seekrl.build import policy_trainer
from seekrl.config import load_config
from seekrl.errors import ConfigError
from seekrl.models import decoder_layers, freeze_lower_layers, load_model
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.compute import set_autocast
from seekrl.types import Task, Trajectory


def _cfg(*overrides):
    return load_config(None, ["rollout.max_new_tokens=12", "rollout.max_prompt_tokens=64", "model.max_context=128", *overrides])


def _trajs(vocab, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = Trajectory(Task(id=str(i), prompt=[], answer=""), torch.randint(3, vocab, (6 + i,), generator=g).tolist(), [], [], [], [])
        for sampled, length in ((True, 5 + i), (False, 3), (True, 2)):
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            t.append(ids, sampled=sampled, logprobs=[-1.0] * length if sampled else None, version=0)
        out.append(t)
    return out


def _update(model, cfg, trajs):
    trainer = policy_trainer(cfg, model, 0, total_steps=1)
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC = trainer.logprobs(batch)
    batch.adv_BC = pad_completion([[float(i % 3) - 1.0] * len(t.completion_ids) for i, t in enumerate(trajs)], batch.width)
    stats = StatsTracker()
    trainer.update(batch, stats)
    return batch, stats


def test_bf16_autocast_scores_close_to_fp32_in_float32_and_trains_fp32_weights(fresh_tiny_model, tiny_tokenizer):
    trajs = _trajs(len(tiny_tokenizer))
    batch = TokenBatch.from_trajectories(trajs)
    fp32 = policy_trainer(_cfg(), fresh_tiny_model, 0, total_steps=1).logprobs(batch)
    set_autocast(fresh_tiny_model, torch.bfloat16)
    try:
        bf16 = policy_trainer(_cfg("train.mixed_precision=bf16"), fresh_tiny_model, 0, total_steps=1).logprobs(batch)
        assert bf16.dtype == torch.float32 and bf16.shape == fp32.shape
        diff = (bf16 - fp32).abs().max().item()
        assert 0 < diff < 0.05, diff  # bf16 matmuls: close, but not the fp32 numbers
        before = {n: p.detach().clone() for n, p in fresh_tiny_model.named_parameters()}
        _, stats = _update(fresh_tiny_model, _cfg("train.mixed_precision=bf16", "train.lr=1e-2"), trajs)
        assert all(p.dtype == torch.float32 for p in fresh_tiny_model.parameters())
        assert any(not torch.equal(before[n], p) for n, p in fresh_tiny_model.named_parameters())
        assert stats.export()["actor/ratio_max"] == pytest.approx(1.0, abs=1e-6)  # old log-probs recomputed under the same autocast
    finally:
        set_autocast(fresh_tiny_model, None)
    assert getattr(fresh_tiny_model, "seekrl_autocast") is None


def test_bf16_trainer_does_not_reuse_the_fp32_engine_logprobs(tmp_path):
    from seekrl.build import build_rl

    def reuse(*extra):
        cfg = load_config("examples/tiny_grpo.yaml", [f"log.dir={tmp_path}", "log.progress=false", "train.steps=1", *extra])
        run = build_rl(cfg)
        try:
            return run.reuse_engine_logprobs, getattr(run.model, "seekrl_autocast", None)
        finally:
            run.close()

    assert reuse() == (True, None)
    assert reuse("train.mixed_precision=bf16", "log.name=bf16") == (False, torch.bfloat16)


def test_frozen_layers_get_no_gradient_and_stay_as_they_were(fresh_tiny_model, tiny_tokenizer):
    freeze_lower_layers(fresh_tiny_model, 1)
    layers = decoder_layers(fresh_tiny_model)
    before = {n: p.detach().clone() for n, p in fresh_tiny_model.named_parameters()}
    _update(fresh_tiny_model, _cfg("train.lr=1e-2"), _trajs(len(tiny_tokenizer)))
    frozen = {n for n, p in fresh_tiny_model.named_parameters() if not p.requires_grad}
    assert {f"model.layers.0.{n}" for n, _ in layers[0].named_parameters()} <= frozen
    assert "model.embed_tokens.weight" in frozen and not any(n.startswith("model.layers.1.") for n in frozen)
    for n, p in fresh_tiny_model.named_parameters():
        assert torch.equal(before[n], p) == (n in frozen), n
        assert (p.grad is None) == (n in frozen), n


def test_freeze_layers_errors_are_one_line(tiny_texts):
    with pytest.raises(ConfigError, match=r"model.freeze_layers=2: the model has 2 decoder layers; freeze 1 to 1"):
        load_model("tiny", tiny_texts=tiny_texts, tiny_layers=2, freeze_layers=2)
    with pytest.raises(ConfigError, match="model.freeze_layers and model.lora_r"):
        load_config(None, ["model.freeze_layers=1", "model.lora_r=4"])
    model, _ = load_model("tiny", tiny_texts=tiny_texts, tiny_layers=3, freeze_layers=2)
    assert [all(not p.requires_grad for p in layer.parameters()) for layer in decoder_layers(model)] == [True, True, False]
