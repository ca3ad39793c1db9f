"""ToolAgentWorkflow: property tests over random scripted episodes, and a run with the tiny model.

The scripted engine answers `generate` with random turns (well-formed searches, malformed
calls, answers, over-long turns, bare EOS) and records every call; the tool randomly errors,
times out or returns long text, decided by the query so the test can predict each outcome.
From the records each trajectory is rebuilt segment by segment and compared exactly; in the
stepwise layout each training sample is compared with the engine call it came from.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.errors import ConfigError
from seekrl.rewards.rubric import Rubric
from seekrl.tools import ToolExecutor, ToolRegistry, get_format, tool
from seekrl.train.batch import TokenBatch
from seekrl.types import Completion, SamplingParams, Task
from seekrl.workflows.tool_agent import ToolAgentWorkflow

MAX_CALLS = 3
TASK = Task(id="t0", prompt=[{"role": "user", "content": "Question: what is the capital of France?"}], answer="Paris")


def make_search_tool(invocations: dict):
    @tool(timeout_s=0.02, max_calls=MAX_CALLS)
    async def search(query: str) -> str:
        """Search the corpus.

        Args:
            query: the query.
        """
        ep = query.split()[0]
        invocations[ep] = invocations.get(ep, 0) + 1
        if "err" in query:
            raise RuntimeError("index offline")
        if "slow" in query:
            await asyncio.sleep(0.2)
        if "long" in query:
            return "Doc 1(Title: France) " + "Paris is the capital of France. " * 40
        return f"Doc 1(Title: {query}) Paris."

    return search


def scripted_turn(fmt_name: str, kind: str, tag: str, mode: str) -> tuple[str, bool]:
    """(text, ends with EOS) of one scripted turn in the given call format."""
    q = f"{tag} {mode}"
    if fmt_name == "hermes":
        call = lambda q: '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % q  # noqa: E731
        return {
            "search": (call(q), True),
            "multi": (call(q) + "\n" + call(f"{tag} ok"), True),
            "unclosed": ('<tool_call>{"name": "search"', True),
            "empty": ("<tool_call>{name: search}</tool_call>", True),
            "answer": ("<answer> Paris </answer>", True),
            "noise": ("the quick brown fox", True),
            "eos": ("", True),
            "long": ("the lazy dog " * 60, True),
        }[kind]
    if fmt_name == "dr_tulu":
        call = lambda q: f'<call_tool name="search">{q}</call_tool>'  # noqa: E731
        return {
            "search": (call(q), False),
            "multi": (call(q), False),
            "unclosed": (f'<call_tool name="search">{q}', True),
            "empty": ('<call_tool name=search>x</call_tool>', False),
            "answer": ("<answer> Paris </answer>", False),
            "noise": ("the quick brown fox", True),
            "eos": ("", True),
            "long": ("the lazy dog " * 60, True),
        }[kind]
    return {
        "search": (f"<search> {q} </search>", False),
        "multi": (f"<search> {q} </search>", False),
        "unclosed": (f"<search> {tag} forgot to close", True),
        "empty": ("<search>  </search>", False),
        "answer": ("<think> done </think> <answer> Paris </answer>", False),
        "noise": ("the quick brown fox", True),
        "eos": ("", True),
        "long": ("the lazy dog " * 60, True),
    }[kind]


class ScriptedEngine:
    """Random turns; records (prompt_ids, params, Completion, text) of every call."""

    KINDS = ["search"] * 5 + ["multi", "unclosed", "empty", "answer", "noise", "eos", "long"]

    def __init__(self, tokenizer, rng: random.Random, tag: str, fmt_name: str = "search_r1", kinds=None, think: bool = False):
        self.tok, self.rng, self.tag, self.fmt_name = tokenizer, rng, tag, fmt_name
        self.kinds = kinds or self.KINDS
        self.think = think  # each turn opens with a <think> block (what a thinking model writes)
        self.records: list[tuple[list[int], SamplingParams, Completion, str]] = []

    def _text(self) -> tuple[str, bool]:
        r = self.rng
        kind = r.choice(self.kinds)
        mode = r.choice(["ok", "ok", "err", "slow", "long"])
        text, eos = scripted_turn(self.fmt_name, kind, self.tag, mode)
        return (f"<think> plan {len(self.records)} </think>\n" + text if self.think else text), eos

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(0)
        text, eos = self._text()
        ids = self.tok.encode(text, add_special_tokens=False) + ([self.tok.eos_token_id] if eos else [])
        reason = "stop"
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[: params.max_new_tokens], "length"
        c = Completion(ids, [self.rng.uniform(-5, -0.01) for _ in ids], reason, self.rng.randint(0, 3))
        self.records.append((list(prompt_ids), params, c, text))
        return c


def check_trajectory(traj, eng: ScriptedEngine, wf: ToolAgentWorkflow, invocations: dict, turns=None):
    """`turns`: the rewards' ctx["turns"] for this episode, when recorded."""
    fmt, tok = wf.fmt, wf.tokenizer
    P, C = traj.prompt_ids, traj.completion_ids
    assert len(C) == len(traj.loss_mask) == len(traj.logprobs) == len(traj.versions)
    assert len(C) <= wf.max_total_tokens
    assert 1 <= len(eng.records) <= wf.max_turns + 1
    assert traj.metrics["turns"] == len(eng.records)
    inserted_mask = 0 if wf.mask_observations else 1
    pos, exp_invalid, exp_errors, exp_calls, n_search = 0, 0, 0, 0, 0
    for k, (prompt, params, c, text) in enumerate(eng.records):
        # the k-th prompt is exactly the prompt + the completion so far (re-rendered by the chat template: stepwise, hermes)
        assert prompt == traj.turn_prompt(k)
        if not wf.rerender:
            assert prompt == P + C[:pos]
        assert traj.turn_spans[k] == [pos, pos + len(c.token_ids)]
        assert params.max_new_tokens == min(wf.params.max_new_tokens, wf.max_total_tokens - pos)
        final = k == wf.max_turns
        assert params.stop == (fmt.answer_stop if final else fmt.stop)
        n = len(c.token_ids)
        assert C[pos : pos + n] == c.token_ids
        assert traj.loss_mask[pos : pos + n] == [1] * n
        assert traj.logprobs[pos : pos + n] == c.logprobs
        assert traj.versions[pos : pos + n] == [c.version] * n
        pos += n
        end = traj.turn_spans[k + 1][0] if k + 1 < len(eng.records) else len(C)
        obs = C[pos:end]
        assert len(obs) <= wf.max_obs_tokens
        assert traj.loss_mask[pos:end] == [inserted_mask] * len(obs)
        assert traj.logprobs[pos:end] == [0.0] * len(obs)
        assert traj.versions[pos:end] == [-1] * len(obs)
        if turns is not None:  # what the rewards read: the turn's text, and the observation exactly as inserted
            assert len(turns) == len(eng.records) and turns[k].text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert turns[k].shown == tok.decode(obs, skip_special_tokens=True) if obs else turns[k].shown in (None, "")
        parsed = fmt.parse(tok.decode(c.token_ids, skip_special_tokens=True))
        if parsed.answer is not None and c.finish_reason == "length" and fmt.answer_requires_stop:
            parsed.answer, parsed.invalid = None, True  # a cut turn is not an answer (hermes)
        if k + 1 < len(eng.records) or obs:  # a tool turn: an observation follows
            assert not final and parsed.answer is None
            closed = bool(c.token_ids) and c.token_ids[-1] == tok.eos_token_id
            if parsed.invalid or not parsed.calls:
                exp_invalid += 1
                inv = fmt.invalid_observation(tok, closed=closed)
                assert obs == inv[: len(obs)] or wf.truncate_observation(inv, wf.max_obs_tokens)[0][: len(obs)] == obs
            else:
                for call in parsed.calls:
                    exp_calls += 1
                    n_search += 1
                    q = call.args["query"]
                    exp_errors += int(n_search > MAX_CALLS or "err" in q or "slow" in q)
        pos = end
    assert pos == len(C)  # completion_ids == the sampled turns and the observations, in order
    last = eng.records[-1]
    if traj.finish_reason == "answered":
        assert fmt.parse(last[3] if last[2].finish_reason == "stop" else "").answer is not None
    elif traj.finish_reason == "max_turns":
        assert len(eng.records) == wf.max_turns + 1
    else:
        assert traj.finish_reason == "length" and len(C) >= wf.max_total_tokens or last[2].finish_reason == "length"
    assert traj.metrics["invalid_actions"] == exp_invalid
    assert traj.metrics["tool_calls"] == exp_calls == traj.metrics.get("tool_calls/search", 0)
    assert traj.metrics["tool_errors"] == exp_errors
    assert invocations.get(eng.tag, 0) <= MAX_CALLS
    assert traj.metrics["obs_tokens"] == sum(1 for i in range(len(C)) if traj.versions[i] == -1)
    if not wf.mask_observations:
        assert traj.metrics["unmasked_inserted_tokens"] == traj.metrics["obs_tokens"]
    assert traj.text == tok.decode(C, skip_special_tokens=True)
    if traj.stepwise:
        check_stepwise(traj, eng, wf)


