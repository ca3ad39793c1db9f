"""The two cheaper-update options of the trainer:
- `train.mixed_precision=bf16` in one process: the decoder runs under bf16 autocast, log-probs
  stay float32 and close to the fp32 ones, the weights and their gradients stay float32, and the
  RL loop no longer reuses the fp32 engine's log-probs as old ones (recomputed: ratio 1 exactly);
  with one optimizer step a batch the update's own forward pass gives them (the same weights
  after the step as with a separate recomputation, one pass fewer).
- `model.freeze_layers=N`: the embeddings (and the tied head) and the first N layers get no
  gradient and never change; the layers above them train; bad values are one-line errors.
"""

from __future__ import annotations

import warnings

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

    def reuse(name, *extra):
        cfg = load_config("examples/tiny_grpo.yaml", [f"log.dir={tmp_path}", f"log.name={name}", "log.progress=false",
                                                      "train.steps=1", *extra])
        run = build_rl(cfg)
        try:
            return run.reuse_engine_logprobs, run.old_from_update, getattr(run.model, "seekrl_autocast", None)
        finally:
            run.close()

    assert reuse("fp32") == (True, False, None)  # the exact engine's log-probs: no pass at all
    # not exact, one optimizer step, nothing reads them before the update: the update's own pass
    assert reuse("bf16", "train.mixed_precision=bf16") == (False, True, torch.bfloat16)
    # a separate pass: asked for, several optimizer steps a batch, the KL against the reference, async
    assert reuse("always", "train.mixed_precision=bf16", "train.recompute_logprobs=always")[:2] == (False, False)
    assert reuse("epochs", "train.mixed_precision=bf16", "train.ppo_epochs=2")[:2] == (False, False)
    assert reuse("mini", "train.mixed_precision=bf16", "train.minibatches=2")[:2] == (False, False)
    # minibatches by size (tasks a step): several steps need the separate pass, one task-sized batch does not
    assert reuse("size", "train.mixed_precision=bf16", "rollout.batch_size=32", "rollout.group_size=8",
                 "train.minibatch_size=2")[:2] == (False, False)
    assert reuse("size1", "train.mixed_precision=bf16", "rollout.batch_size=32", "rollout.group_size=8",
                 "train.minibatch_size=4")[:2] == (False, True)
    # the KL in the loss with a fixed coefficient: the update measures it; in the reward or adaptive: read before
    assert reuse("kl", "train.mixed_precision=bf16", "algo.kl_coef=0.01")[:2] == (False, True)
    assert reuse("klr", "train.mixed_precision=bf16", "algo.kl_coef=0.01", "algo.kl_in=reward")[:2] == (False, False)
    assert reuse("kla", "train.mixed_precision=bf16", "algo.kl_coef=0.01", "algo.kl_target=0.01")[:2] == (False, False)
    assert reuse("async", "train.mixed_precision=bf16", "rollout.mode=async")[:2] == (False, False)


def test_old_logprobs_from_the_update_give_the_recomputed_step(tiny_model, tiny_tokenizer):
    """One optimizer step under bf16 autocast: old log-probs from the update's own forward pass
    (old_logp_BC None) move the weights as a separate recomputation does, with the ratio exactly 1;
    with several optimizer steps a batch they are refused."""
    import copy

    trajs = _trajs(len(tiny_tokenizer))
    cfg = _cfg("train.mixed_precision=bf16", "train.lr=1e-2")
    after = []
    for recompute in (True, False):
        model = copy.deepcopy(tiny_model)
        set_autocast(model, torch.bfloat16)
        trainer = policy_trainer(cfg, model, 0, total_steps=1)
        batch = TokenBatch.from_trajectories(trajs)
        batch.old_logp_BC = trainer.logprobs(batch) if recompute else None
        batch.adv_BC = pad_completion([[float(i % 3) - 1.0] * len(t.completion_ids) for i, t in enumerate(trajs)], batch.width)
        stats = StatsTracker()
        trainer.update(batch, stats)
        assert stats.export()["actor/ratio_max"] == pytest.approx(1.0, abs=1e-6)
        after.append({n: p.detach().clone() for n, p in model.named_parameters()})
    moved = [n for n in after[0] if not torch.equal(after[0][n], tiny_model.state_dict()[n])]
    assert moved  # the step changed the weights, and both ways the same
    for n in after[0]:
        torch.testing.assert_close(after[1][n], after[0][n], rtol=1e-5, atol=1e-7)
    model = copy.deepcopy(tiny_model)
    trainer = policy_trainer(_cfg("train.ppo_epochs=2"), model, 0, total_steps=1)
    batch = TokenBatch.from_trajectories(trajs)
    batch.adv_BC = pad_completion([[1.0] * len(t.completion_ids) for t in trajs], batch.width)
    with pytest.raises(ValueError, match="one optimizer step"):
        trainer.update(batch, StatsTracker())


