"""LocalEngine's static KV cache and compiled decode (engines/static_decode.py) against the default
DynamicCache path, on a tiny random Llama: same seeds give the same tokens and log-probs (1e-5)
with rows of different prompt lengths, rows joining a running batch and leaving it (compaction),
seeded and greedy requests, a weight update between calls, retract and in-place pauses.

Compiling is slow on CPU, so the compiled engine is built once (module scope) and every compiled
scenario keeps to one shape bucket (at most 4 rows, under 128 columns): one graph for the module.
Bucket changes (rows 8 -> 4, columns 128 -> 256) are checked on the same static cache run eagerly.
"""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest
import torch

from seekrl.config import ConfigError, load_config
from seekrl.engines import LocalEngine
from seekrl.engines.static_decode import (
    AUTO_COMPILE_AFTER,
    DecodeGraphs,
    StaticKV,
    _compile_unavailable,
    decode_graphs,
    len_bucket,
    rows_bucket,
)
from seekrl.types import SamplingParams

TEXTS = [
    "Question: what is the capital of France?",
    "12 + 30 =",
    "the quick brown fox jumps over the lazy dog, and then",
    "<search>",
    "copy: 1 2",
    "<information> Paris is the capital </information>",
]


def run(coro, timeout=120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _until(cond, timeout=30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]


@pytest.fixture(scope="module")
def models(sharp_tiny):
    """Two tiny Llamas whose samples vary (weights N(0, 0.15): ~125 distinct tokens in 600). The
    conftest's sharper N(0, 0.25) models blow the hidden states up enough that float32 noise alone
    reaches 1e-5 over 160 tokens: there the DynamicCache path is 1.2e-5 off a full forward pass,
    and the static path within 1.4e-5 of it (mean 1.2e-6), same tokens."""
    return sharp_tiny(3, std=0.15), sharp_tiny(4, std=0.15)


@pytest.fixture(scope="module")
def compiled(models, tiny_tokenizer):
    """One compiled engine for the module, over a private copy of models[0] (the update test swaps
    its weights and puts them back)."""
    why = _compile_unavailable()
    if why:
        pytest.skip(f"torch.compile does not work here: {why}")
    engine = LocalEngine(copy.deepcopy(models[0]), tiny_tokenizer, max_batch_size=4, compile="true")
    assert engine.decode_graphs is not None and engine.decode_graphs.compile
    return engine


def mixed_params(n: int, long: int = 40) -> list[SamplingParams]:
    """Different temperatures / filters / lengths (rows end at different steps), greedy and seeded."""
    kinds = [
        SamplingParams(max_new_tokens=long, temperature=1.0, ignore_eos=True),
        SamplingParams(max_new_tokens=9, temperature=0.0),
        SamplingParams(max_new_tokens=long - 13, temperature=0.7, top_k=5),
        SamplingParams(max_new_tokens=17, temperature=1.0, top_p=0.8, seed=7),
        SamplingParams(max_new_tokens=long - 5, temperature=1.3, ignore_eos=True),
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=11, ignore_eos=True),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


def generate_all(engine, prompts, params, seed=0):
    engine.generator.manual_seed(seed)

    async def go():
        return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params)))

    return run(go())


def assert_same(got, ref, tol=1e-5):
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    for a, b in zip(got, ref):
        assert a.finish_reason == b.finish_reason and a.token_versions() == b.token_versions()
        assert a.logprobs == pytest.approx(b.logprobs, abs=tol)


def test_buckets_and_modes(tiny_model, tiny_tokenizer):
    assert [rows_bucket(n) for n in (1, 4, 5, 8, 9, 64)] == [4, 4, 8, 8, 16, 64]
    assert [len_bucket(n) for n in (1, 128, 129, 700, 1024, 1025, 3000)] == [128, 128, 256, 1024, 1024, 2048, 3072]
    assert LocalEngine(tiny_model, tiny_tokenizer).decode_graphs is None  # the default: today's path
    auto_cpu = LocalEngine(tiny_model, tiny_tokenizer, compile="auto").decode_graphs  # auto on CPU: the static cache, eager
    assert auto_cpu is not None and not auto_cpu.compile
    assert LocalEngine(tiny_model, tiny_tokenizer, compile=False).decode_graphs is None
    with pytest.raises(ValueError, match="compile must be one of auto, true, false"):
        LocalEngine(tiny_model, tiny_tokenizer, compile="bogus")
    on_cuda = decode_graphs(tiny_model, "auto", torch.device("cuda"))  # built lazily: no GPU needed
    assert on_cuda is not None and on_cuda.compile_after == AUTO_COMPILE_AFTER
    assert decode_graphs(tiny_model, True, torch.device("cpu")).compile_after == 0