def check_stepwise(traj, eng: ScriptedEngine, wf: ToolAgentWorkflow):
    """Stepwise: one training sample per engine call, token for token what the engine was given and returned."""
    tok, P = wf.tokenizer, traj.prompt_ids
    batch = TokenBatch.from_trajectories([traj])
    assert len(batch) == len(eng.records) == len(traj.steps())
    for k, (prompt, _, c, _) in enumerate(eng.records):
        assert batch.prompt_ids[k] == prompt and batch.completion_ids[k] == c.token_ids
        n = len(c.token_ids)
        assert batch.loss_mask_BC[k, :n].tolist() == [1.0] * n and not batch.loss_mask_BC[k, n:].any()
        assert batch.behav_logp_BC[k, :n].tolist() == pytest.approx(c.logprobs)
        assert batch.versions_BC[k, :n].tolist() == [c.version] * n
        assert batch.turn_BC[k, :n].tolist() == [k] * n and batch.turns_B[k] == len(eng.records)
        if not wf.rerender:
            continue
        # re-rendered by the chat template: the task's prompt, then one assistant turn per earlier engine call
        assert prompt[: len(P)] == P  # ChatML: the first prompt, whose assistant header opens the first turn
        text = tok.decode(prompt, skip_special_tokens=False)
        assert text.count("<|im_start|>assistant") == k + 1
        if "</think>" in (tok.chat_template or ""):  # the thinking template
            assert "<think>" not in text  # it dropped every earlier thought
    assert traj.metrics["prefix_breaks"] == sum(p is not None for p in traj.turn_prompts)


