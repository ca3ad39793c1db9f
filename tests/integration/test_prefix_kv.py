"""LocalEngine's KV cache across turns (`rollout.reuse_kv_tokens`, engines/prefix_kv.py) against a
full re-prefill of the whole history: the same tokens and log-probs (to float rounding), turn after
turn, for episodes of different lengths in one batch, on both decode paths; only the new tokens
are prefilled; first turns written from one template prefill the shared start once; a weight
update empties the store; the store keeps to its token budget."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from seekrl.engines import LocalEngine
from seekrl.engines.prefix_kv import PrefixKV
from seekrl.types import SamplingParams


def _episodes(engine, prompts, turns=3, seed=0, greedy_turns=0, same_obs=False):
    """Each episode: sample, append the sampled ids and a fixed 'tool output', ask again (its first
    `greedy_turns` turns greedy, with the same budget and tool output in every episode if `same_obs`)."""
    rng = random.Random(seed)
    obs = [[rng.randrange(5, 100) for _ in range(3 + 4 * i)] for i in range(len(prompts))]
    if same_obs:
        obs = [obs[0]] * len(prompts)

    async def one(i, prompt):
        out, ids = [], list(prompt)
        for t in range(turns):
            greedy = t < greedy_turns
            p = SamplingParams(max_new_tokens=8 if greedy else 6 + 3 * ((i + t) % 3), temperature=0.0 if greedy else 1.0,
                               seed=None if greedy else 1000 * i + t)
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


def test_a_group_that_samples_the_same_turn_feeds_its_new_tokens_once(sharp_tiny, tiny_tokenizer):
    """The samples of a group that write the same first turn (greedy here) ask for the same second
    prompt: with the store on they take one stored prefix and feed the tool output once, and still
    sample what a full re-prefill samples; the store on prefills fewer tokens than off."""
    model = sharp_tiny(5)
    prompts = [[11, 12, 13, 14, 15, 16]] * 4 + [[21, 22, 23]] * 3
    full = LocalEngine(model, tiny_tokenizer, seed=0)
    reuse = LocalEngine(model, tiny_tokenizer, seed=0, reuse_kv_tokens=100_000)
    a = _episodes(full, prompts, greedy_turns=2, same_obs=True)
    b = _episodes(reuse, prompts, greedy_turns=2, same_obs=True)
    assert [t for t, _ in a[0][:2]] == [t for t, _ in a[3][:2]]  # the group's first two turns are the same
    for ea, eb in zip(a, b):
        for (ta, la), (tb, lb) in zip(ea, eb):
            assert ta == tb
            torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), atol=1e-5, rtol=0)
    assert reuse.prefix_kv.stats["hits"] == 2 * len(prompts)  # every later turn reused its prefix
    assert reuse.stats["prefill_tokens"] < full.stats["prefill_tokens"]
    full.close()
    reuse.close()


@pytest.mark.parametrize("compile", ["false", "auto"])
def test_prompts_from_one_template_prefill_their_shared_start_once(sharp_tiny, tiny_tokenizer, compile):
    """First turns share no finished request, but a template's start: the second prompt that misses
    pins the common start, and every later prompt prefills only its own tail, with the tokens and
    log-probs of a full prefill."""
    model = sharp_tiny(7)
    rng = random.Random(2)
    start = [rng.randrange(5, 100) for _ in range(40)]
    prompts = [start + [100 + i] + [rng.randrange(5, 100) for _ in range(2 + 3 * i)] for i in range(6)]
    full = LocalEngine(model, tiny_tokenizer, seed=0, compile=compile)
    reuse = LocalEngine(model, tiny_tokenizer, seed=0, compile=compile, reuse_kv_tokens=100_000)
    a, b = _episodes(full, prompts, turns=2), _episodes(reuse, prompts, turns=2)
    for ea, eb in zip(a, b):
        for (ta, la), (tb, lb) in zip(ea, eb):
            assert ta == tb
            torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), atol=1e-5, rtol=0)
    st = reuse.prefix_kv.stats
    assert st["pinned"] == 1 and st["misses"] == 1  # the first prompt alone prefilled its start
    assert st["hits"] == (len(prompts) - 1) + len(prompts)  # the other first turns, and every second turn
    # the start went through the model twice (the first prompt, the pin), not six times
    first_turns = sum(len(p) for p in prompts)
    assert full.stats["prefill_tokens"] - reuse.stats["prefill_tokens"] >= first_turns - sum(len(p) - 40 for p in prompts) - 2 * 40
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
    # a key that extends the prompt serves all but its last token (fed for its logits), and is not used up
    part = store.take([5, 6, 7, 8])
    assert part is not None and part.length == 3 and part.layers is store._entries[(5, 6, 7, 8)].layers
    assert store.take([5, 6, 7]).length == 2 and store.take([5]) is None and store.take([5, 6, 9]) is None
    e = store.take([5, 6, 7, 8, 1])
    assert e is not None and e.length == 4 and store.take([5, 6, 7, 8, 1]) is None  # served once
    store.put(list(range(11)), kv)  # longer than the whole budget: not kept
    assert len(store) == 1 and store.tokens == 4
    store.put([1, 1], lambda: kv)
    store.put([1, 1], lambda: pytest.fail("a stored key's keys and values are not copied again"))
    assert len(store) == 2 and store.tokens == 6  # one copy, counted once
    first, second = store.take([1, 1, 2]), store.take([1, 1, 3])  # two requests, each at its own time
    assert first is second is not None and store.take([1, 1, 4]) is None and store.tokens == 4
    store.put([2, 2], kv)
    store.put([2, 2], kv)
    assert store.take([2, 2, 5], requests=2) is not None and store.take([2, 2, 5]) is None

    pins = PrefixKV(100)
    tpl = list(range(1, 41))
    assert pins.shared_start(tpl + [50, 51]) == 0  # no earlier miss
    assert pins.shared_start(list(range(1, 20)) + [60]) == 0  # 19 common tokens: under SHARED_MIN_TOKENS
    assert pins.shared_start(tpl + [52]) == 0 and pins.shared_start(tpl + [53, 54]) == 40
    pins.pin(tpl, kv)
    hits = [pins.take(tpl + [70 + i], prefill=lambda ids: pytest.fail("a stored start is not prefilled again")) for i in range(5)]
    assert all(h is not None and h.length == 40 and h.pinned for h in hits) and len(pins) == 1  # never used up
    assert pins.shared_start(tpl[:-1]) == 38  # never the whole prompt: one token at least to feed
    pins.clear()
    assert len(pins) == 0 and pins.shared_start(tpl + [1]) == 0  # the previous miss is forgotten with the weights
    calls = []
    fresh = PrefixKV(100)
    assert fresh.take(tpl + [1, 2], prefill=lambda ids: calls.append(ids) or kv) is None  # the first miss: nothing to share
    e = fresh.take(tpl + [3], prefill=lambda ids: calls.append(ids) or kv)  # the second: its shared start, pinned
    assert e is not None and e.pinned and e.length == 40 and calls == [tpl]
    assert fresh.stats["misses"] == 1 and fresh.stats["hits"] == 1 and fresh.stats["pinned"] == 1
    assert fresh.take(list(range(100, 140)) + [1], prefill=lambda ids: None) is None  # nothing to share yet
    assert fresh.take(list(range(100, 140)) + [2], prefill=lambda ids: None) is None  # a start that cannot be stored
    assert fresh.stats["pinned"] == 1 and len(fresh) == 1


@pytest.mark.parametrize("compile", ["false", "auto"])
def test_a_context_sampled_again_after_its_turn_finished_reuses_that_turns_kv(sharp_tiny, tiny_tokenizer, compile):
    """Answer branches (rollout.answer_branches): after a turn finished, its context is asked for
    again by several seeded requests at once. The finished turn's stored key extends that context,
    so the branches feed only its last token, once, and sample what a full prefill samples."""
    model = sharp_tiny(5)
    rng = random.Random(3)
    context = [rng.randrange(5, 100) for _ in range(37)]
    full = LocalEngine(model, tiny_tokenizer, seed=0, compile=compile)
    reuse = LocalEngine(model, tiny_tokenizer, seed=0, compile=compile, reuse_kv_tokens=100_000)

    async def go(engine):
        first = await engine.generate(context, SamplingParams(max_new_tokens=6, temperature=1.0, seed=1, ignore_eos=True))
        before = engine.stats["prefill_tokens"]
        more = await asyncio.gather(*(engine.generate(context, SamplingParams(max_new_tokens=6, temperature=1.0, seed=10 + j, ignore_eos=True))
                                      for j in range(3)))
        return first, more, engine.stats["prefill_tokens"] - before

    (fa, ma, pa), (fb, mb, pb) = asyncio.run(go(full)), asyncio.run(go(reuse))
    assert len(fb.token_ids) > 1  # the first turn left its keys and values
    for a, b in zip([fa, *ma], [fb, *mb]):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)
    assert len({tuple(c.token_ids) for c in mb}) > 1  # own seeds: the branches differ
    assert pa == len(context) and pb == 1  # a full prefill of the context once, against its last token once
    full.close()
    reuse.close()