def test_auto_compiles_a_bucket_after_it_served_enough_steps(models, tiny_tokenizer, prompts):
    model = models[0]
    engine = LocalEngine(model, tiny_tokenizer, max_batch_size=4)
    graphs = DecodeGraphs(model, compile=False, compile_after=5)
    calls = []

    def fake_compiled(*args):  # stands in for the compiled graph: the same forward, counted
        calls.append(args[0].shape)
        return graphs._forward(*args)

    graphs._compiled_fn, graphs.compile = fake_compiled, True
    engine.decode_graphs = graphs
    ps, params = prompts[:4], mixed_params(4)
    got = generate_all(engine, ps, params, seed=4)
    steps = sum(graphs.steps.values())
    assert len(calls) == steps - 5 > 0 and list(graphs.compiled) == [(4, 128)]
    assert_same(got, generate_all(LocalEngine(model, tiny_tokenizer, max_batch_size=4), ps, params, seed=4))


def test_config_key():
    assert load_config(None).rollout.compile == "auto"  # the default
    assert load_config(None, ["rollout.compile=true"]).rollout.compile == "true"  # YAML's boolean, normalised
    assert load_config(None, ["rollout.compile=auto"]).rollout.compile == "auto"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.compile=bogus"])
    assert str(e.value) == "rollout.compile: 'bogus' is not one of auto, true, false"


def test_static_cache_eager_matches_the_dynamic_cache_across_buckets(models, tiny_tokenizer, prompts):
    """8 rows (row bucket 8), rows ending at different steps (compaction: bucket 4), a long row that
    outgrows 128 columns (bucket 256), then rows joining a running batch of 3."""
    model = models[0]
    dynamic = LocalEngine(model, tiny_tokenizer, max_batch_size=8)
    static = LocalEngine(model, tiny_tokenizer, max_batch_size=8)
    static.decode_graphs = DecodeGraphs(model, compile=False)  # the static cache, eager
    ps = (prompts + prompts)[:8]
    params = mixed_params(8, long=160)
    ref = generate_all(dynamic, ps, params, seed=1)
    got = generate_all(static, ps, params, seed=1)
    assert_same(got, ref)
    assert max(len(c.token_ids) for c in got) == 160
    # eager decodes only the rows and columns in use: rows left (8 -> fewer) and columns grew past the 128 bucket
    rows, cols = {k[0] for k in static.decode_graphs.steps}, {k[1] for k in static.decode_graphs.steps}
    assert 8 in rows and min(rows) < 4 and min(cols) <= 128 < max(cols)
    dynamic.max_batch_size = static.max_batch_size = 3  # 9 requests, at most 3 rows: 6 join as rows end
    ps, params = (prompts + prompts[:3]), mixed_params(9)
    ref = generate_all(dynamic, ps, params, seed=2)
    got = generate_all(static, ps, params, seed=2)
    assert_same(got, ref)
    assert static.stats["joined"] == 6 == dynamic.stats["joined"]


def test_compiled_matches_the_dynamic_cache_with_joins_and_compaction(compiled, models, tiny_tokenizer, prompts):
    dynamic = LocalEngine(models[0], tiny_tokenizer, max_batch_size=4)
    ps, params = prompts + prompts[:2], mixed_params(8)  # 8 requests, 4 rows at most: 4 join as rows end
    joined = compiled.stats["joined"]
    ref = generate_all(dynamic, ps, params, seed=5)
    got = generate_all(compiled, ps, params, seed=5)
    assert_same(got, ref)
    assert compiled.stats["joined"] - joined == 4
    assert list(compiled.decode_graphs.compiled) == [(4, 128)]  # one graph, compiled once
    assert not compiled.decode_graphs.warned
    # the trainer's view: a full forward pass gives the same log-probs
    for p, sp, c in zip(ps, params, got):
        ids = torch.tensor([p + c.token_ids])
        with torch.no_grad():
            logits = models[0](ids).logits[0, len(p) - 1 : -1].float()
        T = sp.temperature if sp.temperature > 0 else 1.0
        ref_lp = torch.log_softmax(logits / T, -1).gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        assert (ref_lp - torch.tensor(c.logprobs)).abs().max().item() < 1e-4


