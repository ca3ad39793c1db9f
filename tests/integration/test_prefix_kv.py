"""LocalEngine's KV cache across turns (`rollout.reuse_kv_tokens`, engines/prefix_kv.py) against a
full re-prefill of the whole history: the same tokens and log-probs (to float rounding), turn after
turn, for episodes of different lengths in one batch, on both decode paths; only the new tokens
are prefilled; a weight update empties the store; the store keeps to its token budget."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from seekrl.engines import LocalEngine
from seekrl.engines.prefix_kv import PrefixKV
from seekrl.types import SamplingParams


def _episodes(engine, prompts, turns=3, seed=0):
    """Each episode: sample, append the sampled ids and a fixed 'tool output', ask again."""
    rng = random.Random(seed)
    obs = [[rng.randrange(5, 100) for _ in range(3 + 4 * i)] for i in range(len(prompts))]

    async def one(i, prompt):
        out, ids = [], list(prompt)
        for t in range(turns):
            p = SamplingParams(max_new_tokens=6 + 3 * ((i + t) % 3), temperature=1.0, seed=1000 * i + t)
            c = await engine.generate(ids, p)
            out.append((c.token_ids, c.logprobs))
            ids = ids + c.token_ids + obs[i][: 2 + t]
        return out

    async def run():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(run())


@pytest.mark.parametrize("compile", ["false", "auto"])
def test_reused_kv_samples_what_a_full_reprefill_samples(sharp_tiny, tiny_tokenizer, compile):
    model = sharp_tiny(5)
    rng = random.Random(1)
    prompts = [[rng.randrange(5, 100) for _ in range(n)] for n in (3, 9, 17, 30, 5, 12)]
    full = LocalEngine(model, tiny_tokenizer, seed=0, compile=compile)
    reuse = LocalEngine(model, tiny_tokenizer, seed=0, compile=compile, reuse_kv_tokens=100_000)
    a, b = _episodes(full, prompts), _episodes(reuse, prompts)
    for ea, eb in zip(a, b):
        for (ta, la), (tb, lb) in zip(ea, eb):
            assert ta == tb
            torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), atol=1e-5, rtol=0)
    # later turns prefilled only what followed the stored prefix
    assert reuse.prefix_kv.stats["hits"] == 2 * len(prompts) and reuse.stats["reused_tokens"] > 0
    assert reuse.stats["prefill_tokens"] < full.stats["prefill_tokens"]
    full.close()
    reuse.close()


def test_weight_update_empties_the_store_and_the_budget_holds(sharp_tiny, tiny_tokenizer):
    model = sharp_tiny(6)
    engine = LocalEngine(model, tiny_tokenizer, seed=0, reuse_kv_tokens=100_000)

    async def go():
        c = await engine.generate([7, 8, 9, 10], SamplingParams(max_new_tokens=5, temperature=1.0, seed=3))
        assert len(engine.prefix_kv) == (1 if len(c.token_ids) > 1 else 0)
        await engine.update_weights(model, 1)
        assert len(engine.prefix_kv) == 0 and engine.prefix_kv.tokens == 0

    asyncio.run(go())
    engine.close()

    store = PrefixKV(10)
    kv = [(torch.zeros(2, 4, 3), torch.zeros(2, 4, 3))]
    store.put([1, 2, 3, 4], kv)
    store.put([5, 6, 7, 8], kv)
    store.put([9, 9, 9, 9], kv)  # 12 > 10 tokens: the oldest goes
    assert len(store) == 2 and store.tokens == 8 and store.stats["dropped"] == 1
    assert store.take([1, 2, 3, 4, 5]) is None  # dropped
    assert store.take([5, 6, 7, 8]) is None  # a key must be a proper prefix: one token at least to prefill
    e = store.take([5, 6, 7, 8, 1])
    assert e is not None and e.length == 4 and store.take([5, 6, 7, 8, 1]) is None  # served once
    store.put(list(range(11)), kv)  # longer than the whole budget: not kept
    assert len(store) == 1 and store.tokens == 4
