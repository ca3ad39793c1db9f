"""Agents written against the OpenAI API, trained as they are (workflows/agent.py, agent_endpoint.py).

Real pieces: the per-episode endpoint serves on 127.0.0.1 (uvicorn in its thread), the agents use
the stock `openai` client (or raw httpx for the refusals), and the engine is LocalEngine over the
tiny model, or a scripted engine where a test needs a given reply (tool calls).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from seekrl.engines.local import LocalEngine  # noqa: E402
from seekrl.models import encode_chat  # noqa: E402
from seekrl.rewards.rubric import Rubric  # noqa: E402
from seekrl.types import Completion, SamplingParams, Task  # noqa: E402
from seekrl.workflows.agent import AgentWorkflow  # noqa: E402
from seekrl.workflows.agent_record import decode_exact  # noqa: E402

TASK = Task("copy-1", [{"role": "user", "content": "copy: 3 7 1"}], "3 7 1", meta={"answer_format": "plain"})
PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)


class RecordingEngine:
    """LocalEngine, remembering every (prompt ids, completion) it was asked for."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []
        self.version, self.exact_logprobs = engine.version, True

    async def generate(self, prompt_ids, params):
        c = await self.engine.generate(prompt_ids, params)
        self.seen.append((list(prompt_ids), c))
        return c


class ScriptedEngine:
    """Replies with fixed texts, in order (encoded by the tokenizer), log-prob -0.5 each."""

    def __init__(self, tokenizer, replies):
        self.tok, self.replies, self.seen, self.version = tokenizer, list(replies), [], 0

    async def generate(self, prompt_ids, params):
        ids = self.tok.encode(self.replies.pop(0), add_special_tokens=False)[: params.max_new_tokens]
        self.seen.append((list(prompt_ids), ids))
        return Completion(ids, [-0.5] * len(ids), "stop", 0)


@pytest.fixture(scope="module")
def local(tiny_model, tiny_tokenizer):
    return LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=16)


def client(base_url, api_key):
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)


def workflow(tok, agent, params=PARAMS, **kw):
    kw.setdefault("max_calls", 4)
    kw.setdefault("max_tokens", 64)
    kw.setdefault("timeout_s", 30)
    return AgentWorkflow(tok, params, Rubric(["qa_f1"]), agent, context=1024, **kw)


def run(wf, engine, n=1, task=TASK):
    try:
        return asyncio.run(wf.run(task, engine, n))
    finally:
        wf.close()


def two_turn_agent(task, base_url, api_key):
    """Asks, then continues its own reply (vLLM's continue_final_message): the second prompt extends the first."""
    c = client(base_url, api_key)
    first = c.chat.completions.create(model="p", messages=task["messages"], max_tokens=3,
                                      extra_body={"include_stop_str_in_output": True})
    so_far = first.choices[0].message.content
    second = c.chat.completions.create(model="p", messages=task["messages"] + [{"role": "assistant", "content": so_far + " 5"}],
                                       max_tokens=3, extra_body={"continue_final_message": True, "add_generation_prompt": False})
    return so_far + " 5" + second.choices[0].message.content