def run_random_episodes(tokenizer, seed: int, n_episodes: int = 8, fmt_name: str = "search_r1", kinds=None, think: bool = False, **fixed):
    """`n_episodes` scripted episodes under a random workflow config (`fixed` overrides its fields)."""
    rng = random.Random(f"config-{seed}")
    cfg = {
        "max_new_tokens": rng.choice([8, 48, 128, 128]),
        "max_turns": rng.randint(0, 5),
        "max_obs_tokens": rng.choice([8, 20, 64, 512]),
        "max_total_tokens": rng.choice([16, 60, 300, 1200]),
        "mask_observations": rng.random() < 0.8,
    }
    cfg.update(fixed)
    invocations: dict = {}
    reg = ToolRegistry([make_search_tool(invocations)])
    seen_turns: dict = {}  # completion -> the ctx["turns"] its reward was given

    def record_turns(completion, task, **ctx):
        seen_turns[completion] = ctx["turns"]
        return 0.0

    wf = ToolAgentWorkflow(
        tokenizer,
        SamplingParams(max_new_tokens=cfg.pop("max_new_tokens"), temperature=1.0),
        Rubric(["qa_em", record_turns], [1.0, 0.0]),
        get_format(fmt_name),
        ToolExecutor(reg),
        **cfg,
    )
    engines = [ScriptedEngine(tokenizer, random.Random(rng.random()), f"ep{i}", fmt_name, kinds, think) for i in range(n_episodes)]

    async def main():
        return await asyncio.gather(*(wf.run(TASK, e, 1) for e in engines))

    groups = asyncio.run(main())
    for g, eng in zip(groups, engines):
        (traj,) = g.trajectories
        check_trajectory(traj, eng, wf, invocations, seen_turns[traj.text])
        assert traj.finish_reason in ("answered", "max_turns", "length")
        assert set(traj.reward_parts) == {"qa_em", "record_turns"} and traj.reward in (0.0, 1.0)
    return [g.trajectories[0] for g in groups]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), fmt_name=st.sampled_from(["search_r1", "dr_tulu", "hermes"]))
