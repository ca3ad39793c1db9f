"""rollout.trajectory=stepwise end to end: a tiny model whose chat template drops earlier <think>
blocks (as thinking models' do) searches with JSON tool calls (tools.format=hermes) and trains.

The model folder carries that template, so the prefix layout is refused before the weights load.
A random tiny model never writes a tool call, so the test first teaches it the two turns of an
episode with a few supervised steps, each turn on the context the template renders for it (what
SFT warm-start does for real models). Then GRPO with per-turn retrieval credit runs two steps:
every training row must be token for token one engine call (its prompt, its sampled tokens).
"""

from __future__ import annotations

import asyncio
import json
import random
import string

import pytest
import torch

from seekrl.build import build_rl
from seekrl.config import load_config
from seekrl.data.corpus import Document
from seekrl.errors import ConfigError
from seekrl.models import make_tiny_model, save_tiny, train_tiny_tokenizer
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import undocumented
from seekrl.retrieval.bm25 import BM25Index
from seekrl.tools.base import ToolCall
from seekrl.tools.executor import EpisodeToolState
from seekrl.train import rl
from seekrl.workflows.tool_agent import encode_chat_with_tools

NAMES = ["alba", "brio", "cato", "dune"]


def call(name: str) -> str:
    return '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % name


def _world(tmp_path, template: str):
    rng = random.Random(0)
    codes = {n: str(rng.randrange(10, 99)) for n in NAMES}
    docs = [Document.from_title_text(str(i), n, f"the code of {n} is {codes[n]}") for i, n in enumerate(NAMES)]
    BM25Index.build(docs).save(tmp_path / "index")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": n, "question": f"code of {n}?", "answer": [codes[n]], "supporting_titles": [n]}) + "\n"
                            for n in NAMES))
    texts = [string.printable] + [f"<think> find {n} </think>\n{call(n)} <answer> {c} </answer> the code of" for n, c in codes.items()]
    tok = train_tiny_tokenizer(texts, vocab_size=320)
    tok.chat_template = template
    save_tiny(make_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, seed=0), tok, tmp_path / "model")
    return data, codes


def _config(tmp_path, data, trajectory: str, *extra: str):
    return load_config(None, [*extra,
        f"model.path={tmp_path / 'model'}", "model.max_context=512", f"data.train={data}",
        "rollout.group_size=4", "rollout.batch_size=8", "rollout.max_new_tokens=40", "rollout.max_prompt_tokens=64",
        "rollout.max_turns=2", "rollout.max_total_tokens=200", "rollout.max_obs_tokens=48", f"rollout.trajectory={trajectory}",
        "tools.format=hermes", f"tools.retriever={tmp_path / 'index'}", "tools.topk=1",
        "reward.functions=[qa_em, retrieved_gold_turn, retrieved_support_turn]", "algo.name=grpo", "algo.turn_advantage=true", "algo.turn_gamma=0.9",
        "train.steps=2", "train.lr=1e-3", f"log.dir={tmp_path}", "log.name=stepwise", "log.progress=false",
        "log.tensorboard=false", "log.samples_every=1",
    ])


