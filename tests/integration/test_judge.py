"""The judge reward against real servers on 127.0.0.1.

- `seekrl serve policy` over a tiny random model, started as its own process: the wire protocol
  end to end (bearer token, greedy replies, the cache), whatever the random model writes.
- A scripted OpenAI-compatible judge (FastAPI in a thread, tests/live_server.py) that answers by
  rules, counts requests and in-flight requests, and fails on demand: score parsing, weighted
  rubric means, the cache, retries with backoff (503, 429 + Retry-After), the concurrency limit,
  a stopped or slow judge (status reward_unavailable), the token, and a training run whose judge
  goes away.

Every server is stopped when its test (or module) ends, also on failure; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import stop_process

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from live_server import LiveServer, free_port  # noqa: E402

from seekrl.config import load_config  # noqa: E402
from seekrl.errors import EngineRequestError, RewardUnavailable  # noqa: E402
from seekrl.evaluate import evaluate  # noqa: E402
from seekrl.observe.metrics import undocumented  # noqa: E402
from seekrl.observe.stats import StatsTracker  # noqa: E402
from seekrl.rewards.judge import make_judge_reward, make_parser  # noqa: E402
from seekrl.rewards.rubric import Rubric, build_rubric  # noqa: E402
from seekrl.types import Completion, SamplingParams, Task  # noqa: E402

TOKEN = "judge-secret"
ROOT = Path(__file__).resolve().parents[2]


class ScriptedJudge:
    """An OpenAI-compatible chat endpoint that answers `rule(prompt)`; `fail` holds the status codes
    of the next requests (popped one per request), `delay_s` holds each request that long."""

    def __init__(self, token: str | None = TOKEN):
        self.token = token
        self.reset()

    def reset(self) -> None:
        self.requests, self.in_flight, self.max_in_flight = 0, 0, 0
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.fail: list[int] = []
        self.retry_after: str | None = None
        self.delay_s = 0.0
        self.rule = self.score_by_criterion

    @staticmethod
    def score_by_criterion(prompt: str) -> str:
        """Rubric prompts: the digit after 'worth ' in the criterion; others: 10 when the response is Paris."""
        m = re.search(r"Criterion:\n.*worth (\d+)", prompt)
        if m:
            return f"The response meets it partly.\nScore: {m.group(1)}"
        response = prompt.split("Response:\n", 1)[-1].split("\n", 1)[0].strip()
        return "<think>Compare with the reference: 3 aliases.</think>\nScore: " + ("10" if response == "Paris" else "0")

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            self.requests += 1
            self.headers.append(dict(request.headers))
            if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"error": {"message": "missing or wrong bearer token"}}, status_code=401)
            body = await request.json()
            self.bodies.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay_s)
                if self.fail:
                    code = self.fail.pop(0)
                    headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                    return JSONResponse({"error": {"message": f"scripted {code}"}}, status_code=code, headers=headers)
                content = self.rule(body["messages"][-1]["content"])
                return {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
            finally:
                self.in_flight -= 1

        return app


@pytest.fixture(scope="module")
def scripted():
    """(judge, base URL) of one scripted judge for the module; each test starts from a reset."""
    judge = ScriptedJudge()
    with LiveServer(judge.app()) as url:
        yield judge, url + "/v1"


@pytest.fixture
def judge_server(scripted):
    judge, url = scripted
    judge.reset()
    yield judge, url
    judge.reset()


def task(tid="t1", answer=("Paris",), **meta) -> Task:
    return Task(id=tid, prompt=[{"role": "user", "content": "What is the capital of France?"}], answer=list(answer), source="test", meta=meta)


def make(url, tmp_path, **kw):
    kw = {"token": TOKEN, "cache": tmp_path / "cache", "retries": 2, "backoff_s": 0.01, "timeout_s": 10.0, **kw}
    return make_judge_reward(url, "scripted-judge", **kw)


def run(coro):
    return asyncio.run(coro)


# ---- scripted judge: scores, rubrics, the request ---------------------------------------------
def test_the_judge_scores_by_the_template_and_sends_an_openai_request(judge_server, tmp_path):
    server, url = judge_server
    judge = make(url, tmp_path, max_tokens=64)
    right = run(judge("<think>It is Paris.</think><answer>Paris</answer>", task()))
    wrong = run(judge("<answer>Lyon</answer>", task()))
    assert (right.total, right.parts) == (1.0, {}) and (wrong.total, wrong.parts) == (0.0, {})
    body = server.bodies[0]
    assert body["model"] == "scripted-judge" and body["temperature"] == 0.0 and body["max_tokens"] == 64
    (message,) = body["messages"]
    assert message["role"] == "user" and "What is the capital of France?" in message["content"]
    assert "Reference answer" in message["content"] and "\nParis\n" in message["content"] and "<think>" not in message["content"]
    assert server.headers[0]["authorization"] == f"Bearer {TOKEN}" and server.requests == 2
    judge.client.close()


def test_rubric_items_are_scored_one_by_one_and_averaged_by_weight(judge_server, tmp_path):
    server, url = judge_server
    rubrics = [{"text": "Names the city (worth 10)", "weight": 2}, {"description": "Gives the population, worth 0"},
               {"title": "Style", "text": "Is concise, worth 5", "weight": 1}]
    judge = make(url, tmp_path)
    r = run(judge("<answer>Paris</answer>", task(rubrics=rubrics)))
    assert r.total == pytest.approx((2 * 1.0 + 1 * 0.0 + 1 * 0.5) / 4)
    assert r.parts == {"rubric_items": 3.0, "item_0": 1.0, "item_1": 0.0, "item_2": 0.5}
    criteria = sorted(b["messages"][0]["content"].split("Criterion:\n")[1].split("\n")[0] for b in server.bodies)
    assert criteria == ["Gives the population, worth 0", "Names the city (worth 10)", "Style: Is concise, worth 5"]
    # through the Rubric, next to another reward: parts logged as judge/item_<k>
    rubric = Rubric([judge, "qa_em"], [1.0, 0.5])
    r = run(rubric.score("<answer>Paris</answer>", task(rubrics=rubrics)))
    assert r.unavailable is None and r.total == pytest.approx(0.625 + 0.5)
    assert r.parts == {"judge": 0.625, "judge/rubric_items": 3.0, "judge/item_0": 1.0, "judge/item_1": 0.0, "judge/item_2": 0.5,
                       "qa_em": 1.0}
    judge.client.close()


def test_a_custom_template_parser_and_range(judge_server, tmp_path):
    server, url = judge_server
    server.rule = lambda prompt: 'Reasoning first. {"score": 4}' if "[Paris]" in prompt else '{"score": 1}'
    judge = make(url, tmp_path, template="Q: {question} | gold: {gold} | got: [{response}] | kind: {kind}", parser="json",
                 score_range=(1, 5))
    assert run(judge("<answer>Paris</answer>", task(kind="1hop"))).total == pytest.approx(0.75)
    assert server.bodies[0]["messages"][0]["content"] == "Q: What is the capital of France? | gold: Paris | got: [Paris] | kind: 1hop"
    assert run(judge("<answer>Rome</answer>", task(kind="1hop"))).total == 0.0
    judge.client.close()


# ---- the cache -------------------------------------------------------------------------------
def test_a_rerun_asks_the_judge_nothing_it_answered_before(judge_server, tmp_path):
    server, url = judge_server
    rubrics = [{"text": "A, worth 10"}, {"text": "B, worth 2"}]
    tasks = [task("t1"), task("t2", rubrics=rubrics)]
    completions = ["<answer>Paris</answer>", "<answer>Lyon</answer>"]

    def score_all(judge):
        rubric = Rubric([judge])
        return run(rubric.score_many([(c, t) for t in tasks for c in completions]))

    first = make(url, tmp_path)
    a = score_all(first)
    assert server.requests == 2 + 2 * 2 and first.client.stats["cache_hits"] == 0
    first.client.close()
    second = make(url, tmp_path)  # a rerun: a new process would open the same file
    b = score_all(second)
    assert server.requests == 6 and second.client.stats["cache_hits"] == 6 and second.client.stats["requests"] == 0
    assert [(r.total, r.parts) for r in a] == [(r.total, r.parts) for r in b]
    # a new score range re-reads the stored replies: no request either
    rescaled = make(url, tmp_path, score_range=(0, 20))
    assert run(rescaled("<answer>Paris</answer>", tasks[0])).total == 0.5 and server.requests == 6
    # another model name, or the cache off, asks again
    other = make_judge_reward(url, "another-judge", token=TOKEN, cache=tmp_path / "cache")
    run(other("<answer>Paris</answer>", tasks[0]))
    off = make(url, tmp_path, cache=None)
    run(off("<answer>Paris</answer>", tasks[0]))
    assert server.requests == 8
    for j in (second, rescaled, other, off):
        j.client.close()


def test_one_question_in_flight_is_asked_once(judge_server, tmp_path):
    server, url = judge_server
    server.delay_s = 0.2
    judge = make(url, tmp_path, cache=None)

    async def many():
        return await asyncio.gather(*(judge("<answer>Paris</answer>", task()) for _ in range(8)))

    assert [r.total for r in run(many())] == [1.0] * 8 and server.requests == 1
    judge.client.close()


# ---- retries, backoff, concurrency -----------------------------------------------------------
def test_5xx_is_retried_with_exponential_backoff(judge_server, tmp_path):
    server, url = judge_server
    server.fail = [503, 500]
    judge = make(url, tmp_path, retries=2, backoff_s=0.2)
    t0 = time.monotonic()
    assert run(judge("<answer>Paris</answer>", task())).total == 1.0
    assert time.monotonic() - t0 >= 0.2 + 0.4  # waited 0.2 s, then 0.4 s
    assert server.requests == 3 and judge.client.stats["retries"] == 2
    judge.client.close()


def test_429_waits_at_least_its_retry_after(judge_server, tmp_path):
    server, url = judge_server
    server.fail, server.retry_after = [429], "1"
    judge = make(url, tmp_path, backoff_s=0.01)
    t0 = time.monotonic()
    assert run(judge("<answer>Paris</answer>", task())).total == 1.0
    assert time.monotonic() - t0 >= 1.0 and server.requests == 2
    judge.client.close()


def test_unreadable_replies_are_retried_then_unavailable(judge_server, tmp_path):
    server, url = judge_server
    server.rule = lambda prompt: "I would rather not say."
    judge = make(url, tmp_path, retries=2)
    with pytest.raises(RewardUnavailable, match=r"could not score: 3 attempts; last: unreadable score: no number in 'I would rather"):
        run(judge("<answer>Paris</answer>", task()))
    assert server.requests == 3
    # an answer that becomes readable on a retry is taken
    replies = iter(["hmm", "Score: 9"])
    server.rule = lambda prompt: next(replies)
    assert run(judge("<answer>Rome</answer>", task())).total == pytest.approx(0.9)
    judge.client.close()


def test_the_concurrency_limit_holds(judge_server, tmp_path):
    server, url = judge_server
    server.delay_s = 0.15
    rubrics = [{"text": f"criterion {k}, worth {k % 10}"} for k in range(12)]
    judge = make(url, tmp_path, concurrency=3, cache=None)
    r = run(judge("<answer>Paris</answer>", task(rubrics=rubrics)))
    assert r.parts["rubric_items"] == 12 and server.requests == 12
    assert server.max_in_flight == 3 and judge.client.stats["in_flight_max"] == 3
    judge.client.close()


# ---- a judge that cannot answer --------------------------------------------------------------
def test_a_stopped_or_slow_judge_is_unavailable_never_zero(tmp_path):
    server = ScriptedJudge()
    live = LiveServer(server.app()).start()
    try:
        url = live.url + "/v1"
        judge = make(url, tmp_path, retries=1, backoff_s=0.01, timeout_s=0.5)
        rubric = Rubric([judge, "qa_em"])
        assert run(rubric.score("<answer>Paris</answer>", task())).total == 2.0
        server.delay_s = 1.5  # slower than timeout_s
        r = run(rubric.score("<answer>Paris.</answer>", task()))
        assert r.unavailable.startswith("judge: the judge at ") and "ReadTimeout" in r.unavailable
        assert r.total == 0.0 and r.parts == {"qa_em": 1.0} and server.requests == 3
        server.delay_s = 0.0
    finally:
        live.stop()
    r = run(rubric.score("<answer>Lyon</answer>", task()))  # nothing listens any more
    assert "ConnectError" in r.unavailable and r.total == 0.0
    # a judged answer comes from the cache even now
    assert run(rubric.score("<answer>Paris</answer>", task())).total == 2.0
    judge.client.close()


def test_a_400_concerns_that_request_alone(judge_server, tmp_path):
    server, url = judge_server
    server.fail = [400]
    judge = make(url, tmp_path, retries=3)
    with pytest.raises(RewardUnavailable, match="HTTP 400"):
        run(judge("<answer>Paris</answer>", task()))
    assert server.requests == 1  # not retried
    judge.client.close()


def test_a_wrong_token_stops_the_run_in_one_line(judge_server, tmp_path):
    server, url = judge_server
    judge = make(url, tmp_path, token="not-it")
    with pytest.raises(EngineRequestError, match=r"refused the request: HTTP 401: .*set reward.judge_token_env") as e:
        run(Rubric([judge]).score("<answer>Paris</answer>", task()))
    assert "\n" not in str(e.value) and server.requests == 1
    judge.client.close()


# ---- workflows, training and evaluation ------------------------------------------------------
def test_workflows_mark_trajectories_the_judge_could_not_score(tiny_tokenizer, tiny_model, tmp_path):
    from seekrl.engines.local import LocalEngine
    from seekrl.tools import ToolExecutor, ToolRegistry, get_format, tool
    from seekrl.train.rl import usable
    from seekrl.workflows.single_turn import SingleTurnWorkflow
    from seekrl.workflows.tool_agent import ToolAgentWorkflow

    server = ScriptedJudge()
    live = LiveServer(server.app()).start()
    try:
        judge = make(live.url + "/v1", tmp_path, retries=0, cache=None)
        rubric = Rubric([judge])
        engine = LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=8)
        single = SingleTurnWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=6, seed=1), rubric)
        g = run(single.run(task(), engine, 4))
        assert [t.status for t in g.trajectories] == ["ok"] * 4 and server.requests >= 1

        class Answers:  # an engine whose every turn is the answer
            async def generate(self, prompt_ids, params):
                ids = tiny_tokenizer.encode("<answer> Paris </answer>", add_special_tokens=False)
                return Completion(ids, [-0.5] * len(ids), "stop", 0)

        @tool(retries=0)
        async def search(query: str) -> str:
            """Search."""
            return "Paris."

        agent = ToolAgentWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=16), rubric, get_format("search_r1"),
                                  ToolExecutor(ToolRegistry([search])))
        g = run(agent.run(task(), Answers(), 2))
        assert [(t.status, t.reward) for t in g.trajectories] == [("ok", 1.0)] * 2
    finally:
        live.stop()
    g = run(single.run(task(), engine, 4))
    assert [t.status for t in g.trajectories] == ["reward_unavailable"] * 4 and all(t.reward == 0.0 for t in g.trajectories)
    stats = StatsTracker()
    kept, _ = usable(g.trajectories, [0] * 4, stats)
    assert kept == [] and stats.export()["rollout/excluded/reward_unavailable"] == 4
    g = run(agent.run(task(), Answers(), 2))
    assert [t.status for t in g.trajectories] == ["reward_unavailable"] * 2
    # evaluation: counted, not scored
    metrics, groups = run(evaluate(single, engine, [task("a"), task("b")], 2, SamplingParams(max_new_tokens=4), "judge"))
    assert metrics == {"eval/excluded/reward_unavailable": 4.0, "eval/excluded_frac": 1.0}
    judge.client.close()


def test_a_training_run_with_a_judge_and_without_it(tmp_path):
    """`seekrl train` with reward.functions=[judge]: the judge's reward is learned from; once the
    judge is gone every trajectory is left out and counted, and the run still ends normally."""
    from seekrl.jobs import train
    from seekrl.observe.loggers import read_metrics

    server = ScriptedJudge(token=None)
    server.rule = lambda prompt: f"Score: {len(prompt.split('Response:')[1].split('Does the')[0].strip()) % 11}"
    live = LiveServer(server.app()).start()

    def cfg(name, *extra):
        return load_config(None, [
            "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy", "data.eval=tiny:copy:test",
            "data.max_eval=4", "rollout.group_size=4", "rollout.batch_size=8", "rollout.max_new_tokens=6",
            "rollout.max_prompt_tokens=32", "reward.functions=[judge]", f"reward.judge_url={live.url}/v1", "reward.judge_retries=0",
            f"reward.judge_cache={tmp_path / 'cache'}", "train.steps=2", f"log.dir={tmp_path}", f"log.name={name}",
            "log.progress=false", "log.tensorboard=false", "log.samples_every=1", *extra])

    try:
        rows = read_metrics(train(cfg("with_judge")))
    finally:
        live.stop()
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and all(r["rollout/excluded/reward_unavailable"] == 0 and "reward/judge" in r for r in steps)
    assert len({r["reward/judge"] for r in steps} | {r["reward/std"] for r in steps}) > 1  # the scripted scores vary
    assert rows[0]["eval/excluded_frac"] == 0.0 and "eval/judge" in rows[0]
    assert not undocumented({k for r in rows for k in r})
    run_dir = train(cfg("without_judge", "reward.judge_cache=false"))
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r["step"] > 0]
    assert all(r["rollout/excluded/reward_unavailable"] == 8 and r["rollout/excluded_frac"] == 1.0 for r in steps)
    assert all("reward/mean" not in r for r in steps)  # nothing scored, nothing learned from
    assert rows[0]["eval/excluded/reward_unavailable"] == 4 and rows[0]["eval/excluded_frac"] == 1.0
    records = [json.loads(line) for line in (run_dir / "trajectories" / "step_1.jsonl").read_text().splitlines()]
    assert {r["status"] for r in records} == {"reward_unavailable"}
    assert not undocumented({k for r in rows for k in r})


# ---- seekrl serve policy as the judge --------------------------------------------------------
@pytest.fixture(scope="module")
def policy_judge(tmp_path_factory):
    """Base URL (…/v1) of `seekrl serve policy` over a tiny random model, run as its own process
    with a bearer token; terminated (then killed) when the module ends, also on failure."""
    import torch

    from seekrl.models import make_tiny_model, save_tiny, train_tiny_tokenizer

    folder = tmp_path_factory.mktemp("policy_judge") / "model"
    tok = train_tiny_tokenizer([string.printable, "Question: What is the capital of France? Response: Paris Score: 7"], vocab_size=128)
    model = make_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, seed=3)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # large weights: greedy replies are text (with seed 3, one that ends in a digit), not an instant EOS
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.25, generator=gen)
    save_tiny(model, tok, folder)
    port = free_port()
    log = open(folder.parent / "server.log", "w")
    env = {**os.environ, "SEEKRL_POLICY_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "seekrl", "serve", "policy", "--model", str(folder), "--port", str(port),
                             "--model-name", "tiny-judge", "--max-tokens-cap", "64"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"seekrl serve policy exited ({proc.returncode}): {(folder.parent / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("seekrl serve policy did not answer /health within 180 s")
            time.sleep(0.25)
        yield url + "/v1"
    finally:
        stop_process(proc, timeout=20)
        log.close()


def _generations(url: str) -> int:
    r = httpx.get(url.removesuffix("/v1") + "/server_info", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    return r.json()["stats"]["generations"]


def test_seekrl_serve_policy_as_the_judge(policy_judge, tmp_path, monkeypatch):
    url = policy_judge
    template = "Question: {question} Response: {response} Score:"
    # what the server replies (greedy: the same every time), asked directly
    prompt = "Question: What is the capital of France? Response: Paris Score:"
    r = httpx.post(url + "/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                   json={"model": "tiny-judge", "messages": [{"role": "user", "content": prompt}], "temperature": 0.0, "max_tokens": 8})
    assert r.status_code == 200, r.text
    reply = r.json()["choices"][0]["message"]["content"]
    assert reply.strip(), "the tiny judge should write something"
    monkeypatch.setenv("SEEKRL_TEST_JUDGE_TOKEN", TOKEN)
    base = ["reward.functions=[judge]", f"reward.judge_url={url}", "reward.judge_model=tiny-judge",
            "reward.judge_token_env=SEEKRL_TEST_JUDGE_TOKEN", f"reward.judge_template='{template}'", "reward.judge_max_tokens=8",
            "reward.judge_retries=1", "reward.judge_backoff_s=0.01"]
    c = load_config(None, [*base, f"reward.judge_cache={tmp_path}"])
    c.reward.judge_parser = "match:^" + re.escape(reply[:6])  # the reply's own start: read as 1
    rubric = build_rubric(c.reward, 8)
    before = _generations(url)
    result = run(rubric.score("<answer>Paris</answer>", task()))
    assert result.unavailable is None and result.total == 1.0 and _generations(url) == before + 1
    # a rerun: from the cache, the server is not asked
    again = build_rubric(c.reward, 8)
    assert run(again.score("<answer>Paris</answer>", task())).total == 1.0 and _generations(url) == before + 1
    # a parser that never matches reads 0; last_number reads the reply's last number, or gives up after the retries
    c0 = load_config(None, [*base, "reward.judge_cache=false"])
    c0.reward.judge_parser = "match:(?!)"
    assert run(build_rubric(c0.reward, 8).score("<answer>Paris</answer>", task())).total == 0.0
    c0.reward.judge_parser = "last_number"
    try:  # the same reply went over the wire: the judge reads what the parser reads from the direct answer
        expected = make_parser("last_number", (0, 10))(reply)
    except ValueError:
        expected = None
    out = run(build_rubric(c0.reward, 8).score("<answer>Paris</answer>", task()))
    if expected is not None:
        assert out.unavailable is None and out.total == pytest.approx(expected)
    else:
        assert "unreadable score" in out.unavailable
    assert _generations(url) == before + 1 + 1 + (1 if expected is not None else 2)
    # the token is checked: a wrong one stops the run
    monkeypatch.setenv("SEEKRL_TEST_JUDGE_TOKEN", "wrong")
    c0.reward.judge_parser = "match:x"
    with pytest.raises(EngineRequestError, match="HTTP 401"):
        run(build_rubric(c0.reward, 8).score("<answer>Paris</answer>", task()))