def test_compiled_graph_sees_weight_updates(compiled, models, tiny_tokenizer, prompts):
    ps, params = prompts[:4], mixed_params(4)
    v = compiled.version
    run(compiled.update_weights(models[1], v + 1))
    try:
        ref = generate_all(LocalEngine(models[1], tiny_tokenizer, max_batch_size=4, version=v + 1), ps, params, seed=3)
        got = generate_all(compiled, ps, params, seed=3)
        assert_same(got, ref)
        before = generate_all(LocalEngine(models[0], tiny_tokenizer, max_batch_size=4), ps, params, seed=3)
        assert [c.token_ids for c in before] != [c.token_ids for c in got]  # the update changed the samples
    finally:
        run(compiled.update_weights(models[0], v + 2))
    assert list(compiled.decode_graphs.compiled) == [(4, 128)]  # the same graph, new weights


def test_compiled_retract_and_in_place_pause(compiled, models, tiny_tokenizer, prompts):
    """A retracted request continues as if uncut; one parked in place under a weight swap samples
    its later tokens with the new weights, exactly as the DynamicCache path does."""
    params = SamplingParams(max_new_tokens=70, temperature=1.0, seed=21, ignore_eos=True)
    uncut = run(compiled.generate(prompts[0], params))

    async def retract():
        task = asyncio.create_task(compiled.generate(prompts[0], params))
        start = compiled.stats["forward_steps"]
        await _until(lambda: compiled.stats["forward_steps"] > start + 20)
        compiled.pause("retract")
        await _until(lambda: not compiled._busy)
        compiled.resume()
        return await task

    cut = run(retract())
    assert cut.token_ids == uncut.token_ids and cut.logprobs == pytest.approx(uncut.logprobs, abs=1e-5)

    v = compiled.version

    async def in_place(engine):
        task = asyncio.create_task(engine.generate(prompts[0], params))
        start = engine.stats["forward_steps"]
        await _until(lambda: engine.stats["forward_steps"] > start + 20)
        engine.pause("in_place")
        await engine.update_weights(models[1], v + 1)
        engine.resume()
        return await task

    try:
        swapped = run(in_place(compiled))
    finally:
        run(compiled.update_weights(models[0], v + 2))
    k = swapped.versions.index(v + 1)
    assert 20 < k < 70 and swapped.token_ids[:k] == uncut.token_ids[:k]
    # the DynamicCache path with the same swap: before the forward pass that gives token k
    dynamic = LocalEngine(copy.deepcopy(models[0]), tiny_tokenizer, version=v)
    checkpoint = dynamic._checkpoint

    def swap_at_k():
        if dynamic.stats["forward_steps"] == k:  # the prefill and k - 1 decode steps are done
            dynamic._load_weights(models[1])
            dynamic.version = v + 1
        return checkpoint()

    dynamic._checkpoint = swap_at_k
    ref = run(dynamic.generate(prompts[0], params))
    assert ref.versions == swapped.versions
    assert_same([swapped], [ref])


def test_a_failing_compile_warns_once_and_decodes_eagerly(models, tiny_tokenizer, prompts, caplog, monkeypatch):
    model = models[0]
    engine = LocalEngine(model, tiny_tokenizer, max_batch_size=4)
    graphs = DecodeGraphs(model, compile=False)
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("inductor: no C++ compiler found\nmore detail")

    graphs._compiled_fn, graphs.compile = broken, True
    engine.decode_graphs = graphs
    ps, params = prompts[:4], mixed_params(4)
    with caplog.at_level(logging.WARNING, logger="seekrl.engines.static_decode"):
        got = generate_all(engine, ps, params, seed=9)
        again = generate_all(engine, ps, params, seed=9)
    warnings = [r.getMessage() for r in caplog.records if "rollout.compile" in r.getMessage()]
    assert len(warnings) == 1 and len(calls) == 1
    assert "RuntimeError: inductor: no C++ compiler found" in warnings[0] and "\n" not in warnings[0]
    ref = generate_all(LocalEngine(model, tiny_tokenizer, max_batch_size=4), ps, params, seed=9)
    assert_same(got, ref)
    assert_same(again, ref)