def _warm_start(comp, codes, steps=100):
    """Cross-entropy on both turns of an episode, each on the context the template renders for it."""
    wf, tok, model = comp.workflow, comp.tokenizer, comp.model
    seqs = []
    for task in comp.tasks.train:
        first = f"<think> find {task.id} </think>\n{call(task.id)}"
        result = asyncio.run(wf.executor.run(ToolCall("search", {"query": task.id}, ""), EpisodeToolState())).text
        second = encode_chat_with_tools(tok, [*task.prompt, {"role": "assistant", "content": first},
                                               {"role": "tool", "name": "search", "content": result}], wf.tools)
        for prompt, target in ((wf.prompt_ids(task), first), (second, f"<answer> {codes[task.id]} </answer>")):
            ids = tok.encode(target, add_special_tokens=False) + [tok.eos_token_id]
            seqs.append((prompt + ids, [-100] * len(prompt) + ids))
    T = max(len(ids) for ids, _ in seqs)  # one right-padded batch
    ids = torch.tensor([x + [tok.pad_token_id] * (T - len(x)) for x, _ in seqs])
    labels = torch.tensor([y + [-100] * (T - len(y)) for _, y in seqs])
    mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x, _ in seqs])
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        loss = model(ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("mode", [[], ["rollout.mode=async", "rollout.max_staleness=1"]], ids=["sync", "async"])
def test_stepwise_grpo_trains_each_turn_on_exactly_what_the_engine_was_given(tmp_path, think_templates, monkeypatch, mode):
    """Also in async mode (decoupled PPO; turns cut by weight updates continue): a row is the call the
    workflow made, however many requests the interruptible engine needed for it."""
    data, codes = _world(tmp_path, think_templates["drop_all"])
    # the prefix layout: refused before the model loads, in one line naming the fix
    import seekrl.build as build

    with monkeypatch.context() as m:
        m.setattr(build, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
        with pytest.raises(ConfigError, match=r"rewrites earlier turns.*set rollout\.trajectory=stepwise$"):
            build_rl(_config(tmp_path, data, "prefix"))

    comp = build_rl(_config(tmp_path, data, "stepwise", *mode))
    calls, batches = [], []
    engine = comp.rollout.engine  # what the workflow calls: the engine, or in async mode its interruptible wrapper
    generate = engine.generate

    async def recording(prompt_ids, params, *, rid=None):
        c = await generate(prompt_ids, params, rid=rid)
        calls.append((tuple(prompt_ids), tuple(c.token_ids)))
        return c

    learn = rl.learn

    def keep(run, batch, step, stats):
        batches.append(batch)
        learn(run, batch, step, stats)

    engine.generate = recording
    monkeypatch.setattr(rl, "learn", keep)
    try:
        _warm_start(comp, codes)
        before = {n: p.detach().clone() for n, p in comp.model.named_parameters()}
        asyncio.run(rl.run(comp))
    finally:
        comp.close()

    rows = read_metrics(comp.run_dir)
    assert [r["step"] for r in rows] == [1, 2] and undocumented({k for r in rows for k in r}) == []
    assert max(r["rollout/tool_calls/search"] for r in rows) > 0.5, rows[0]  # the episodes searched
    assert max(r["rollout/prefix_breaks"] for r in rows) > 0.5  # and the template re-rendered their history
    assert max(r["reward/retrieved_gold_turn"] for r in rows) > 0
    # each answer is in the one paragraph its task needs: a search that retrieved it gets both credits
    assert [r["reward/retrieved_support_turn"] for r in rows] == pytest.approx([r["reward/retrieved_gold_turn"] for r in rows])
    assert all(r["reward/retrieved_support_turn/known"] == 1.0 for r in rows)
    assert all(r["loss/policy"] == r["loss/policy"] for r in rows)
    assert any(not torch.equal(before[n], p) for n, p in comp.model.named_parameters())  # the policy moved
    # every training row is one engine call, token for token; every call of the two steps is a row
    assert len(batches) == 2
    made = [(tuple(p), tuple(c)) for b in batches for p, c in zip(b.prompt_ids, b.completion_ids)]
    assert set(made) <= set(calls) and (mode or sorted(made) == sorted(calls))  # async: later steps' episodes were under way
    for b in batches:
        assert len(b) > 8 and b.episode_ids_B.unique().numel() == 8  # more rows than episodes; the baseline counts episodes
        for i, prompt in enumerate(b.prompt_ids):
            if b.turn_BC[i, 0] > 0:
                assert "<think>" not in comp.tokenizer.decode(prompt)  # the context the template gives turn 2
    samples = [json.loads(line) for line in (comp.run_dir / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    assert any(p is not None and "<think>" not in p for s in samples for p in s["turn_prompts"])
    assert all(len(s["turn_rewards"]) == s["metrics"]["turns"] for s in samples)
