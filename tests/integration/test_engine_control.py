"""LocalEngine's control surface: abort, in-place pause with a weight swap, cancellation, stop ids.

These are what `seekrl serve engine` exposes as /abort_request, /pause_generation and
/continue_generation, and what asynchronous RL builds on: a cut turn keeps its tokens, and each
token carries the version of the weights that produced its logits.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from seekrl.engines import LocalEngine
from seekrl.models import make_tiny_model
from seekrl.types import SamplingParams

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # the GPU check runs these on CUDA too
LONG = SamplingParams(max_new_tokens=600, temperature=1.0, seed=7, ignore_eos=True)


def run(coro, timeout=60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def prompt(tiny_tokenizer):
    return tiny_tokenizer.encode("Question: what is 12 + 30?", add_special_tokens=False)


async def _until(cond, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_abort_by_rid_returns_the_tokens_so_far(tiny_model, tiny_tokenizer, prompt):
    engine = LocalEngine(tiny_model, tiny_tokenizer)

    async def go():
        full = await engine.generate(prompt, LONG)  # the same seed, not aborted
        task = asyncio.create_task(engine.generate(prompt, LONG, rid="r1"))
        other = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=5, seed=1), rid="r2"))
        await _until(lambda: engine.stats["forward_steps"] > 1 + len(full.token_ids) + 20)
        assert engine.abort("r1") == 1
        assert engine.abort("nobody") == 0
        return full, await task, await other

    full, cut, other = run(go())
    assert full.finish_reason == "length" and len(full.token_ids) == 600
    assert cut.finish_reason == "abort"
    assert 0 < len(cut.token_ids) < 600
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]  # a prefix of the uncut sample
    assert cut.logprobs == pytest.approx(full.logprobs[: len(cut.logprobs)], abs=1e-5)
    assert other.finish_reason == "length" and len(other.token_ids) == 5
    assert engine.stats["aborted"] == 1


def test_pause_abort_ends_running_and_queued_requests_then_holds(tiny_model, tiny_tokenizer, prompt):
    engine = LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=1)

    async def go():
        running = asyncio.create_task(engine.generate(prompt, LONG))
        queued = asyncio.create_task(engine.generate(prompt, LONG))
        await _until(lambda: engine.stats["forward_steps"] > 10)
        engine.pause("abort")
        a, b = await running, await queued
        late = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=3, seed=2)))
        await asyncio.sleep(0.2)
        assert not late.done()  # held until resume
        engine.resume()
        return a, b, await late

    a, b, late = run(go())
    assert a.finish_reason == "abort" and 0 < len(a.token_ids) < 600
    assert b.finish_reason == "abort" and b.token_ids == []
    assert late.finish_reason == "length" and len(late.token_ids) == 3


def test_in_place_pause_swaps_weights_under_a_running_request(tiny_model, tiny_tokenizer, prompt, tmp_path):
    other = make_tiny_model(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=1)
    other.save_pretrained(tmp_path / "v1")  # a folder of safetensors, as the disk weight sync writes
    engine = LocalEngine(copy.deepcopy(tiny_model), tiny_tokenizer)

    async def go():
        task = asyncio.create_task(engine.generate(prompt, LONG))
        await _until(lambda: engine.stats["forward_steps"] > 50)
        engine.pause("in_place")
        await engine.update_weights(tmp_path / "v1", 1)
        steps = engine.stats["forward_steps"]
        await asyncio.sleep(0.2)
        assert engine.stats["forward_steps"] == steps  # parked: nothing runs while paused
        engine.resume()
        return await task

    c = run(go())
    assert c.finish_reason == "length" and len(c.token_ids) == 600
    assert c.version == 0 and c.versions is not None
    k = c.versions.index(1)  # the first token from the new weights
    assert 0 < k < 600 and c.versions == [0] * k + [1] * (600 - k)
    assert c.token_versions() == c.versions
    for name, p in engine.model.state_dict().items():
        assert torch.equal(p, other.state_dict()[name])


def test_a_cancelled_caller_frees_its_row(tiny_model, tiny_tokenizer, prompt):
    engine = LocalEngine(tiny_model, tiny_tokenizer)

    async def go():
        task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=100_000, ignore_eos=True)))
        await _until(lambda: engine.stats["forward_steps"] > 5)
        task.cancel()
        await _until(lambda: engine.stats["aborted"] == 1, timeout=1.0)  # the row is dropped at once
        assert engine.in_flight == 0 and engine.queued == 0
        return await engine.generate(prompt, SamplingParams(max_new_tokens=4, seed=3))

    assert len(run(go()).token_ids) == 4


def test_stop_token_ids_and_ignore_eos(tiny_model, tiny_tokenizer, prompt):
    engine = LocalEngine(tiny_model, tiny_tokenizer)
    free = run(engine.generate(prompt, SamplingParams(max_new_tokens=40, seed=5, ignore_eos=True)))
    stop_id = free.token_ids[10]
    cut = run(engine.generate(prompt, SamplingParams(max_new_tokens=40, seed=5, ignore_eos=True, stop_token_ids=(stop_id,))))
    k = free.token_ids.index(stop_id)
    assert cut.finish_reason == "stop" and cut.token_ids == free.token_ids[: k + 1]  # the stop id is kept
    with pytest.raises(ValueError, match="pause mode"):
        engine.pause("later")


@pytest.mark.parametrize("device", DEVICES)
def test_retract_requeues_and_continues_under_the_new_weights_as_if_uncut(tiny_model, tiny_tokenizer, prompt, tmp_path, device):
    """pause("retract") ends the batch in flight; after resume the requests are prefilled again
    (prompt + tokens so far) and continue with the same seeded draws: with unchanged weights the
    result equals an uncut request, token for token."""
    engine = LocalEngine(copy.deepcopy(tiny_model).to(device), tiny_tokenizer)
    params = SamplingParams(max_new_tokens=300, temperature=1.0, seed=21, ignore_eos=True)

    async def go(swap: bool):
        task = asyncio.create_task(engine.generate(prompt, params))
        start = engine.stats["forward_steps"]
        await _until(lambda: engine.stats["forward_steps"] > start + 40)
        engine.pause("retract")
        await _until(lambda: not engine._busy)  # the batch ended early
        assert not task.done()
        if swap:
            await engine.update_weights(tmp_path / "v1", 1)
        engine.resume()
        return await task

    uncut = run(engine.generate(prompt, params))
    cut = run(go(swap=False))
    assert cut.token_ids == uncut.token_ids and cut.finish_reason == "length"
    assert cut.logprobs == pytest.approx(uncut.logprobs, abs=1e-5)
    make_tiny_model(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=1).save_pretrained(tmp_path / "v1")
    swapped = run(go(swap=True))
    k = swapped.versions.index(1)
    assert 0 < k < 300 and swapped.versions == [0] * k + [1] * (300 - k) and len(swapped.token_ids) == 300
    assert swapped.token_ids[:k] == uncut.token_ids[:k]


@pytest.mark.parametrize("device", DEVICES)
def test_requests_join_a_running_batch_and_sample_what_they_would_alone(tiny_tokenizer, sharp_tiny, device):
    """Continuous batching: requests that arrive while a batch runs are prefilled and merged into
    it (the shorter KV cache left-padded); seeded, they sample what they would alone, and each is
    answered when its own row ends, not when the batch does."""
    model = sharp_tiny(3).to(device)
    texts = ["Question: what is 12 + 30?", "the quick brown fox jumps over the lazy dog, and then", "<search>", "copy: 1 2"]
    prompts = [tiny_tokenizer.encode(t, add_special_tokens=False) for t in texts]
    long = SamplingParams(max_new_tokens=400, temperature=1.0, seed=5, ignore_eos=True)
    late = [SamplingParams(max_new_tokens=12 + 7 * k, temperature=1.0, seed=100 + k, ignore_eos=True) for k in range(4)]
    alone = [run(LocalEngine(model, tiny_tokenizer).generate(p, sp)) for p, sp in zip(prompts, late)]
    alone_long = run(LocalEngine(model, tiny_tokenizer).generate(prompts[1], long))
    engine = LocalEngine(model, tiny_tokenizer)

    async def go():
        first = asyncio.create_task(engine.generate(prompts[1], long))
        await _until(lambda: engine.stats["forward_steps"] > 30)
        joined = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, late)))
        assert not first.done()  # answered while the long row still runs
        return joined, await first

    joined, first = run(go())
    assert engine.stats["batches"] == 1 and engine.stats["joined"] == 4
    for a, b in zip(alone + [alone_long], joined + [first]):
        assert b.token_ids == a.token_ids
        # float32 rounding: where the join lands (timing) sets the left padding, which reorders the
        # attention sums; seen up to 1.1e-5 on a log-prob of -5 (2e-6 relative)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5, rel=1e-5)