def test_kl_in_the_loss_with_old_logprobs_from_the_update(tiny_model, tiny_tokenizer):
    """With the KL to the reference in the loss, old log-probs from the update's own pass give the
    recomputed step's weights and loss, and the update logs `kl`: KL(old || reference) per trained token."""
    import copy

    from seekrl.algo.advantages import kl_estimate

    trajs = _trajs(len(tiny_tokenizer))
    cfg = _cfg("train.lr=1e-2", "algo.kl_coef=0.5")
    ref = copy.deepcopy(tiny_model).eval().requires_grad_(False)
    with torch.no_grad():  # a reference that differs from the policy
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    after, logged = [], []
    for recompute in (True, False):
        model = copy.deepcopy(tiny_model)
        trainer = policy_trainer(cfg, model, 0, total_steps=1, ref_model=ref)
        batch = TokenBatch.from_trajectories(trajs)
        old = trainer.logprobs(batch)
        batch.old_logp_BC = old if recompute else None
        batch.ref_logp_BC, batch.kl_coef = trainer.ref_logprobs(batch), 0.5
        batch.adv_BC = pad_completion([[float(i % 3) - 1.0] * len(t.completion_ids) for i, t in enumerate(trajs)], batch.width)
        mask = batch.train_mask_BC(cfg.algo.mask_truncated)
        stats = StatsTracker()
        trainer.update(batch, stats)
        logged.append(stats.export())
        after.append({n: p.detach().clone() for n, p in model.named_parameters()})
    want = float((kl_estimate(old, batch.ref_logp_BC, kind="k3") * mask).sum() / mask.sum())
    assert want > 1e-4
    assert "kl" not in logged[0] and logged[1]["kl"] == pytest.approx(want, rel=1e-4)
    assert logged[1]["loss/kl"] == pytest.approx(logged[0]["loss/kl"], rel=1e-5) and logged[0]["loss/kl"] > 0
    for n in after[0]:
        torch.testing.assert_close(after[1][n], after[0][n], rtol=1e-5, atol=1e-7)


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