def test_chained_calls_make_one_sequence_of_exactly_the_sampled_tokens(local, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = RecordingEngine(local)
    group = run(workflow(tok, two_turn_agent), engine, n=4)
    assert len(group.trajectories) == 4 and len(engine.seen) == 8
    by_prompt = {}
    for prompt, c in engine.seen:
        by_prompt.setdefault(tuple(prompt), []).append(c)
    first_prompt = encode_chat(tok, TASK.prompt)
    special = set(tok.all_special_ids)
    merged = 0
    for t in group.trajectories:
        assert t.status == "ok" and t.finish_reason == "answered" and t.prompt_ids == first_prompt and len(t.turn_spans) == 2
        (a0, b0), (a1, b1) = t.turn_spans
        if special & set(t.completion_ids[a0:b0]):  # the agent's text lost a sampled special token: its prompt does not extend
            assert t.turn_prompts[1] is not None and t.metrics["prefix_breaks"] == 1
            continue
        merged += 1
        assert t.turn_prompts is None and t.metrics["prefix_breaks"] == 0  # one sequence
        # turn 2 was sampled from exactly prompt + turn-1 tokens + the masked insert
        assert tuple(t.prompt_ids + t.completion_ids[:a1]) in by_prompt
        assert t.loss_mask[b0:a1] == [0] * (a1 - b0) and decode_exact(tok, t.completion_ids[b0:a1]) == " 5"
    assert merged >= 2
    # every sampled token and log-prob is the engine's, token for token
    got = sorted((tuple(t.completion_ids[a:b]), tuple(t.logprobs[a:b])) for t in group.trajectories for a, b in t.turn_spans)
    want = sorted((tuple(c.token_ids), tuple(c.logprobs)) for _, c in engine.seen)
    assert got == want
    # the reward is the rubric's on the agent's answer
    assert all(t.reward == pytest.approx(t.reward_parts["qa_f1"]) for t in group.trajectories)


def test_an_agent_that_rewrites_its_history_trains_one_sample_per_call(local, tiny_tokenizer):
    def rewriter(task, base_url, api_key):
        c = client(base_url, api_key)
        a = c.chat.completions.create(model="p", messages=task["messages"], max_tokens=4).choices[0].message.content
        edited = task["messages"] + [{"role": "assistant", "content": "[summary] " + a[:2]}, {"role": "user", "content": "go on"}]
        return c.chat.completions.create(model="p", messages=edited, max_tokens=4).choices[0].message.content

    engine = RecordingEngine(local)
    (t,) = run(workflow(tiny_tokenizer, rewriter), engine).trajectories
    assert t.status == "ok" and t.turn_prompts is not None and t.metrics["prefix_breaks"] == 1
    steps = t.steps()
    assert [s.prompt_ids for s in steps] == [p for p, _ in engine.seen]
    assert [s.completion_ids for s in steps] == [list(c.token_ids) for _, c in engine.seen]
    assert all(sum(s.loss_mask) == len(s.completion_ids) for s in steps)


def test_tool_calls_come_back_in_openai_format_and_results_are_masked(tiny_tokenizer):
    tok = tiny_tokenizer
    call = '<tool_call>{"name": "search", "arguments": {"query": "Paris"}}</tool_call>'
    engine = ScriptedEngine(tok, ["let me look " + call, "<answer>Paris</answer>"])
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]
    seen = {}

    def agent(task, base_url, api_key):
        c = client(base_url, api_key)
        messages = list(task["messages"])
        r = c.chat.completions.create(model="p", messages=messages, tools=tools)
        m = r.choices[0].message
        seen["finish"], seen["content"] = r.choices[0].finish_reason, m.content
        seen["calls"] = [(tc.function.name, tc.function.arguments) for tc in m.tool_calls]
        messages += [{"role": "assistant", "content": decode_exact(tok, engine.seen[0][1])},
                     {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "Paris is in France."}]
        return c.chat.completions.create(model="p", messages=messages, tools=tools).choices[0].message.content

    (t,) = run(workflow(tok, agent, SamplingParams(max_new_tokens=200), max_tokens=400), engine, task=Task("q", [{"role": "user", "content": "where?"}], "Paris")).trajectories
    assert seen == {"finish": "tool_calls", "content": "let me look", "calls": [("search", '{"query": "Paris"}')]}
    assert t.status == "ok" and t.reward == 1.0 and t.turn_prompts is None  # the tool turn extends the first call
    (a0, b0), (a1, _) = t.turn_spans
    assert "Paris is in France." in decode_exact(tok, t.completion_ids[b0:a1]) and t.loss_mask[b0:a1] == [0] * (a1 - b0)


def test_budgets_end_the_episode_and_it_is_still_learned_from(local, tiny_tokenizer):
    def greedy_caller(task, base_url, api_key):  # calls until refused; the refusal is a 400 (not retried by the client)
        c = client(base_url, api_key)
        messages = list(task["messages"])
        while True:
            text = c.chat.completions.create(model="p", messages=messages, max_tokens=4).choices[0].message.content
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]

    (t,) = run(workflow(tiny_tokenizer, greedy_caller, max_calls=3), RecordingEngine(local)).trajectories
    assert (t.status, t.finish_reason, t.metrics["turns"], t.metrics["agent_budget_hits"]) == ("ok", "max_calls", 3.0, 1.0)
    (t,) = run(workflow(tiny_tokenizer, greedy_caller, max_calls=50, max_tokens=10), RecordingEngine(local)).trajectories
    assert t.status == "ok" and t.finish_reason == "length" and t.metrics["sampled_tokens"] <= 10


def test_failing_slow_or_idle_agents_are_left_out_and_counted(local, tiny_tokenizer, caplog):
    def raises(task, base_url, api_key):
        client(base_url, api_key).chat.completions.create(model="p", messages=task["messages"], max_tokens=2)
        raise KeyError("the agent's own bug")

    def sleeps(task, base_url, api_key):
        time.sleep(3)

    async def idle(task, base_url, api_key):
        return "3 7 1"

    (t,) = run(workflow(tiny_tokenizer, raises), local).trajectories
    assert (t.status, t.metrics["agent_errors"]) == ("agent_error", 1.0)
    assert "KeyError" in caplog.text
    (t,) = run(workflow(tiny_tokenizer, sleeps, timeout_s=0.5), local).trajectories
    assert (t.status, t.metrics["agent_timeouts"]) == ("agent_error", 1.0)
    (t,) = run(workflow(tiny_tokenizer, idle), local).trajectories  # no model call: nothing to train
    assert t.status == "agent_error" and t.completion_ids == []