def test_random_scripted_episodes_keep_the_contract(tiny_tokenizer, seed, fmt_name):
    run_random_episodes(tiny_tokenizer, seed, fmt_name=fmt_name)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), fmt_name=st.sampled_from(["search_r1", "dr_tulu", "hermes"]))
def test_answer_branches_sample_the_last_turn_again_from_the_same_history(tiny_tokenizer, seed, fmt_name):
    """rollout.answer_branches=3: an episode that ended by its last turn's decision gets 2 branches
    that go on from its state before that turn: the same history and prompt, their own seeds, the
    history masked (it trains once, in the first episode), their own sampled tokens trained, their
    own rewards; the evaluation's workflow (the one branched from) still runs n episodes."""
    from seekrl.rollout import episode_params, stable_seed, turn_seed

    rng = random.Random(f"branch-{seed}")
    base = ToolAgentWorkflow(
        tiny_tokenizer, SamplingParams(max_new_tokens=rng.choice([8, 48, 128]), temperature=1.0, seed=seed), Rubric(["qa_em"]),
        get_format(fmt_name), ToolExecutor(ToolRegistry([make_search_tool({})])), max_turns=rng.randint(0, 4),
        max_obs_tokens=rng.choice([20, 64]), max_total_tokens=rng.choice([60, 300, 1200]),
    )
    wf = base.with_answer_branches(3)
    assert base.answer_branches == 1 and wf.answer_branches == 3 and wf.executor is base.executor
    for i in range(4):
        eng = ScriptedEngine(tiny_tokenizer, random.Random(rng.random()), f"ep{i}", fmt_name)
        first, *branches = asyncio.run(wf.run(TASK, eng, 1)).trajectories
        decided = first.status == "ok" and first.finish_reason in ("answered", "max_turns")
        assert len(branches) == (2 if decided else 0) and first.metrics["answer_branch"] == 0.0
        spread = float(len({t.reward for t in (first, *branches)}) > 1)  # the set's answers told apart by their rewards
        assert all(t.metrics["branch_spread_frac"] == spread for t in (first, *branches))
        if not decided:
            continue
        k = len(first.turn_spans) - 1  # the last turn, sampled again
        shared = first.turn_spans[k][0]
        context = first.prompt_ids + first.completion_ids[:shared]
        asked = [params for prompt, params, _, _ in eng.records if prompt == context]
        seed0 = episode_params(wf.params, TASK, 1)[0].seed
        assert sorted(p.seed for p in asked) == sorted(turn_seed(s, k) for s in (seed0, *(stable_seed(seed0, "branch", j) for j in (1, 2))))
        for b in branches:
            assert b.metrics["answer_branch"] == 1.0 and b.prompt_ids == first.prompt_ids
            assert b.completion_ids[:shared] == first.completion_ids[:shared] and b.turn_spans[:k] == first.turn_spans[:k]
            assert b.loss_mask[:shared] == [0] * shared and b.logprobs[:shared] == [0.0] * shared and b.versions[:shared] == [-1] * shared
            own = b.turn_spans[k:]
            assert own and own[0][0] == shared and all(b.loss_mask[s:e] == [1] * (e - s) for s, e in own)
            assert b.metrics["turns"] == len(b.turn_spans) >= k + 1 and b.metrics["tool_calls"] >= first.metrics["tool_calls"]
            assert b.text == tiny_tokenizer.decode(b.completion_ids, skip_special_tokens=True)
        own_scores = asyncio.run(wf.rubric.score_many((t.text, TASK, {"turns": []}) for t in (first, *branches)))
        assert [t.reward for t in (first, *branches)] == [r.total for r in own_scores]  # each scored on its own text
        batch = TokenBatch.from_trajectories([first, *branches], [0, 0, 0])
        assert batch.loss_mask_BC.sum().item() == sum(sum(t.loss_mask) for t in (first, *branches))
        # algo.branch_credit: the set is marked, and the episode's history (and only it) trains with the set's mean advantage
        assert {t.branch_set for t in (first, *branches)} == {0} and first.shared_tokens == shared
        assert [t.shared_tokens for t in branches] == [0, 0]
        assert batch.branch_set_B.tolist() == [0, 0, 0] and batch.shared_B.tolist() == [shared, 0, 0]
        if spread:
            from seekrl.train.estimate import task_advantages
            own = task_advantages("dr_grpo", batch, branch_credit="episode").adv_BC
            tree = task_advantages("dr_grpo", batch, branch_credit="mean").adv_BC  # a one-episode group: its set's mean is 0
            assert torch.equal(own[1:], tree[1:]) and torch.equal(own[0, shared:], tree[0, shared:])
            assert tree[0, :shared].abs().sum().item() < 1e-5
            if 1 in first.loss_mask[:shared]:  # a sampled history (a search turn): the episode's own advantage, 0/1 rewards with spread
                assert own[0, :shared].abs().max().item() > 0.3
    assert len(asyncio.run(base.run(TASK, ScriptedEngine(tiny_tokenizer, random.Random(seed), "ev", fmt_name), 2)).trajectories) == 2


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), fmt_name=st.sampled_from(["search_r1", "dr_tulu"]))
def test_answer_branches_from_the_answer_sample_only_the_answers_text(tiny_tokenizer, seed, fmt_name):
    """rollout.branch_from=answer: an episode whose last turn opened an answer gets branches that
    start after that opening (the shortest head of the turn containing `<answer>`, copied and masked
    with the history), so that what they sample is only the answer's text; the episode's shared part
    (credited with the set's mean advantage) covers the opening too; other episodes get none."""
    rng = random.Random(f"answer-branch-{seed}")
    fmt = get_format(fmt_name)
    wf = ToolAgentWorkflow(
        tiny_tokenizer, SamplingParams(max_new_tokens=rng.choice([48, 128]), temperature=1.0, seed=seed), Rubric(["qa_em"]),
        fmt, ToolExecutor(ToolRegistry([make_search_tool({})])), max_turns=rng.randint(0, 3),
        max_obs_tokens=rng.choice([20, 64]), max_total_tokens=rng.choice([300, 1200]),
    ).with_answer_branches(3, branch_from="answer")
    decode = lambda ids: tiny_tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    for i in range(6):
        eng = ScriptedEngine(tiny_tokenizer, random.Random(rng.random()), f"ep{i}", fmt_name, kinds=["search", "answer", "answer", "noise"])
        first, *branches = asyncio.run(wf.run(TASK, eng, 1)).trajectories
        decided = first.status == "ok" and first.finish_reason in ("answered", "max_turns")
        start, end = first.turn_spans[-1]
        opened = decided and "<answer>" in decode(first.completion_ids[start:end])
        assert len(branches) == (2 if opened else 0)
        if not opened:
            continue
        shared = first.shared_tokens
        opening = first.completion_ids[start:shared]
        assert start < shared <= end and "<answer>" in decode(opening) and "<answer>" not in decode(opening[:-1])
        context = first.prompt_ids + first.completion_ids[:shared]
        assert sum(prompt == context for prompt, _, _, _ in eng.records) == 2  # each branch asked from after the opening
        for b in branches:
            assert b.completion_ids[:shared] == first.completion_ids[:shared] and b.loss_mask[:shared] == [0] * shared
            assert b.turn_spans[len(first.turn_spans) - 1][0] == start  # the opening belongs to the branch's first turn
            assert b.loss_mask[shared:shared + 1] == [1] and b.metrics["answer_branch"] == 1.0
            assert b.text == decode(b.completion_ids)
        batch = TokenBatch.from_trajectories([first, *branches], [0, 0, 0])
        assert batch.shared_B.tolist() == [shared, 0, 0]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), fmt_name=st.sampled_from(["search_r1", "dr_tulu", "hermes"]), think=st.booleans())