@pytest.mark.parametrize("native", [True, False])
def test_bf16_if_native_is_bf16_only_where_the_device_computes_it(tmp_path, monkeypatch, capsys, tiny_texts, native):
    """An AVX2-only CPU emulates bf16 (46x slower than fp32 for a matmul, BENCHMARKS.md):
    `bf16_if_native` trains in bf16 where the device has it and in fp32 elsewhere, in the RL and
    the SFT builds alike, and says which; an explicit `bf16` without it runs as asked, with a warning,
    and so do bfloat16 weights (`model.dtype`)."""
    from seekrl.build import build_rl, build_sft
    from seekrl.train import compute

    monkeypatch.setattr(compute.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native, raising=False)
    compute.native_bf16.cache_clear()
    compute.trainer_precision.cache_clear()
    try:
        assert compute.native_bf16("cpu") is native
        cfg = load_config("examples/tiny_grpo.yaml", [f"log.dir={tmp_path}", "log.name=rl", "log.progress=false", "train.steps=1",
                                                      "train.mixed_precision=bf16_if_native"])
        run = build_rl(cfg)
        try:  # the exact fp32 engine's log-probs are reused only where the trainer computes in fp32
            got = (getattr(run.model, "seekrl_autocast", None), run.reuse_engine_logprobs)
        finally:
            run.close()
        assert got == ((torch.bfloat16, False) if native else (None, True))
        chosen = "bf16" if native else "fp32"
        assert f"seekrl: train.mixed_precision=bf16_if_native: {chosen} on this cpu" in capsys.readouterr().err

        sft_rows = tmp_path / "sft.jsonl"
        sft_rows.write_text('{"messages": [{"role": "user", "content": "copy: 1 2"}, {"role": "assistant", "content": "1 2"}]}\n')
        sft = build_sft(load_config(None, [f"log.dir={tmp_path}", "log.name=sft", "log.progress=false", f"data.train={sft_rows}",
                                           "train.mixed_precision=bf16_if_native"]))
        assert getattr(sft.model, "seekrl_autocast", None) == (torch.bfloat16 if native else None)

        with warnings.catch_warnings(record=True) as caught:  # an explicit bf16 runs as asked, warned where emulated
            warnings.simplefilter("always")
            assert compute.trainer_precision("bf16", "cpu") == "bf16"
        assert [str(w.message).split(":")[1].strip() for w in caught] == ([] if native else ["train.mixed_precision=bf16 on a cpu without native bf16 (no avx512_bf16, AMX or bf16 GPU)"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, _ = load_model("tiny", tiny_texts=tiny_texts, dtype="bfloat16")
        assert next(model.parameters()).dtype == torch.bfloat16
        assert [str(w.message).split(":")[1].strip() for w in caught if "model.dtype" in str(w.message)] == (
            [] if native else ["model.dtype=bfloat16 on a cpu without native bf16 (no avx512_bf16, AMX or bf16 GPU)"])
    finally:
        compute.native_bf16.cache_clear()
        compute.trainer_precision.cache_clear()



@pytest.mark.parametrize("native", [True, False])
def test_engine_dtype_samples_from_a_synced_bf16_copy(tmp_path, monkeypatch, native):
    """engine.dtype=bf16_if_native: where the CPU computes bf16 the in-process engine samples from a
    bfloat16 copy of the fp32 policy (its log-probs not exact, so old log-probs are recomputed and
    the mismatch correction is on), and every weight sync overwrites the copy with the trained
    weights; elsewhere it shares the policy's weights, as engine.dtype=auto does."""
    import asyncio

    from seekrl.build import build_rl, engine_dtype
    from seekrl.train import compute
    from seekrl.train.rl import rl_step

    monkeypatch.setattr(compute.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native, raising=False)
    compute.native_bf16.cache_clear()
    try:
        cfg = load_config("examples/tiny_grpo.yaml", [f"log.dir={tmp_path}", "log.name=rl", "log.progress=false", "train.steps=2",
                                                      "engine.dtype=bf16_if_native", "train.lr=1e-2"])
        assert engine_dtype(cfg, "cpu") == ("bfloat16" if native else "float32")
        assert engine_dtype(load_config(None, []), "cpu") == "float32"  # auto: model.dtype
        run = build_rl(cfg)
        try:
            engine_model = run.engine.model
            assert (engine_model is run.model) is not native
            assert next(engine_model.parameters()).dtype == (torch.bfloat16 if native else torch.float32)
            assert run.engine.exact_logprobs is not native and run.reuse_engine_logprobs is not native
            asyncio.run(run.rollout.publish(run.model, 0))
            before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
            metrics = asyncio.run(rl_step(run, 1))
            trained = dict(run.model.named_parameters())
            assert any(not torch.equal(before[n], p) for n, p in trained.items())  # the policy moved
            for n, p in engine_model.named_parameters():  # and the engine samples from it (in its own dtype)
                assert torch.equal(p, trained[n].detach().to(p.dtype)), n
            if native:
                assert metrics["mismatch/kl"] > 0  # bf16 sampling against the fp32 trainer: measured, and corrected
        finally:
            run.close()
    finally:
        compute.native_bf16.cache_clear()
