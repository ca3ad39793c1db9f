"""The trainer's forward path against the engine, and the micro-batching against one big batch.

- The engine's behaviour log-probs equal the trainer's recomputation (same fp32 weights) within
  1e-4: this is what lets the RL loop reuse them as old log-probs.
- Splitting a minibatch into token-budget micro-batches gives the same gradient as one pass,
  for every loss aggregation.
- Inserted tokens (loss_mask 0) receive no gradient through the policy loss.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from seekrl.build import policy_trainer
from seekrl.config import load_config
from seekrl.engines.local import LocalEngine
from seekrl.models import encode_chat
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.types import SamplingParams, Task, Trajectory

PROMPTS = ["what is 12 + 30?", "the quick brown fox", "Question: capital of France?", "a"]


def _cfg(*overrides):
    return load_config(None, ["rollout.max_new_tokens=12", "rollout.max_prompt_tokens=64", "model.max_context=128", *overrides])


async def _sample(engine, tokenizer, temperature, n=3):
    params = SamplingParams(max_new_tokens=12, temperature=temperature)
    calls, prompts = [], []
    for text in PROMPTS:
        ids = encode_chat(tokenizer, [{"role": "user", "content": text}])
        for _ in range(n):
            calls.append(engine.generate(ids, params))
            prompts.append(ids)
    return prompts, await asyncio.gather(*calls)


def _trajs(prompts, completions):
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        t = Trajectory(Task(id=str(i), prompt=[], answer=""), p, [], [], [], [])
        t.append(c.token_ids, sampled=True, logprobs=c.logprobs, version=c.version)
        out.append(t)
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_trainer_recomputation(fresh_tiny_model, tiny_tokenizer, temperature):
    engine = LocalEngine(fresh_tiny_model, tiny_tokenizer, seed=1)
    prompts, completions = asyncio.run(_sample(engine, tiny_tokenizer, temperature))
    trajs = _trajs(prompts, completions)
    # the 3 samples of each prompt were prefilled once (shared KV cache), not 3 times
    assert engine.stats["prefill_tokens"] == sum(len(p) for p in {tuple(p) for p in prompts})
    cfg = _cfg(f"rollout.temperature={temperature}", "train.micro_batch_tokens=64")  # several micro-batches
    trainer = policy_trainer(cfg, fresh_tiny_model, tiny_tokenizer.pad_token_id, total_steps=1)
    recomputed = trainer.logprobs(TokenBatch.from_trajectories(trajs)).tolist()
    diffs = [abs(a - b) for t, r in zip(trajs, recomputed) for a, b in zip(t.logprobs, r)]
    assert len(diffs) == sum(len(t.completion_ids) for t in trajs) > 0
    assert max(diffs) < 1e-4, max(diffs)


def _random_trajs(vocab, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        P, C = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))
        t = Trajectory(Task(id=str(i), prompt=[], answer=""), torch.randint(3, vocab, (P,), generator=g).tolist(), [], [], [], [])
        # sampled / inserted / sampled segments, as a tool-using episode has
        for sampled, length in ((True, C), (False, 3), (True, 2)):
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            t.append(ids, sampled=sampled, logprobs=[-1.0] * length if sampled else None, version=0)
        trajs.append(t)
    return trajs


def _grads(model, trajs, cfg, adv):
    trainer = policy_trainer(cfg, model, 0, total_steps=1)
    trainer.optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # capture grads, change nothing
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC, batch.adv_BC = trainer.logprobs(batch), pad_completion(adv, batch.width)
    trainer.update(batch, StatsTracker())
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_micro_batches_give_the_same_gradient(fresh_tiny_model, tiny_tokenizer, agg):
    trajs = _random_trajs(len(tiny_tokenizer))
    adv = [[float((i % 3) - 1)] * len(t.completion_ids) for i, t in enumerate(trajs)]
    one = _grads(fresh_tiny_model, trajs, _cfg(f"algo.loss_agg={agg}", "train.micro_batch_tokens=100000", "train.max_grad_norm=1e9"), adv)
    many = _grads(fresh_tiny_model, trajs, _cfg(f"algo.loss_agg={agg}", "train.micro_batch_tokens=20", "train.max_grad_norm=1e9"), adv)
    assert one.keys() == many.keys()
    for name in one:
        torch.testing.assert_close(one[name], many[name], rtol=1e-4, atol=1e-6, msg=name)


def test_inserted_tokens_get_no_gradient(fresh_tiny_model, tiny_tokenizer):
    """Check the gradient, not only the mask: d loss / d logits is zero at inserted positions."""
    from seekrl.algo.losses import policy_loss
    from seekrl.train.batching import completion_logits, make_micro_batch, token_logprobs

    trajs = _random_trajs(len(tiny_tokenizer), n=4, seed=3)
    mb = make_micro_batch(TokenBatch.from_trajectories(trajs), list(range(len(trajs))), 0, "cpu")
    logits = completion_logits(fresh_tiny_model, mb, 1.0)
    logits.retain_grad()
    logp = token_logprobs(logits, mb.target_ids_BC)
    C = logp.shape[1]
    old = pad_completion([t.logprobs for t in trajs], C)
    adv = torch.ones_like(logp)
    loss, _ = policy_loss(logp, old.detach(), adv, mb.loss_mask_BC)
    loss.backward()
    grad_norm_BC = logits.grad.norm(dim=-1)
    inserted = (mb.token_mask_BC == 1) & (mb.loss_mask_BC == 0)
    sampled = mb.loss_mask_BC == 1
    assert inserted.sum() > 0 and sampled.sum() > 0
    assert torch.all(grad_norm_BC[inserted] == 0)
    assert torch.all(grad_norm_BC[sampled] > 0)


def test_shared_prefix_pass_equals_full_pass(fresh_tiny_model, tiny_tokenizer):
    """Groups share prompts: one prompt pass + expanded KV cache gives the full pass's logprobs and grads."""
    import copy

    from seekrl.train.batching import completion_logits, make_micro_batch, token_logprobs

    trajs = _random_trajs(len(tiny_tokenizer), n=9, seed=5)
    for i, t in enumerate(trajs):  # three prompts, three samples each
        t.prompt_ids = trajs[i % 3].prompt_ids
    idx = list(range(len(trajs)))
    full = make_micro_batch(TokenBatch.from_trajectories(trajs), idx, 0, "cpu")
    shared = make_micro_batch(TokenBatch.from_trajectories(trajs), idx, 0, "cpu", share_prefix=True)
    assert shared.prompt_ids_UP.shape[0] == 3

    def run(mb, model):
        logp = token_logprobs(completion_logits(model, mb, 0.9), mb.target_ids_BC)
        (logp * mb.loss_mask_BC).sum().backward()
        return logp.detach() * mb.token_mask_BC, {n: p.grad for n, p in model.named_parameters()}

    a, ga = run(full, copy.deepcopy(fresh_tiny_model))
    b, gb = run(shared, copy.deepcopy(fresh_tiny_model))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("share", [True, False])