def test_random_stepwise_episodes_train_on_exactly_what_the_engine_was_given(think_tokenizer, tiny_tokenizer, seed, fmt_name, think):
    """rollout.trajectory=stepwise, with a chat template that drops earlier <think> blocks (and with
    plain ChatML): every sample's prompt and completion are the engine call's ids, token for token."""
    tok = think_tokenizer if think else tiny_tokenizer
    trajs = run_random_episodes(tok, seed, fmt_name=fmt_name, think=think, trajectory="stepwise", mask_observations=True)
    if fmt_name != "hermes":  # the text formats never re-render: every turn's prompt is the concatenation
        assert all(p is None for t in trajs for p in t.turn_prompts)


def test_stepwise_hermes_with_a_thinking_template_re_renders_every_turn(think_tokenizer):
    """The template drops earlier thoughts: every turn after the first is sampled from a prompt that is
    not the concatenation, and the samples carry those prompts."""
    trajs = []
    for seed in range(3):
        trajs += run_random_episodes(think_tokenizer, seed, fmt_name="hermes", think=True, trajectory="stepwise", kinds=["search", "multi"],
                                     max_new_tokens=128, max_turns=3, max_obs_tokens=40, max_total_tokens=1200, mask_observations=True)
    multi = [t for t in trajs if len(t.turn_spans) > 1]
    assert multi and all(t.metrics["prefix_breaks"] == len(t.turn_spans) - 1 for t in multi)
    assert all(t.turn_prompts[0] is None and all(p is not None for p in t.turn_prompts[1:]) for t in multi)


