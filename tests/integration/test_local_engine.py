"""LocalEngine against a plain forward pass and `model.generate`, on a tiny random Llama.

The central check is log-prob agreement: what the engine reports for each sampled token must be
what the trainer recomputes with `log_softmax(model(prompt + completion).logits / T)`.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seekrl.engines import InferenceEngine, LocalEngine
from seekrl.models import encode_chat, make_tiny_model
from seekrl.types import SamplingParams

PROMPTS = [
    "Question: what is the capital of France?",
    "12 + 30 =",
    "the quick brown fox jumps over the lazy dog, and then",
    "<search>",
]


@pytest.fixture(scope="module")
def sharp_model(tiny_tokenizer):
    """A tiny model with larger weights, so greedy outputs vary and sampling is not uniform."""
    model = make_tiny_model(tiny_tokenizer, seed=3)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.25, generator=gen)
    return model.eval()


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


def run(coro, timeout=60.0):
    """asyncio.run with a deadline, so a request the engine loses fails instead of hanging."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def gather_generate(engine, prompts, params):
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params)))


def recompute_logprobs(model, prompt, completion, temperature):
    """The trainer's view: one right-padded-free full forward, log_softmax(logits / T)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    T = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / T, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def reference_greedy(model, prompt, n, eos_token_id):
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
        eos_token_id=eos_token_id, pad_token_id=eos_token_id,
    )
    return out[0, len(prompt) :].tolist()


def test_is_an_inference_engine(tiny_model, tiny_tokenizer):
    assert isinstance(LocalEngine(tiny_model, tiny_tokenizer), InferenceEngine)


def test_logprobs_agree_with_a_full_forward_pass(sharp_model, tiny_tokenizer, prompts):
    engine = LocalEngine(sharp_model, tiny_tokenizer, seed=1)
    params = [
        SamplingParams(max_new_tokens=24, temperature=0.7),
        SamplingParams(max_new_tokens=24, temperature=1.0),
        SamplingParams(max_new_tokens=17, temperature=0.7, top_k=5),
        SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.8),
        SamplingParams(max_new_tokens=24, temperature=1.3),
        SamplingParams(max_new_tokens=9, temperature=0.0),
    ]
    batch_prompts = prompts + prompts[:2]  # lengths differ: left padding is exercised
    completions = run(gather_generate(engine, batch_prompts, params))
    assert engine.stats["batches"] == 1
    assert engine.stats["prefill_tokens"] == sum(map(len, prompts))  # shared prompts prefilled once
    for prompt, sp, c in zip(batch_prompts, params, completions):
        assert len(c.token_ids) == len(c.logprobs) > 0
        ref = recompute_logprobs(sharp_model, prompt, c.token_ids, sp.temperature)
        assert (ref - torch.tensor(c.logprobs)).abs().max().item() < 1e-4
    assert all(lp <= 0 for c in completions for lp in c.logprobs)


def test_greedy_matches_model_generate(sharp_model, tiny_tokenizer, prompts):
    engine = LocalEngine(sharp_model, tiny_tokenizer)
    eos = tiny_tokenizer.eos_token_id
    completions = run(gather_generate(engine, prompts, SamplingParams(max_new_tokens=12, temperature=0.0)))
    distinct = set()
    for prompt, c in zip(prompts, completions):
        ref = reference_greedy(sharp_model, prompt, 12, eos)
        assert c.token_ids == ref
        distinct.update(ref)
    assert len(distinct) > 3  # the check means something: outputs are not one repeated token


def test_top_k_1_and_tiny_top_p_equal_greedy(sharp_model, tiny_tokenizer, prompts):
    engine = LocalEngine(sharp_model, tiny_tokenizer, seed=5)
    greedy = run(gather_generate(engine, prompts, SamplingParams(max_new_tokens=10, temperature=0.0)))
    top1 = run(gather_generate(engine, prompts, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1)))
    nucleus = run(gather_generate(engine, prompts, SamplingParams(max_new_tokens=10, temperature=1.0, top_p=1e-6)))
    assert [c.token_ids for c in top1] == [c.token_ids for c in greedy]
    assert [c.token_ids for c in nucleus] == [c.token_ids for c in greedy]
    hot = run(gather_generate(engine, prompts, SamplingParams(max_new_tokens=10, temperature=1.0)))
    assert [c.token_ids for c in hot] != [c.token_ids for c in greedy]


def test_rows_with_different_params_do_not_interfere(sharp_model, tiny_tokenizer, prompts):
    engine = LocalEngine(sharp_model, tiny_tokenizer, seed=0)
    alone = run(engine.generate(prompts[1], SamplingParams(max_new_tokens=10, temperature=0.0)))
    mixed = [SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9)] * len(prompts)
    mixed[1] = SamplingParams(max_new_tokens=10, temperature=0.0)
    together = run(gather_generate(engine, prompts, mixed))
    assert together[1].token_ids == alone.token_ids
    assert together[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_stop_string_stops_at_first_occurrence(sharp_model, tiny_tokenizer, prompts):
    engine = LocalEngine(sharp_model, tiny_tokenizer)
    free = run(engine.generate(prompts[0], SamplingParams(max_new_tokens=40, temperature=1.0, seed=11))).token_ids
    texts = [tiny_tokenizer.decode(free[:k]) for k in range(len(free) + 1)]
    # A stop string taken from the middle of the free-running sample (same seed => same tokens).
    stop = next(t for t in texts[6:] if len(t.strip()) >= 3).strip()[-2:]
    expect = next(k for k, t in enumerate(texts) if stop in t)  # tokens up to its first occurrence
    assert expect < len(free)
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=11, stop=("never-seen-stop", stop))
    stopped = run(engine.generate(prompts[0], params))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free[:expect]
    assert stop in tiny_tokenizer.decode(stopped.token_ids)
    assert stop not in tiny_tokenizer.decode(stopped.token_ids[:-1])


def test_eos_is_kept_with_stop_and_length_gives_exactly_max_new_tokens(sharp_model, tiny_tokenizer, prompts):
    eos = tiny_tokenizer.eos_token_id
    ref = reference_greedy(sharp_model, prompts[2], 12, eos)
    assert eos not in ref
    engine = LocalEngine(sharp_model, tiny_tokenizer)
    c = run(engine.generate(prompts[2], SamplingParams(max_new_tokens=7, temperature=0.0)))
    assert c.finish_reason == "length" and len(c.token_ids) == 7 and c.token_ids == ref[:7]
    # Declare the 4th greedy token an extra EOS id (as Llama 3 configs list several).
    model = copy.deepcopy(sharp_model)
    model.generation_config.eos_token_id = [eos, ref[3]]
    first = ref.index(ref[3])
    c = run(LocalEngine(model, tiny_tokenizer).generate(prompts[2], SamplingParams(max_new_tokens=12, temperature=0.0)))
    assert c.finish_reason == "stop"
    assert c.token_ids == ref[: first + 1] and c.token_ids[-1] == ref[3]
    assert len(c.logprobs) == len(c.token_ids)


def test_zero_max_new_tokens_and_empty_prompt(tiny_model, tiny_tokenizer):
    engine = LocalEngine(tiny_model, tiny_tokenizer)
    c = run(engine.generate([5, 6], SamplingParams(max_new_tokens=0)))
    assert (c.token_ids, c.finish_reason) == ([], "length")
    with pytest.raises(ValueError, match="empty"):
        run(engine.generate([], SamplingParams()))


def test_concurrent_calls_are_coalesced_into_batches(tiny_model, tiny_tokenizer, prompts):
    engine = LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=64)
    many = [prompts[i % len(prompts)] for i in range(10)]
    out = run(gather_generate(engine, many, SamplingParams(max_new_tokens=5)))
    assert len(out) == 10 and engine.stats["batches"] == 1 and engine.stats["requests"] == 10
    assert engine.stats["tokens"] == sum(len(c.token_ids) for c in out)
    small = LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=4)
    run(gather_generate(small, many, SamplingParams(max_new_tokens=5)))
    # at most 4 rows at once; the other 6 join the running batch as rows finish
    assert small.stats["max_rows"] == 4 and small.stats["joined"] == 6 and small.stats["requests"] == 10


def test_same_seed_same_samples_and_generator_state_restores(sharp_model, tiny_tokenizer, prompts):
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    a = LocalEngine(sharp_model, tiny_tokenizer, seed=42)
    b = LocalEngine(sharp_model, tiny_tokenizer, seed=42)
    first_a = run(gather_generate(a, prompts, params))
    first_b = run(gather_generate(b, prompts, params))
    assert [c.token_ids for c in first_a] == [c.token_ids for c in first_b]
    c = LocalEngine(sharp_model, tiny_tokenizer, seed=43)
    assert [x.token_ids for x in run(gather_generate(c, prompts, params))] != [x.token_ids for x in first_a]

    state = a.state_dict()
    second_a = run(gather_generate(a, prompts, params))
    assert [x.token_ids for x in second_a] != [x.token_ids for x in first_a]
    restored = LocalEngine(sharp_model, tiny_tokenizer, seed=0)
    restored.load_state_dict({"version": state["version"], "generator": state["generator"].tolist()})
    again = run(gather_generate(restored, prompts, params))
    assert [x.token_ids for x in again] == [x.token_ids for x in second_a]


def test_request_seed_is_independent_of_the_batch(sharp_model, tiny_tokenizer, prompts):
    engine = LocalEngine(sharp_model, tiny_tokenizer, seed=0)
    seeded = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    alone = run(engine.generate(prompts[3], seeded))
    params = [SamplingParams(max_new_tokens=12, temperature=1.0)] * 3 + [seeded]
    together = run(gather_generate(engine, prompts, params))
    assert together[3].token_ids == alone.token_ids


def test_update_weights_copies_weights_and_bumps_version(tiny_tokenizer, prompts, sharp_model, fresh_tiny_model, tmp_path):
    engine = LocalEngine(fresh_tiny_model, tiny_tokenizer, version=0)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    before = run(engine.generate(prompts[0], greedy))
    assert before.version == 0
    run(engine.update_weights(sharp_model, version=3))
    assert engine.version == 3 and engine.model is fresh_tiny_model
    assert torch.equal(fresh_tiny_model.model.layers[1].mlp.down_proj.weight, sharp_model.model.layers[1].mlp.down_proj.weight)
    after = run(engine.generate(prompts[0], greedy))
    assert after.version == 3 and after.token_ids != before.token_ids
    assert after.token_ids == reference_greedy(sharp_model, prompts[0], 10, tiny_tokenizer.eos_token_id)

    other = make_tiny_model(tiny_tokenizer, seed=9)
    other.save_pretrained(tmp_path / "ckpt")
    run(engine.update_weights(tmp_path / "ckpt", version=4))
    assert engine.version == 4 and torch.equal(fresh_tiny_model.lm_head.weight, other.lm_head.weight)

    run(engine.update_weights(fresh_tiny_model, version=5))  # shared weights: only the version moves
    assert engine.version == 5 and torch.equal(fresh_tiny_model.lm_head.weight, other.lm_head.weight)

    wrong = make_tiny_model(tiny_tokenizer, hidden_size=32)
    with pytest.raises(ValueError, match="shape"):
        run(engine.update_weights(wrong, version=6))
    assert engine.version == 5


def test_pause_holds_new_batches_until_resume(tiny_model, tiny_tokenizer, prompts):
    engine = LocalEngine(tiny_model, tiny_tokenizer)

    async def scenario():
        engine.pause()
        tasks = [asyncio.create_task(engine.generate(p, SamplingParams(max_new_tokens=3))) for p in prompts]
        await asyncio.sleep(0.05)
        held = sum(t.done() for t in tasks)
        engine.resume()
        done = await asyncio.gather(*tasks)
        return held, done

    held, done = run(scenario())
    assert held == 0 and len(done) == len(prompts) and engine.stats["batches"] == 1


def test_training_mode_is_restored_and_lora_model_generates(tiny_texts):
    pytest.importorskip("peft")
    from seekrl.models import load_model

    model, tok = load_model("tiny", tiny_texts=tiny_texts, lora_r=4, gradient_checkpointing=True)
    model.train()
    engine = LocalEngine(model, tok)
    prompt = encode_chat(tok, [{"role": "user", "content": "hi"}])
    c = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=1.0)))
    assert model.training and len(c.token_ids) == len(c.logprobs) >= 1
    model.eval()
    ref = recompute_logprobs(model, prompt, c.token_ids, 1.0)
    assert (ref - torch.tensor(c.logprobs)).abs().max().item() < 1e-4


def _smollm2_or_skip():
    from seekrl.models import smollm2_gguf_path

    try:
        return smollm2_gguf_path()
    except ValueError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_smollm2_gguf_greedy_and_logprobs():
    from seekrl.models import load_model

    _smollm2_or_skip()
    model, tok = load_model("smollm2")
    prompt = encode_chat(tok, [{"role": "user", "content": "What is the capital of France?"}])
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    engine = LocalEngine(model, tok, seed=0)
    greedy = run(engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0)))
    assert greedy.token_ids == reference_greedy(model, prompt, 8, tok.eos_token_id)
    assert "Paris" in tok.decode(greedy.token_ids)
    sampled = run(engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.7)))
    ref = recompute_logprobs(model, prompt, sampled.token_ids, 0.7)
    assert (ref - torch.tensor(sampled.logprobs)).abs().max().item() < 1e-4


def test_sampler_filters_like_hf_and_draws_the_right_frequencies():
    from seekrl.engines.sampling import _RowSampler

    probs_V = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    logits_V = probs_V.clamp_min(1e-12).log()
    cases = {  # params -> the allowed set; top-k first, then top-p on the renormalised rest (as HF)
        SamplingParams(temperature=1.0): {0, 1, 2, 3, 4},  # no filter (token 4 has p=1e-12)
        SamplingParams(temperature=1.0, top_k=3): {0, 1, 2},
        SamplingParams(temperature=1.0, top_p=0.6): {0, 1},
        SamplingParams(temperature=1.0, top_k=3, top_p=0.78): {0, 1},  # 0.75 < 0.78 < 0.833
        SamplingParams(temperature=1.0, top_p=0.78): {0, 1, 2},
    }
    params = list(cases)
    sampler = _RowSampler(params, list(range(len(params))), torch.device("cpu"))
    filtered = sampler._filter(logits_V.expand(len(params), -1).clone())
    for row, allowed in zip(filtered, cases.values()):
        assert set(torch.isfinite(row).nonzero().flatten().tolist()) == allowed

    n = 4000
    many = [SamplingParams(temperature=1.0, top_k=3)] * n
    sampler = _RowSampler(many, list(range(n)), torch.device("cpu"))
    tok_b, lp_b = sampler.pick(logits_V.expand(n, -1), torch.Generator().manual_seed(0), {})
    freq = torch.bincount(tok_b, minlength=5).float() / n
    expected = torch.tensor([0.5, 0.25, 0.15, 0.0, 0.0]) / 0.9
    assert (freq - expected).abs().max() < 0.03
    # the log-prob is the unfiltered one
    torch.testing.assert_close(lp_b, torch.log_softmax(logits_V, -1)[tok_b])


def test_errors_reach_the_caller_and_the_engine_keeps_working(tiny_model, tiny_tokenizer, prompts):
    engine = LocalEngine(tiny_model, tiny_tokenizer)
    with pytest.raises(IndexError):
        run(engine.generate([len(tiny_tokenizer) + 1000], SamplingParams(max_new_tokens=3)))
    c = run(engine.generate(prompts[0], SamplingParams(max_new_tokens=3)))
    assert len(c.token_ids) == 3


def test_gguf_cache_is_keyed_by_content_not_by_path(tmp_path):
    """Each checkout's virtual environment installs its own copy of the same GGUF: they share one
    cache entry (0.5 GB each otherwise), and a changed file gets a new one."""
    import shutil

    from seekrl.gguf_cache import _gguf_key

    gguf = _smollm2_or_skip()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a, b = shutil.copy(gguf, tmp_path / "a" / gguf.name), shutil.copy(gguf, tmp_path / "b" / gguf.name)
    assert _gguf_key(Path(a)) == _gguf_key(Path(b)) == _gguf_key(gguf)
    with open(b, "r+b") as f:  # one byte differs
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert _gguf_key(Path(b)) != _gguf_key(Path(a))


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_falls_back_to_dequantizing_in_memory(tmp_path):
    """A full disk (here: a file-size limit, so the 0.5 GB safetensors write fails mid-file) must
    not stop a run: the model loads from the GGUF in memory, dequantized once (not again after the
    failed write), a warning says why, nothing is left."""
    _smollm2_or_skip()
    script = (
        "import resource, signal, warnings\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # a write past the limit fails with EFBIG
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))\n"
        "import transformers\n"
        "reads = []\n"
        "_orig = transformers.AutoModelForCausalLM.from_pretrained\n"
        "def _counted(*a, **k):\n"
        "    reads.append(k.get('gguf_file'))\n"
        "    return _orig(*a, **k)\n"
        "transformers.AutoModelForCausalLM.from_pretrained = _counted\n"
        "from seekrl.models import load_model\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    model, tok = load_model('smollm2')\n"
        "print('WARN', [str(x.message) for x in w if 'cannot cache' in str(x.message)])\n"
        "print('PARAMS', sum(p.numel() for p in model.parameters()))\n"
        "print('GGUF_READS', sum(f is not None for f in reads), 'DTYPE', next(model.parameters()).dtype)\n"
    )
    env = {**os.environ, "SEEKRL_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    warn = next(line for line in out.stdout.splitlines() if line.startswith("WARN"))
    assert "cannot cache the dequantized SmolLM2" in warn and "dequantizing it in memory" in warn
    assert "PARAMS 1345" in out.stdout  # 134.5M parameters: the real model loaded
    assert "GGUF_READS 1 DTYPE torch.float32" in out.stdout  # dequantized once: the failed write's model is the one returned
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # no half-written entry or temp folder