def test_streaming_clients_get_the_answer_as_one_chunk(local, tiny_tokenizer):
    """Frameworks that always stream (stream=true) work: the finished answer arrives as server-sent events."""
    seen = {}

    def agent(task, base_url, api_key):
        c = client(base_url, api_key)
        chunks = list(c.chat.completions.create(model="p", messages=task["messages"], max_tokens=4, stream=True,
                                                stream_options={"include_usage": True}))
        seen["content"] = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        seen["finish"] = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
        seen["usage"] = chunks[-1].usage.completion_tokens
        text = "".join(ch.choices[0].text for ch in c.completions.create(model="p", prompt="copy: 1", max_tokens=3, stream=True))
        return seen["content"] + text

    engine = RecordingEngine(local)
    (t,) = run(workflow(tiny_tokenizer, agent), engine).trajectories
    (_, first), (_, second) = engine.seen
    assert t.status == "ok" and seen["usage"] == len(first.token_ids) and seen["finish"] == first.finish_reason
    assert seen["content"] == tiny_tokenizer.decode(first.token_ids, skip_special_tokens=True)
    assert t.text == seen["content"] + tiny_tokenizer.decode(second.token_ids, skip_special_tokens=True)


def test_async_agents_and_returned_rewards(local, tiny_tokenizer):
    async def agent(task, base_url, api_key):
        c = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
        r = await c.completions.create(model="p", prompt="copy: 1", max_tokens=3, logprobs=1)
        await c.close()
        assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
        return {"reward": 0.25}

    group = run(workflow(tiny_tokenizer, agent), RecordingEngine(local), n=3)
    assert [t.reward for t in group.trajectories] == [0.25] * 3
    assert all(t.reward_parts == {"agent": 0.25} and t.status == "ok" for t in group.trajectories)


def test_episodes_are_isolated_and_requests_bounded(local, tiny_tokenizer):
    urls = {}

    def agent(task, base_url, api_key):
        urls[base_url] = api_key
        other = [u for u in urls if u != base_url]
        ok = httpx.post(f"{base_url}/chat/completions", json={"messages": task["messages"], "max_tokens": 2},
                        headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
        assert ok.status_code == 200, ok.text
        wrong = httpx.post(f"{base_url}/chat/completions", json={"messages": task["messages"]}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        unknown = httpx.post(base_url.replace("/episodes/", "/episodes/x") + "/chat/completions", json={"messages": task["messages"]},
                             headers={"Authorization": f"Bearer {api_key}"})
        assert unknown.status_code == 404
        big = httpx.post(f"{base_url}/chat/completions", content=b"x" * 9_000_000, headers={"Authorization": f"Bearer {api_key}"})
        assert big.status_code == 413
        two = httpx.post(f"{base_url}/chat/completions", json={"messages": task["messages"], "n": 2},
                         headers={"Authorization": f"Bearer {api_key}"})
        assert two.status_code == 400 and "n must be 1" in two.json()["error"]["message"]
        return other

    wf = workflow(tiny_tokenizer, agent)
    group = asyncio.run(wf.run(TASK, RecordingEngine(local), 4))
    port = wf.endpoint.port
    assert len(urls) == 4 and len(set(urls.values())) == 4  # one base URL and key per episode
    assert all(t.status == "ok" and t.metrics["turns"] == 1 for t in group.trajectories)
    wf.close()
    with pytest.raises(OSError):  # the endpoint is gone with the workflow
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


AGENT_RUN = ["model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy", "data.eval=tiny:copy:test",
             "data.max_eval=8", "rollout.group_size=4", "rollout.batch_size=16", "rollout.max_new_tokens=6", "rollout.max_prompt_tokens=32",
             "reward.functions=[qa_f1]", "train.steps=3", "log.progress=false", "rollout.agent=examples.openai_agent.agent:run",
             "rollout.agent_max_calls=2", "rollout.agent_max_tokens=6"]


@pytest.mark.parametrize("mode", ["sync", "async", "remote"])
def test_seekrl_train_runs_the_agent_sync_async_and_on_a_server(tmp_path, mode):
    """`seekrl train` with rollout.agent: every episode's one call is trained; async mode keeps its
    staleness bound; on a started engine server (`seekrl serve engine`, stopped by the run) as in-process."""
    from seekrl.config import load_config
    from seekrl.jobs import train
    from seekrl.observe.loggers import read_metrics
    from seekrl.observe.metrics import undocumented

    how = ["engine.servers=1"] if mode == "remote" else [f"rollout.mode={mode}", "rollout.max_staleness=1"]
    run = train(load_config(None, [*AGENT_RUN, *how, f"log.dir={tmp_path}", f"log.name={mode}"]))
    rows = [r for r in read_metrics(run) if "reward/mean" in r]
    assert len(rows) == 3
    for r in rows:
        assert r["rollout/turns"] == 1.0 and r["rollout/excluded_frac"] == 0.0 and r["rollout/excluded/agent_error"] == 0.0
        assert 0 < r["rollout/sampled_tokens"] <= 6 and r["rollout/staleness/max"] <= (1 if mode == "async" else 0)
        if mode == "remote":  # every call went to the server
            assert r["engine/requests"] >= 16.0
    assert undocumented(rows[-1]) == []
    assert "examples.openai_agent.agent:run" in (run / "config.yaml").read_text()