@pytest.mark.parametrize("template", ["drop_all", "qwen3_like"])
def test_prefix_layout_refuses_a_template_that_rewrites_earlier_turns(tiny_texts, think_templates, template):
    """Detected when the workflow is built: one line that names the fix. Qwen3's template keeps the
    thoughts of tool turns but drops them once a user message follows (the invalid-action turn)."""
    from seekrl.models import train_tiny_tokenizer

    tok = train_tiny_tokenizer(tiny_texts, vocab_size=128)
    tok.chat_template = think_templates[template]

    def workflow(fmt_name, trajectory):
        return ToolAgentWorkflow(tok, SamplingParams(max_new_tokens=8), Rubric(["qa_em"]), get_format(fmt_name),
                                 ToolExecutor(ToolRegistry([make_search_tool({})])), trajectory=trajectory)

    with pytest.raises(ConfigError, match=r"rewrites earlier turns .*set rollout\.trajectory=stepwise$") as e:
        workflow("hermes", "prefix")
    assert "\n" not in str(e.value) and "<think>" in str(e.value)
    assert workflow("hermes", "stepwise").rerender
    assert not workflow("search_r1", "prefix").rerender  # one assistant message the template never re-renders: no check


def test_prefix_layout_accepts_a_template_that_keeps_earlier_turns(tiny_tokenizer):
    wf = ToolAgentWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=8), Rubric(["qa_em"]), get_format("hermes"),
                           ToolExecutor(ToolRegistry([make_search_tool({})])))
    assert wf.trajectory == "prefix" and not wf.rerender


@pytest.mark.parametrize("fmt_name", ["search_r1", "dr_tulu", "hermes"])
def test_scripted_episodes_cover_every_outcome(tiny_tokenizer, fmt_name):
    """The random episodes do reach every branch the property test checks (seeded, deterministic)."""
    trajs: list = []

    def covered():
        tot = lambda k: sum(t.metrics.get(k, 0) for t in trajs)  # noqa: E731
        return {
            "reasons": {t.finish_reason for t in trajs} == {"answered", "max_turns", "length"},
            "invalid": tot("invalid_actions") > 0,
            "errors": tot("tool_errors") > 0,
            "truncated": tot("truncated_obs") > 0,
            "unmasked": tot("unmasked_inserted_tokens") > 0,
            "max_calls": any(t.metrics["tool_calls"] > MAX_CALLS for t in trajs),
        }

    configs = [
        {"kinds": ["search", "multi"], "max_new_tokens": 128, "max_turns": 5, "max_obs_tokens": 40, "max_total_tokens": 1200},
        {"max_new_tokens": 128, "max_turns": 3, "max_obs_tokens": 512, "max_total_tokens": 1200, "mask_observations": False},
        {"max_new_tokens": 48, "max_turns": 2, "max_obs_tokens": 20, "max_total_tokens": 300},
        {"max_new_tokens": 8, "max_turns": 4, "max_obs_tokens": 8, "max_total_tokens": 60},
    ]
    for seed in range(3):
        for cfg in configs:
            trajs += run_random_episodes(tiny_tokenizer, seed, fmt_name=fmt_name, **cfg)
    assert all(covered().values()), covered()


