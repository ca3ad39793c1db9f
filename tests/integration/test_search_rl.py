"""Multi-turn GRPO with search: a tiny model, an in-process BM25 index, real tool calls, an update.

A random tiny model never writes `<search>`, so the test first teaches it the call format with a
few supervised steps on "<search> name </search>" (what SFT warm-start does for real models);
then GRPO runs with the search_r1 format. The run must make search calls whose results are
inserted as masked tokens, and the policy must change.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch

from seekrl.build import build_rl
from seekrl.config import load_config
from seekrl.data.corpus import Document
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import undocumented
from seekrl.retrieval.bm25 import BM25Index
from seekrl.train import rl

NAMES = ["alba", "brio", "cato", "dune", "emil", "faro", "gino", "hale"]


def _world(tmp_path):
    rng = random.Random(0)
    codes = {n: str(rng.randrange(10, 99)) for n in NAMES}
    docs = [Document.from_title_text(str(i), n, f"the code of {n} is {codes[n]}") for i, n in enumerate(NAMES)]
    BM25Index.build(docs).save(tmp_path / "index")
    rows = [{"id": n, "question": f"code of {n}? use <search> q </search> then <answer> x </answer>", "answer": [codes[n]]} for n in NAMES]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data, codes


def _warm_start(comp, codes, steps=200):
    """Teach the episode's format with cross-entropy on the model's own turns (the observation in
    between is context, not target): "<search> name </search>" + information + "<answer> code </answer>"."""
    tok, model = comp.tokenizer, comp.model
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    seqs = []
    for task in comp.tasks.train:
        ids = list(comp.workflow.prompt_ids(task))
        labels = [-100] * len(ids)
        obs = f"\n\n<information>Doc 1(Title: {task.id}) the code of {task.id} is {codes[task.id]}</information>\n\n"
        for text, trained in ((f"<search> {task.id} </search>", True), (obs, False), (f"<answer> {codes[task.id]} </answer>", True)):
            seg = tok.encode(text, add_special_tokens=False)
            ids += seg
            labels += seg if trained else [-100] * len(seg)
        seqs.append((ids, labels))
    # one right-padded batch (padding is neither attended to nor a target): one forward a step
    width = max(len(ids) for ids, _ in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in seqs])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in seqs])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in seqs])
    model.train()
    for _ in range(steps):
        loss = model(ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("engine", [[], ["engine.servers=1"]], ids=["local", "server"])
def test_grpo_with_search_calls_tools_masks_outputs_and_updates(tmp_path, engine):
    """Also on a started engine server: the multi-turn episodes, their masks and the weights that
    the warm start changed after build (the loop syncs the engine before its first step)."""
    data, codes = _world(tmp_path)
    cfg = load_config(None, [*engine,
        "model.path=tiny", "model.tiny_hidden=64", "model.max_context=320", f"data.train={data}",
        "rollout.group_size=4", "rollout.batch_size=16", "rollout.max_new_tokens=16", "rollout.max_prompt_tokens=96",
        "rollout.max_turns=2", "rollout.max_total_tokens=160", "rollout.max_obs_tokens=96",
        "tools.format=search_r1", f"tools.retriever={tmp_path / 'index'}", "tools.topk=1",
        "reward.functions=[qa_em]", "algo.name=grpo", "train.steps=3", "train.lr=1e-3",
        f"log.dir={tmp_path}", "log.name=search", "log.progress=false", "log.tensorboard=false",
    ])
    comp = build_rl(cfg)
    try:
        _warm_start(comp, codes)
        before = {n: p.detach().clone() for n, p in comp.model.named_parameters()}
        asyncio.run(rl.run(comp))
    finally:
        comp.close()
    rows = read_metrics(comp.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert undocumented({k for r in rows for k in r}) == []  # engine/* too, on the started server
    assert max(r["rollout/tool_calls/search"] for r in rows) > 0.5, rows[0]  # episodes really searched
    assert all(r["rollout/tool_errors"] == 0 for r in rows)
    assert max(r["reward/std"] for r in rows) > 0  # some groups had a signal
    assert any(not torch.equal(before[n], p) for n, p in comp.model.named_parameters())  # the policy moved
    # the inserted search results are masked spans of the saved trajectories
    samples = [json.loads(line) for line in (comp.run_dir / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    masked = [seg["text"] for s in samples for seg in s["segments"] if seg["masked"]]
    assert any("<information>" in m and "the code of" in m for m in masked), masked[:3]
    assert not any("<information>" in seg["text"] for s in samples for seg in s["segments"] if not seg["masked"])


def test_tools_from_an_mcp_server_in_the_config(tmp_path):
    """tools.mcp only (no retriever): the workflow's registry holds the MCP server's search tool."""
    import sys

    from seekrl.build import build_workflow
    from seekrl.rewards.rubric import build_rubric
    from seekrl.tools.base import ToolCall
    from seekrl.tools.executor import EpisodeToolState

    data, codes = _world(tmp_path)
    server = f"{sys.executable} -m seekrl.servers.mcp --index {tmp_path / 'index'} --stdio"
    cfg = load_config(None, [
        f"data.train={data}", "tools.format=dr_tulu", f"tools.mcp=[{json.dumps(server)}]",
        "rollout.max_total_tokens=512", "rollout.group_size=2", "rollout.batch_size=4",
    ])
    from seekrl.models import train_tiny_tokenizer

    tok = train_tiny_tokenizer(["the code of brio is 12 <call_tool>"], vocab_size=64)
    wf = build_workflow(cfg, tok, build_rubric(cfg.reward, cfg.rollout.max_new_tokens))
    assert wf.executor.registry.names() == ["search"]
    result = asyncio.run(wf.executor.run(ToolCall("search", {"query": "brio"}, ""), EpisodeToolState()))
    assert result.ok and f"the code of brio is {codes['brio']}" in result.text


def test_unmasked_observations_ablation_trains_on_inserted_tokens(tmp_path):
    """rollout.mask_observations=false (Search-R1's ablation): inserted tokens join the loss, and
    the loop recomputes old log-probs for them (the engine never sampled them)."""
    data, codes = _world(tmp_path)
    cfg = load_config(None, [
        "model.path=tiny", "model.tiny_hidden=64", "model.max_context=320", f"data.train={data}",
        "rollout.group_size=4", "rollout.batch_size=16", "rollout.max_new_tokens=16", "rollout.max_prompt_tokens=96",
        "rollout.max_turns=2", "rollout.max_total_tokens=160", "rollout.max_obs_tokens=96",
        "rollout.mask_observations=false", "tools.format=search_r1", f"tools.retriever={tmp_path / 'index'}",
        "tools.topk=1", "reward.functions=[qa_em]", "train.steps=1", f"log.dir={tmp_path}", "log.name=nomask",
        "log.progress=false", "log.tensorboard=false",
    ])
    comp = build_rl(cfg)
    try:
        assert not comp.reuse_engine_logprobs  # placeholders are not log-probs: recompute
        _warm_start(comp, codes, steps=100)
        asyncio.run(rl.run(comp))
    finally:
        comp.close()
    row = read_metrics(comp.run_dir)[-1]
    assert row["rollout/unmasked_inserted_tokens"] > 0 and row["loss/policy"] == row["loss/policy"]
    samples = [json.loads(line) for line in (comp.run_dir / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    assert any("<information>" in seg["text"] and not seg["masked"] for s in samples for seg in s["segments"])


def test_answer_branches_train_each_episodes_last_turn_sampled_again(tmp_path):
    """rollout.answer_branches=3 through the RL loop on the KV-reusing engine: an episode that
    answered (or ran out of turns) comes with 2 branches of its last turn, which join its group,
    carry the shared history masked (its search turn trains once, in the episode), and are counted
    in rollout/answer_branch; evaluation keeps the unbranched workflow."""
    from itertools import groupby

    data, codes = _world(tmp_path)
    cfg = load_config(None, [
        "model.path=tiny", "model.tiny_hidden=64", "model.max_context=320", f"data.train={data}",
        "rollout.group_size=4", "rollout.batch_size=8", "rollout.max_new_tokens=16", "rollout.max_prompt_tokens=96",
        "rollout.max_turns=2", "rollout.max_total_tokens=160", "rollout.max_obs_tokens=96", "rollout.answer_branches=3",
        "rollout.reuse_kv_tokens=20000", "rollout.temperature=1.0", "tools.format=search_r1", f"tools.retriever={tmp_path / 'index'}",
        "tools.topk=1", "reward.functions=[qa_em]", "algo.name=grpo", "train.steps=2", "train.lr=1e-3", f"log.dir={tmp_path}",
        "log.name=branches", "log.progress=false", "log.tensorboard=false", "log.samples_every=1", "log.samples_groups=100",
    ])
    comp = build_rl(cfg)
    try:
        assert comp.workflow.answer_branches == 1 and comp.rollout.workflow.answer_branches == 3
        _warm_start(comp, codes, steps=150)
        asyncio.run(rl.run(comp))
        hits = comp.engine.prefix_kv.stats["hits"]
    finally:
        comp.close()
    rows = read_metrics(comp.run_dir)
    assert undocumented({k for r in rows for k in r}) == []
    assert hits > 0
    for r in rows:
        samples = [json.loads(line) for line in (comp.run_dir / "trajectories" / f"step_{r['step']}.jsonl").read_text().splitlines()]
        sizes = [len(list(g)) for _, g in groupby(samples, key=lambda s: s["task_id"])]
        assert len(sizes) == 2 and all(n >= 4 and (n - 4) % 2 == 0 for n in sizes)  # 4 episodes, 2 branches per decided one
        assert r["rollout/answer_branch"] == pytest.approx((sum(sizes) - 8) / sum(sizes))
    assert max(r["rollout/answer_branch"] for r in rows) > 0
    # a branch's shared search turn is a masked segment; in the episodes it is trained
    samples = [json.loads(line) for line in (comp.run_dir / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    assert any("<search>" in seg["text"] and seg["masked"] for s in samples for seg in s["segments"])
    assert any("<search>" in seg["text"] and not seg["masked"] for s in samples for seg in s["segments"])


def test_answer_branches_at_their_own_temperature_are_scored_at_it(tmp_path):
    """rollout.branch_temperature: the branches sample at it, carry it (Trajectory.temperature), and
    the trainer's log-probs of every sampled token, episodes' and branches', equal the engine's;
    scored at the run's temperature instead, the branches' would not."""
    from seekrl.rollout.config import sampling_params
    from seekrl.train.batch import TokenBatch

    data, codes = _world(tmp_path)
    cfg = load_config(None, [
        "model.path=tiny", "model.tiny_hidden=64", "model.max_context=320", f"data.train={data}",
        "rollout.group_size=4", "rollout.batch_size=8", "rollout.max_new_tokens=16", "rollout.max_prompt_tokens=96",
        "rollout.max_turns=2", "rollout.max_total_tokens=160", "rollout.max_obs_tokens=96", "rollout.answer_branches=3",
        "rollout.branch_temperature=1.6", "rollout.reuse_kv_tokens=20000", "rollout.temperature=0.8", "tools.format=search_r1",
        f"tools.retriever={tmp_path / 'index'}", "tools.topk=1", "reward.functions=[qa_em]", "algo.name=grpo", "train.steps=1",
        f"log.dir={tmp_path}", "log.name=hot", "log.progress=false", "log.tensorboard=false",
    ])
    comp = build_rl(cfg)
    try:
        _warm_start(comp, codes, steps=150)
        params = sampling_params(cfg.rollout, seed=5)
        groups = [asyncio.run(comp.rollout.workflow.run(task, comp.engine, 4, params)) for task in comp.tasks.train[:4]]
        trajs = [t for g in groups for t in g.trajectories if t.status == "ok"]
        branch = [t.metrics.get("answer_branch") == 1.0 for t in trajs]
        assert sum(branch) >= 4 and all((t.temperature == 1.6) == b for t, b in zip(trajs, branch))
        batch = TokenBatch.from_trajectories(trajs)
        scored = comp.trainer.logprobs(batch)
        batch.temperature_B = None  # every row at rollout.temperature
        flat = comp.trainer.logprobs(batch)
    finally:
        comp.close()
    for i, (t, b) in enumerate(zip(trajs, branch)):
        sampled = torch.tensor(t.loss_mask[: len(t.completion_ids)], dtype=torch.bool)
        engine = torch.tensor(t.logprobs)[sampled]
        assert (scored[i, : len(t.completion_ids)][sampled] - engine).abs().max() < 1e-4
        if b:
            assert (flat[i, : len(t.completion_ids)][sampled] - engine).abs().max() > 1e-2


def test_local_credit_filters_and_refills_by_the_spread_inside_a_branch_set(tmp_path):
    """algo.branch_credit=local with algo.filter_zero_std and rollout.refill: a group counts as
    informative only when one of its answer-branch sets has reward spread (every other group's
    tokens get advantage 0 under local). The trajectory files (with each row's `branch_set`) give
    every group handed over; the filter's kept_frac and the refill's counts match that notion, not
    the group's whole spread, and the run meets groups where the two differ."""
    from itertools import groupby

    data, codes = _world(tmp_path)
    cfg = load_config(None, [
        "model.path=tiny", "model.tiny_hidden=64", "model.max_context=320", f"data.train={data}",
        "rollout.group_size=4", "rollout.batch_size=8", "rollout.max_new_tokens=16", "rollout.max_prompt_tokens=96",
        "rollout.max_turns=2", "rollout.max_total_tokens=160", "rollout.max_obs_tokens=96", "rollout.answer_branches=2",
        "rollout.temperature=1.0", "tools.format=search_r1", f"tools.retriever={tmp_path / 'index'}", "tools.topk=1",
        "reward.functions=[qa_em]", "algo.name=grpo", "algo.branch_credit=local", "algo.filter_zero_std=true",
        "rollout.refill=true", "rollout.max_refill_rounds=2", "train.steps=3", "train.lr=1e-3", "train.seed=1",
        f"log.dir={tmp_path}", "log.name=local", "log.progress=false", "log.tensorboard=false", "log.samples_every=1",
        "log.samples_groups=100",
    ])
    comp = build_rl(cfg)
    try:
        _warm_start(comp, codes, steps=60)  # part-trained: some answers right, some wrong
        asyncio.run(rl.run(comp))
    finally:
        comp.close()
    rows = read_metrics(comp.run_dir)
    assert undocumented({k for r in rows for k in r}) == []
    differ = skipped = 0
    for r in rows:
        samples = [json.loads(line) for line in (comp.run_dir / "trajectories" / f"step_{r['step']}.jsonl").read_text().splitlines()]
        by_set, whole, usable, dead = [], [], [], 0
        for _, members in groupby(samples, key=lambda s: s["task_id"]):
            ok = [s for s in members if s["status"] == "ok"]
            sets = {}
            for s in ok:
                sets.setdefault(s.get("branch_set"), []).append(s["reward"])
            assert None not in sets  # every row of a branched run is in a set
            by_set.append(any(max(v) > min(v) for v in sets.values()))
            if by_set[-1]:  # kept: its sets without spread have advantage 0 on every row
                dead += sum(len(v) for v in sets.values() if max(v) == min(v))
            whole.append(len(ok) > 1 and max(s["reward"] for s in ok) > min(s["reward"] for s in ok))
            usable.append(len(ok))
        differ += sum(w and not b for w, b in zip(whole, by_set))
        assert r["rollout/refill/dropped_groups"] == by_set.count(False)
        assert r["rollout/refill/short"] == 2 - sum(by_set)
        assert r["rollout/kept_frac"] == pytest.approx(sum(n for n, b in zip(usable, by_set) if b) / sum(usable))
        # the update leaves those rows out (train.skip_zero_advantage): a row left out per dead row
        assert r["train/skipped_rows"] == pytest.approx(dead / sum(n for n, b in zip(usable, by_set) if b))
        skipped += dead
    assert differ > 0  # groups that differ as a whole but in no set: kept before, dropped now
    assert skipped > 0  # and kept groups with a set of advantage 0, whose rows the update left out