def test_update_is_the_same_with_and_without_prefix_sharing(fresh_tiny_model, tiny_tokenizer, share):
    trajs = _random_trajs(len(tiny_tokenizer), n=8, seed=7)
    for i, t in enumerate(trajs):
        t.prompt_ids = trajs[i % 2].prompt_ids
    adv = [[float((i % 3) - 1)] * len(t.completion_ids) for i, t in enumerate(trajs)]
    ref = _grads(fresh_tiny_model, trajs, _cfg("train.share_prefix=false", "train.max_grad_norm=1e9"), adv)
    got = _grads(fresh_tiny_model, trajs, _cfg(f"train.share_prefix={str(share).lower()}", "train.micro_batch_tokens=40", "train.max_grad_norm=1e9"), adv)
    for name in ref:
        torch.testing.assert_close(ref[name], got[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("share", [False, True])
def test_chunked_head_logprobs_equal_the_full_logits(fresh_tiny_model, tiny_tokenizer, share, monkeypatch):
    """completion_logprobs (chunked LM head, only at the asked positions) gives the log-probs,
    entropies and model gradients of the full-logits path, in both layouts."""
    import copy

    import seekrl.algo.head_logprob as hl

    monkeypatch.setattr(hl, "KEEP_BYTES", 0)  # chunk even these small logits (and recompute them)

    from seekrl.algo.losses import entropy_from_logits
    from seekrl.train.batching import completion_logits, completion_logprobs, make_micro_batch, token_logprobs

    trajs = _random_trajs(len(tiny_tokenizer), n=9, seed=5)
    for i, t in enumerate(trajs):
        t.prompt_ids = trajs[i % 3].prompt_ids
    mb = make_micro_batch(TokenBatch.from_trajectories(trajs), list(range(len(trajs))), 0, "cpu", share_prefix=share)
    where = mb.loss_mask_BC

    def reference(model):
        logits = completion_logits(model, mb, 0.9)
        return token_logprobs(logits, mb.target_ids_BC) * where, entropy_from_logits(logits) * where

    def chunked(model):
        return completion_logprobs(model, mb, 0.9, entropy=True, where_BC=where)

    out = {}
    for name, fn in (("ref", reference), ("chunked", chunked)):
        model = copy.deepcopy(fresh_tiny_model)
        logp, ent = fn(model)
        (logp.sum() - 0.3 * ent.sum()).backward()
        out[name] = logp.detach(), ent.detach(), {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(out["chunked"][0], out["ref"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["chunked"][1], out["ref"][1], rtol=0, atol=1e-5)
    assert (out["chunked"][0][where == 0] == 0).all()  # not scored where not asked
    for n, g in out["ref"][2].items():
        torch.testing.assert_close(out["chunked"][2][n], g, rtol=0, atol=1e-5 * max(1.0, g.abs().max().item()), msg=n)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_layout_equals_the_padded_one(fresh_tiny_model, tiny_tokenizer, share, attn):
    """Varlen packing (train/packing.py): the same log-probs and model gradients as padding, with
    and without shared prefixes, under SDPA and eager attention; and fewer decoder tokens."""
    import copy

    from seekrl.train.batching import completion_logprobs, make_micro_batch
    from seekrl.train.packing import PackedFull, PackedPrefix

    trajs = _random_trajs(len(tiny_tokenizer), n=12, seed=7)
    for i, t in enumerate(trajs):  # four prompts, three samples each, completions of very different lengths
        t.prompt_ids = trajs[i % 4].prompt_ids
    trajs[5].completion_ids, trajs[5].loss_mask, trajs[5].logprobs, trajs[5].versions = trajs[5].completion_ids[:1], [1], [0.0], [0]
    for t in trajs[6:]:  # short ones, so that sequences fit together and packing saves rows
        t.completion_ids, t.loss_mask, t.logprobs, t.versions = t.completion_ids[:2], t.loss_mask[:2], t.logprobs[:2], t.versions[:2]
        if not share:
            t.prompt_ids = t.prompt_ids[:3]
    idx = list(range(len(trajs)))
    model0 = copy.deepcopy(fresh_tiny_model)
    model0.config._attn_implementation = attn
    out = {}
    for pack in (False, True):
        mb = make_micro_batch(TokenBatch.from_trajectories(trajs), idx, 0, "cpu", share_prefix=share, pack=pack)
        if pack:
            assert isinstance(mb.packed, PackedPrefix if share else PackedFull)
            ids = mb.packed.seqs.ids_RL if not share else mb.packed.completions.ids_RL
            assert ids.numel() < (mb.input_ids_BL if not share else mb.target_ids_BC).numel()
        model = copy.deepcopy(model0)
        logp, ent = completion_logprobs(model, mb, 0.9, entropy=True)
        ((logp * mb.loss_mask_BC).sum() + 0.1 * (ent * mb.loss_mask_BC).sum()).backward()
        out[pack] = (logp * mb.token_mask_BC).detach(), {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(out[True][0], out[False][0], rtol=0, atol=1e-5)
    for n, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][n], g, rtol=0, atol=1e-5 * max(1.0, g.abs().max().item()), msg=n)


def test_first_fit_packing_respects_capacity():
    from seekrl.train.packing import pack_first_fit

    lengths = [7, 3, 5, 2, 2, 9, 1, 4]
    rows = pack_first_fit(lengths, 9)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 9 for r in rows)
    assert len(rows) == 5 - 1  # 33 tokens in rows of 9: 4 rows, no more
    from seekrl.train.packing import saves_rows

    assert saves_rows(lengths) and not saves_rows([9, 9, 8, 9]) and not saves_rows([5])


def _branched_trajs(vocab, seed=11):
    """Three episodes of one task (sampled / inserted / sampled history, then an answer), and three
    branches of each of the first two: the episode's whole history copied in and masked (as
    rollout.answer_branches writes it), then an answer of its own."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    prompt, trajs = ids(6), []
    for e in range(3):
        history = [(True, ids(4 + e)), (False, ids(9)), (True, ids(3))]
        ep = Trajectory(Task(id="t", prompt=[], answer=""), prompt, [], [], [], [])
        for sampled, seg in history:
            ep.append(seg, sampled=sampled, logprobs=[-1.0] * len(seg) if sampled else None, version=0)
        shared = list(ep.completion_ids)
        ep.append(ids(2 + e), sampled=True, logprobs=[-1.0] * (2 + e), version=0)
        trajs.append(ep)
        for j in range(3 if e < 2 else 0):
            br = Trajectory(Task(id="t", prompt=[], answer=""), prompt, [], [], [], [])
            br.append(shared, sampled=False)
            n = 1 + (j + e) % 4
            br.append(ids(n), sampled=True, logprobs=[-1.0] * n, version=0)
            trajs.append(br)
    return trajs


@pytest.mark.parametrize("pack", [False, True])
def test_branches_run_their_shared_history_once(fresh_tiny_model, tiny_tokenizer, pack):
    """The branches of an episode lift their masked shared history into the prefix
    (batching.lifted_prefixes): it runs once, and the trained tokens' log-probs, entropies and the
    model's gradients equal the full pass's; the lifted tokens are not scored."""
    import copy

    from seekrl.train.batching import completion_logprobs, lifted_prefixes, make_micro_batch

    trajs = _branched_trajs(len(tiny_tokenizer))
    batch = TokenBatch.from_trajectories(trajs)
    idx = list(range(len(trajs)))
    lift = lifted_prefixes(batch, idx)
    histories = [len(trajs[0].completion_ids) - 2, len(trajs[4].completion_ids) - 3]  # each episode's history before its answer
    assert [trajs[1].loss_mask.index(1), trajs[5].loss_mask.index(1)] == histories
    assert lift == [0, *[histories[0]] * 3, 0, *[histories[1]] * 3, 0]  # the episodes (and the unbranched one): none
    assert lifted_prefixes(batch, [0, 1]) == [0, 0]  # a history nobody else starts with stays in the completion
    full = make_micro_batch(batch, idx, 0, "cpu")
    shared = make_micro_batch(batch, idx, 0, "cpu", share_prefix=True, pack=pack)
    if not pack:
        assert shared.prompt_ids_UP.shape[0] == 3  # the task prompt, and each branched episode's history
        assert shared.suffix_ids_BS.shape[1] == max(len(t.completion_ids) - f for t, f in zip(trajs, lift))
    else:
        assert shared.packed is not None and shared.lift_B is not None
    assert (shared.token_mask_BC.sum(1) == full.token_mask_BC.sum(1) - torch.tensor(lift, dtype=torch.float32)).all()
    where = full.loss_mask_BC
    out = {}
    for name, mb in (("full", full), ("shared", shared)):
        model = copy.deepcopy(fresh_tiny_model)
        logp, ent = completion_logprobs(model, mb, 0.9, entropy=True, where_BC=where)
        (logp.sum() - 0.3 * ent.sum()).backward()
        out[name] = logp.detach(), ent.detach(), {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(out["shared"][0], out["full"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["shared"][1], out["full"][1], rtol=0, atol=1e-5)
    for n, g in out["full"][2].items():
        torch.testing.assert_close(out["shared"][2][n], g, rtol=0, atol=1e-5 * max(1.0, g.abs().max().item()), msg=n)
    model = copy.deepcopy(fresh_tiny_model)
    scored, _ = completion_logprobs(model, shared, 0.9)  # every column: the lifted ones give 0
    for b, f in enumerate(lift):
        assert (scored[b, :f] == 0).all()
        n = len(trajs[b].completion_ids)
        ref, _ = completion_logprobs(model, full, 0.9)
        torch.testing.assert_close(scored[b, f:n], ref[b, f:n], rtol=0, atol=1e-5)


@pytest.mark.parametrize("trajs_of", ["random", "branched"])
@pytest.mark.parametrize("share,pack", [(False, False), (True, False), (False, True), (True, True)])
def test_rounded_lengths_score_as_exact_ones(fresh_tiny_model, tiny_tokenizer, trajs_of, share, pack):
    """train.length_buckets: every decoder pass of every layout (right-padded, shared prefix with its
    completion pass, packed, packed prefix, lifted branches) runs on rounded lengths
    (`bucket_length`), and the log-probs, entropies and gradients equal those at exact lengths."""
    import copy

    from seekrl.train.batching import completion_logprobs, make_micro_batch
    from seekrl.train.packing import bucket_length

    from seekrl.train.packing import PackedFull, PackedPrefix

    if trajs_of == "random":
        trajs = _random_trajs(len(tiny_tokenizer), n=8, seed=5)
        for t in trajs[5:]:  # short ones, so that packing saves rows
            t.completion_ids, t.loss_mask, t.logprobs, t.versions = t.completion_ids[:2], t.loss_mask[:2], t.logprobs[:2], t.versions[:2]
        if share:
            for i, t in enumerate(trajs):  # two prompts, four samples each
                t.prompt_ids = trajs[i % 2].prompt_ids
    else:
        trajs = _branched_trajs(len(tiny_tokenizer))
    batch = TokenBatch.from_trajectories(trajs)
    idx = list(range(len(trajs)))
    out, widths = {}, {}
    for buckets in (0, 1):  # 1: powers of two and their multiples, the coarsest rounding
        mb = make_micro_batch(batch, idx, 0, "cpu", share_prefix=share, pack=pack, buckets=buckets)
        layout = type(mb.packed) if mb.packed is not None else "prefix" if mb.prompt_ids_UP is not None else "padded"
        if trajs_of == "random":  # each case runs the layout it names
            assert layout == {(False, False): "padded", (True, False): "prefix", (False, True): PackedFull, (True, True): PackedPrefix}[share, pack]
        model = copy.deepcopy(fresh_tiny_model)
        seen = []  # the length of every decoder pass's input ids
        hook = model.get_input_embeddings().register_forward_hook(lambda m, args, res: seen.append(args[0].shape[-1]))
        logp, ent = completion_logprobs(model, mb, 0.9, entropy=True, where_BC=mb.loss_mask_BC)
        hook.remove()
        (logp.sum() - 0.3 * ent.sum()).backward()
        out[buckets], widths[buckets] = (logp.detach(), ent.detach(), {n: p.grad for n, p in model.named_parameters()}), seen
    assert len(widths[1]) == len(widths[0])  # the same passes
    assert all(bucket_length(w, 1) == w for w in widths[1])  # each on a rounded length...
    assert widths[1] != widths[0]  # ...which here differs from the exact one somewhere
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=0, atol=1e-5)
    for n, g in out[0][2].items():
        torch.testing.assert_close(out[1][2][n], g, rtol=0, atol=1e-5 * max(1.0, g.abs().max().item()), msg=n)


def test_bucket_length_bounds_the_lengths():
    """`bucket_length`: never shorter, at most 1/N longer, N lengths per doubling, exact at 0."""
    from seekrl.train.packing import bucket_length

    for k in (1, 2, 8):
        rounded = [bucket_length(n, k) for n in range(1, 4097)]
        assert all(n <= r <= n + n // k for n, r in zip(range(1, 4097), rounded))
        assert all(bucket_length(r, k) == r for r in rounded)  # a rounded length stays put
        assert len({r for r in rounded if 256 < r <= 512}) == k  # k lengths in each doubling
    assert [bucket_length(n, 0) for n in (1, 257, 4095)] == [1, 257, 4095]
    assert [bucket_length(n, 8) for n in (8, 9, 17, 257, 300, 2049)] == [8, 9, 18, 288, 320, 2304]


def test_update_with_branches_is_the_same_with_lifted_prefixes(fresh_tiny_model, tiny_tokenizer):
    """The whole update (old log-probs, micro-batches under a small budget, the plan keeping each
    episode's branches together) gives the gradient of the unshared update, in fewer decoder tokens."""
    from seekrl.train.plan import MicroBatchPlan

    trajs = _branched_trajs(len(tiny_tokenizer), seed=12)
    adv = [[float((i % 3) - 1)] * len(t.completion_ids) for i, t in enumerate(trajs)]
    ref = _grads(fresh_tiny_model, trajs, _cfg("train.share_prefix=false", "train.max_grad_norm=1e9"), adv)
    got = _grads(fresh_tiny_model, trajs, _cfg("train.share_prefix=true", "train.packing=false", "train.micro_batch_tokens=40",
                                                "train.max_grad_norm=1e9"), adv)
    for name in ref:
        torch.testing.assert_close(ref[name], got[name], rtol=1e-4, atol=1e-6, msg=name)
    batch = TokenBatch.from_trajectories(trajs)
    for budget in (20, 60, 40):  # each episode's three branches in one micro-batch, whatever the budget
        plan = MicroBatchPlan(budget, 0, torch.device("cpu"), share_prefix=True)
        groups = plan.groups(batch, list(range(len(trajs))))
        for first in (1, 5):
            assert any({first, first + 1, first + 2} <= set(g) for g in groups), (budget, groups)
    lifted = sum(mb.prompt_ids_UP.numel() + mb.suffix_ids_BS.numel() for mb in plan.micro_batches(batch, list(range(len(trajs))))
                 if mb.lift_B is not None)
    plain = sum(len(trajs[i].prompt_ids) + len(trajs[i].completion_ids) for g in groups for i in g if i in (1, 2, 3, 5, 6, 7))
    assert 0 < lifted < plain