def test_group_episodes_run_concurrently(tiny_tokenizer):
    """The G episodes of a group overlap their tool calls (no barrier between episodes)."""
    live = {"now": 0, "max": 0}

    @tool
    async def search(query: str) -> str:
        """Search."""
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        await asyncio.sleep(0.05)
        live["now"] -= 1
        return "Paris."

    class TwoTurns:
        async def generate(self, prompt_ids, params):
            text = "<search> q </search>" if "</information>" not in tiny_tokenizer.decode(prompt_ids) else "<answer> Paris </answer>"
            ids = tiny_tokenizer.encode(text, add_special_tokens=False)
            return Completion(ids, [-0.5] * len(ids), "stop", 7)

    wf = ToolAgentWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=32), Rubric(["qa_em"]), get_format("search_r1"), ToolExecutor(ToolRegistry([search])))
    g = asyncio.run(wf.run(TASK, TwoTurns(), 6))
    assert live["max"] == 6
    assert [t.finish_reason for t in g.trajectories] == ["answered"] * 6 and g.rewards == [1.0] * 6
    t = g.trajectories[0]
    assert t.metrics["turns"] == 2 and t.metrics["tool_calls/search"] == 1 and t.metrics["valid_actions"] == 2
    assert t.text.endswith("<search> q </search>\n\n<information>Paris.</information>\n\n<answer> Paris </answer>")


def test_infrastructure_failures_mark_the_trajectory(tiny_tokenizer):
    """A tool whose server is down, or an engine request that fails, ends the episode with a status
    the trainer leaves out (not an error observation to learn from)."""
    from seekrl.errors import EngineRequestError

    @tool(retries=0)
    async def search(query: str) -> str:
        """Search a server that refuses connections."""
        raise ConnectionRefusedError("retrieval server down")

    class Engine:
        def __init__(self, fail_on: int):
            self.calls, self.fail_on = 0, fail_on

        async def generate(self, prompt_ids, params):
            self.calls += 1
            if self.calls == self.fail_on:
                raise EngineRequestError("the server refused the request (400)")
            ids = tiny_tokenizer.encode("<search> q </search>", add_special_tokens=False)
            return Completion(ids, [-0.5] * len(ids), "stop", 0)

    wf = ToolAgentWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=32), Rubric(["qa_em"]), get_format("search_r1"),
                           ToolExecutor(ToolRegistry([search])))
    t = asyncio.run(wf.run(TASK, Engine(fail_on=0), 1)).trajectories[0]
    assert t.status == "tool_unavailable" and t.finish_reason == "error" and t.metrics["turns"] == 1
    t = asyncio.run(wf.run(TASK, Engine(fail_on=1), 1)).trajectories[0]
    assert t.status == "engine_error" and t.finish_reason == "error" and t.completion_ids == []


