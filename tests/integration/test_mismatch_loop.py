"""The trainer/engine boundary in the RL loop: the mismatch correction, the agreement check, the
weight-version check and infrastructure failures (train/agreement.py, algo/mismatch.py).

The tiny model's LocalEngine gives exact log-probs; each test bends one thing about it (its
log-probs, its versions, a failing request) and reads what the loop measured and trained on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math

import pytest
import torch

from seekrl.build import build_rl
from seekrl.config import load_config
from seekrl.engines.local import LocalEngine
from seekrl.errors import EngineRequestError
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import undocumented
from seekrl.train import rl


@pytest.fixture(autouse=True)
def spread_reward(tmp_path, monkeypatch):
    """A reward with spread in every group (the completion's length), so every step has a gradient."""
    (tmp_path / "spread_reward.py").write_text("def reward(completion, task, **ctx):\n    return len(completion) / 40.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def _cfg(tmp_path, name, *overrides):
    base = [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy", "data.max_train=8",
        "rollout.group_size=4", "rollout.batch_size=8", "rollout.max_new_tokens=6", "rollout.max_prompt_tokens=32",
        "reward.functions=[spread_reward:reward]", "train.lr=1e-3", "train.steps=2", f"log.dir={tmp_path}", f"log.name={name}",
        "log.progress=false", "log.tensorboard=false",
    ]
    return load_config(None, base + list(overrides))


def _run(cfg, bend=None):
    comp = build_rl(cfg)
    if bend is not None:
        bend(comp.engine)
    before = {n: p.detach().clone() for n, p in comp.model.named_parameters()}
    try:
        asyncio.run(rl.run(comp))
    finally:
        comp.close()
    changed = any(not torch.equal(before[n], p.detach()) for n, p in comp.model.named_parameters())
    return read_metrics(comp.run_dir), changed


def _shift_logprobs(engine, by: float):
    real = engine.generate

    async def generate(prompt_ids, params, *, rid=None):
        c = await real(prompt_ids, params, rid=rid)
        return dataclasses.replace(c, logprobs=[lp - by for lp in c.logprobs])

    engine.generate = generate


def _inexact(monkeypatch):
    """The LocalEngine built by build_rl says its log-probs are inexact, as a bf16 / vLLM engine does."""
    real = LocalEngine.__init__
    monkeypatch.setattr(LocalEngine, "__init__", lambda self, *a, **k: real(self, *a, **{**k, "exact_logprobs": False}))


def test_exact_engine_agrees_and_is_not_corrected(tmp_path):
    rows, changed = _run(_cfg(tmp_path, "exact"))
    assert changed and not undocumented(rows[-1])
    for r in rows[1:]:
        assert r["mismatch/kl"] < 1e-6 and r["mismatch/disagree"] == 0.0  # one completion recomputed per step
        assert r["mismatch/masked_frac"] == 0.0 and "mismatch/truncated_frac" not in r  # no correction: exact log-probs
        assert r["rollout/excluded_frac"] == 0.0


def test_inexact_engine_gets_tis_by_default_and_the_gap_is_measured(tmp_path, monkeypatch, caplog):
    _inexact(monkeypatch)  # old log-probs recomputed
    with caplog.at_level(logging.WARNING, logger="seekrl.train.agreement"):
        rows, changed = _run(_cfg(tmp_path, "tis"), bend=lambda e: _shift_logprobs(e, 1.0))
    assert changed and not undocumented(rows[-1])
    for r in rows[1:]:
        # every engine log-prob is 1 lower than the trainer's: ρ = e per token, k3 = e - 2
        assert r["mismatch/kl"] == pytest.approx(math.e - 2, abs=1e-3)
        assert r["mismatch/ratio_max"] == pytest.approx(math.e, rel=1e-3)
        assert r["mismatch/truncated_frac"] == pytest.approx(1.0)  # e > algo.mismatch_cap=2
        assert r["mismatch/disagree"] == 1.0
    warnings = [m for m in caplog.messages if "disagree" in m]
    assert len(warnings) == 1 and "train.agreement_max_kl" in warnings[0]


def test_mis_drops_the_tokens_past_the_cap(tmp_path, monkeypatch):
    _inexact(monkeypatch)
    rows, changed = _run(_cfg(tmp_path, "mis", "algo.mismatch=mis", "algo.mismatch_cap=2"), bend=lambda e: _shift_logprobs(e, 1.0))
    assert all(r["mismatch/masked_frac"] == pytest.approx(1.0) for r in rows[1:])
    assert not changed  # every token weighs 0: nothing to learn from


def test_samples_from_an_unexpected_version_are_refused(tmp_path):
    def bend(engine):
        real = engine.generate

        async def generate(prompt_ids, params, *, rid=None):
            c = await real(prompt_ids, params, rid=rid)
            return dataclasses.replace(c, version=c.version + 7, versions=None)  # a server that did not load the new weights

        engine.generate = generate

    rows, changed = _run(_cfg(tmp_path, "versions"), bend)
    assert not changed
    for r in rows[1:]:
        assert r["rollout/excluded/version_mismatch"] == 8.0 and r["rollout/excluded_frac"] == 1.0


def test_failed_engine_requests_are_left_out_not_scored_zero(tmp_path):
    calls = {"n": 0}

    def bend(engine):
        real = engine.generate

        async def generate(prompt_ids, params, *, rid=None):
            calls["n"] += 1
            if calls["n"] % 4 == 0:
                raise EngineRequestError("the server refused the request (400)")
            return await real(prompt_ids, params, rid=rid)

        engine.generate = generate

    rows, changed = _run(_cfg(tmp_path, "engine_error"), bend)
    assert changed
    for r in rows[1:]:
        assert r["rollout/excluded/engine_error"] == 2.0 and r["rollout/excluded_frac"] == pytest.approx(0.25)
        assert r["reward/min"] >= 0.0 and not undocumented(r)