def test_static_kv_merge_and_select_keep_rows_aligned(tiny_model):
    """StaticKV's bookkeeping directly: merging a longer prefill shifts the running rows right;
    selecting rows moves them to the front and cuts the columns nobody attends to."""
    from transformers import DynamicCache

    def prefill(lens):
        L = max(lens)
        mask = torch.tensor([[0] * (L - n) + [1] * n for n in lens])
        cache = DynamicCache(config=tiny_model.config)
        with torch.no_grad():
            tiny_model(input_ids=torch.randint(3, 100, mask.shape), attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp_min(0), past_key_values=cache, use_cache=True)
        return cache, mask

    kv = StaticKV(DecodeGraphs(tiny_model, compile=False), pad_id=0)
    c1, m1 = prefill([3, 5])
    kv.merge(c1, m1)
    c2, m2 = prefill([9])
    kv.merge(c2, m2)
    assert (kv.n, kv.L, kv.R, kv.C) == (3, 9, 4, 128)
    assert kv.mask_RC[:3, :9].sum(1).tolist() == [3, 5, 9]
    k0 = kv.cache.layers[0].keys
    torch.testing.assert_close(k0[1, :, 4:9], c1.layers[0].keys[1])  # row 1 shifted right by 4
    torch.testing.assert_close(k0[2, :, :9], c2.layers[0].keys[0])
    kv.select(torch.tensor([0, 1]))  # the longest row leaves: 4 columns are padding for both
    assert (kv.n, kv.L) == (2, 5)
    assert kv.mask_RC[:2, :5].sum(1).tolist() == [3, 5] and kv.mask_RC[2:].all()
    torch.testing.assert_close(kv.cache.layers[0].keys[1, :, :5], c1.layers[0].keys[1])
    # a middle row leaves, no column is cut: the rows after it move up, the buffers stay (eager
    # shrinks only to a quarter), and at 3 of 16 rows they shrink with the rows intact
    kv = StaticKV(DecodeGraphs(tiny_model, compile=False), pad_id=0)
    c3, m3 = prefill([4] * 9)
    kv.merge(c3, m3)
    assert (kv.n, kv.R) == (9, 16)
    kv.select(torch.tensor([0, 1, 3, 4, 5, 6]))
    assert (kv.n, kv.L, kv.R) == (6, 4, 16)
    for layer, src in zip(kv.cache.layers, c3.layers):
        torch.testing.assert_close(layer.keys[:6, :, :4], src.keys[[0, 1, 3, 4, 5, 6]])
        torch.testing.assert_close(layer.values[:6, :, :4], src.values[[0, 1, 3, 4, 5, 6]])
    kv.select(torch.tensor([1, 4, 5]))
    assert (kv.n, kv.L, kv.R) == (3, 4, 4) and kv.mask_RC[:3, :4].all() and kv.mask_RC[3:].all()
    torch.testing.assert_close(kv.cache.layers[-1].keys[:3, :, :4], c3.layers[-1].keys[[1, 5, 6]])


def test_unsupported_attention_keeps_the_dynamic_cache_and_warns_once(models, tiny_tokenizer, prompts, caplog):
    model = models[0]
    engine = LocalEngine(model, tiny_tokenizer, max_batch_size=4)
    engine.decode_graphs = graphs = DecodeGraphs(model, compile=False)
    graphs.attn = "flash_attention_2"  # a 4D mask cannot be passed to it: the DynamicCache path
    ps, params = prompts[:4], mixed_params(4)
    with caplog.at_level(logging.WARNING, logger="seekrl.engines.static_decode"):
        got = generate_all(engine, ps, params, seed=6)
        generate_all(engine, ps, params, seed=6)
    assert sum("keeps the DynamicCache decode" in r.getMessage() for r in caplog.records) == 1
    assert not graphs.steps  # no static decode step ran
    assert_same(got, generate_all(LocalEngine(model, tiny_tokenizer, max_batch_size=4), ps, params, seed=6))