@pytest.mark.parametrize("fmt_name", ["search_r1", "hermes"])
def test_tiny_model_end_to_end(tiny_tokenizer, tiny_model, fmt_name):
    """A real LocalEngine samples every turn; the first turn of each episode is replaced by a
    scripted call (a random model never writes one). Every prompt is prompt_ids + completion so far."""
    from seekrl.engines.local import LocalEngine

    fmt = get_format(fmt_name)
    call = "<search> capital of France </search>" if fmt_name == "search_r1" else '<tool_call>{"name": "search", "arguments": {"query": "France"}}</tool_call>'

    @tool
    async def search(query: str) -> str:
        """Search."""
        await asyncio.sleep(0.01)
        return "Paris is the capital of France."

    class Recording:
        def __init__(self, inner):
            self.inner, self.calls = inner, []

        async def generate(self, prompt_ids, params):
            c = await self.inner.generate(prompt_ids, params)
            if len(prompt_ids) == len(prompt0):  # first turn: scripted tool call
                ids = tiny_tokenizer.encode(call, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
                c = Completion(ids, [0.0] * len(ids), "stop", c.version)
            self.calls.append((list(prompt_ids), c))
            return c

    wf = ToolAgentWorkflow(
        tiny_tokenizer, SamplingParams(max_new_tokens=12), Rubric(["qa_em"]), fmt, ToolExecutor(ToolRegistry([search])),
        max_turns=2, max_obs_tokens=64, max_total_tokens=160,
    )
    prompt0 = wf.prompt_ids(TASK)
    eng = Recording(LocalEngine(tiny_model, tiny_tokenizer, seed=0))
    g = asyncio.run(wf.run(TASK, eng, 3))
    assert len(g.trajectories) == 3
    by_traj = {id(t): t for t in g.trajectories}
    for prompt, c in eng.calls:  # each call continues exactly one trajectory's ids
        matches = [t for t in by_traj.values() if (t.prompt_ids + t.completion_ids)[: len(prompt) + len(c.token_ids)] == prompt + c.token_ids]
        assert matches, "a prompt that is not prompt_ids + completion_ids so far"
    for t in g.trajectories:
        assert t.prompt_ids == prompt0
        assert t.metrics["tool_calls/search"] == 1 and t.metrics["turns"] >= 2
        obs = [i for i, m in zip(t.completion_ids, t.loss_mask) if m == 0]
        assert "Paris is the capital of France." in tiny_tokenizer.decode(obs)
        assert t.finish_reason in ("answered", "max_turns", "length")


def test_seeded_rollouts_do_not_depend_on_batching_or_tool_latency(tiny_tokenizer, tiny_model):
    """With `params.seed`, each episode and turn samples from its own seed: an engine that batches
    2 requests at a time and tools that answer in a random order give the same tokens as one
    batch of everything; the episodes of a group and two step seeds still differ."""
    from seekrl.engines.local import LocalEngine
    from seekrl.rollout import collect

    jitter = random.Random()

    @tool
    async def search(query: str) -> str:
        """Search."""
        await asyncio.sleep(jitter.random() * 0.01)
        return "Paris is the capital of France."

    class FirstTurnCalls:
        """The real engine samples every turn; the first turn of an episode asks a search, so every
        episode has a tool turn (a random model never writes one)."""

        def __init__(self, inner, prompt_len):
            self.inner, self.prompt_len = inner, prompt_len

        async def generate(self, prompt_ids, params):
            c = await self.inner.generate(prompt_ids, params)
            if len(prompt_ids) == self.prompt_len and c.token_ids and c.token_ids[0] % 2:
                ids = tiny_tokenizer.encode("<search> France </search>", add_special_tokens=False)
                c = Completion(ids, [0.0] * len(ids), "stop", c.version)
            return c

    wf = ToolAgentWorkflow(
        tiny_tokenizer, SamplingParams(max_new_tokens=10), Rubric(["qa_em"]), get_format("search_r1"),
        ToolExecutor(ToolRegistry([search])), max_turns=2, max_obs_tokens=64, max_total_tokens=160,
    )
    tasks = [TASK, Task(id="t1", prompt=[{"role": "user", "content": "Question: where is Paris?"}], answer="France")]

    def rollout(batch_size: int, seed: int | None):
        eng = FirstTurnCalls(LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=batch_size, seed=batch_size),
                             len(wf.prompt_ids(TASK)))
        params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed)
        groups = asyncio.run(collect(wf, eng, tasks, 4, params))
        return [(t.completion_ids, t.loss_mask) for g in groups for t in g.trajectories]

    one_batch = rollout(64, seed=7)
    assert rollout(2, seed=7) == one_batch
    assert sum(1 for ids, mask in one_batch if 0 in mask) >= 2  # tool turns were taken
    assert len({tuple(ids) for ids, _ in one_batch}) > 4  # the 8 episodes are different draws
    assert rollout(64, seed=8) != one_batch
    # without a seed, the engine's own generator decides: its seed and its batches matter
    assert rollout(64, seed=None) != rollout(2, seed=None)
