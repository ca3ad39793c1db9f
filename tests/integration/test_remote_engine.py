"""RemoteEngine against real `seekrl serve engine` apps on 127.0.0.1 (uvicorn in threads).

Equivalence with the in-process engine (same weights, same seeds: the same tokens and log-probs),
episode-sticky least-loaded routing, disk weight sync, and failures: a dead server is routed
around and counted; with none left, one line names it.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from live_server import LiveServer, RawServer

from seekrl.data.tiny import make_tiny_tasks
from seekrl.engines import LocalEngine
from seekrl.engines.remote import RemoteEngine
from seekrl.engines.weights import weight_folders
from seekrl.errors import EngineRequestError, EngineUnavailable
from seekrl.models import make_tiny_model
from seekrl.rewards.rubric import Rubric
from seekrl.rollout import collect
from seekrl.servers.engine import make_app
from seekrl.types import SamplingParams
from seekrl.workflows.single_turn import SingleTurnWorkflow


def run(coro, timeout=120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Servers:
    """n engine-server apps, each on its own copy of `model`, started in threads."""

    def __init__(self, model, tokenizer, n):
        self.engines = [LocalEngine(copy.deepcopy(model), tokenizer) for _ in range(n)]
        self.live = [LiveServer(make_app(e, tokenizer, model_path="test")) for e in self.engines]

    def __enter__(self):
        for s in self.live:
            s.start()
        return self

    def __exit__(self, *exc):
        for s in self.live:
            s.stop()

    @property
    def urls(self):
        return [s.url for s in self.live]


def test_remote_samples_what_the_local_engine_samples(tiny_tokenizer, sharp_tiny):
    model = sharp_tiny(4)
    tasks = make_tiny_tasks("copy", n=6, seed=0)
    workflow = SingleTurnWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=8, temperature=1.0), Rubric(["qa_f1"]))
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1234)
    local = run(collect(workflow, LocalEngine(model, tiny_tokenizer), tasks, 4, params))
    with Servers(model, tiny_tokenizer, 1) as s:
        engine = RemoteEngine(s.urls)
        remote = run(collect(workflow, engine, tasks, 4, params))
        assert engine.counters["requests"] == 24 and engine.counters["http_requests"] <= 2  # batched into one /generate
    pairs = [(a, b) for ga, gb in zip(local, remote) for a, b in zip(ga.trajectories, gb.trajectories)]
    assert len(pairs) == 24
    assert len({tuple(a.completion_ids) for a, _ in pairs}) > 4  # the samples differ from each other
    for a, b in pairs:
        assert a.completion_ids == b.completion_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
        assert a.reward == b.reward and b.versions == [0] * len(b.completion_ids)


def test_routing_is_least_loaded_and_sticky_per_episode(tiny_tokenizer, sharp_tiny):
    model = sharp_tiny(5)
    prompt = tiny_tokenizer.encode("copy: 1 2 3", add_special_tokens=False)
    with Servers(model, tiny_tokenizer, 2) as s:
        engine = RemoteEngine(s.urls)

        async def episode(i):  # three turns in one task, as a multi-turn episode makes them
            seen = []
            for turn in range(3):
                await engine.generate(prompt, SamplingParams(max_new_tokens=3, seed=i * 10 + turn))
                seen.append([e.stats["requests"] for e in s.engines])
            return seen

        async def main():
            return await asyncio.gather(*(episode(i) for i in range(8)))

        run(main())
        per_server = [e.stats["requests"] for e in s.engines]
        assert sum(per_server) == 24 and min(per_server) >= 6  # spread over both
        assert per_server[0] % 3 == 0 and per_server[1] % 3 == 0  # whole episodes: three turns each
        assert [srv.requests for srv in engine.servers] == per_server


def test_disk_weight_sync_loads_new_weights_on_every_server(tiny_tokenizer, sharp_tiny, tmp_path):
    model = sharp_tiny(6)
    trained = sharp_tiny(7)  # stands in for the policy after an update
    prompt = tiny_tokenizer.encode("copy: 4 5", add_special_tokens=False)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
    with Servers(model, tiny_tokenizer, 2) as s:
        engine = RemoteEngine(s.urls, weights_dir=tmp_path / "w", keep_weights=2)
        before = run(engine.generate(prompt, greedy))
        for v in (1, 2, 3):
            run(engine.update_weights(trained, v))
        after = run(engine.generate(prompt, greedy))
        assert engine.version == 3 and after.version == 3
        assert [e.version for e in s.engines] == [3, 3]
        for e in s.engines:
            for k, v in e.model.state_dict().items():
                assert torch.equal(v, trained.state_dict()[k])
        expect = run(LocalEngine(trained, tiny_tokenizer).generate(prompt, greedy))
        assert after.token_ids == expect.token_ids != before.token_ids
        assert [v for v, _ in weight_folders(tmp_path / "w")] == [2, 3]  # keep_weights=2, no temporaries
        assert not list((tmp_path / "w").glob(".v*"))
        assert engine.metrics()["engine/weight_syncs"] == 3.0


def test_a_dead_server_is_routed_around_and_the_last_one_is_named(tiny_tokenizer, sharp_tiny):
    model = sharp_tiny(8)
    prompt = tiny_tokenizer.encode("copy: 9", add_special_tokens=False)
    with Servers(model, tiny_tokenizer, 2) as s:
        engine = RemoteEngine(s.urls, timeout_s=5)

        async def main():
            first = await asyncio.gather(*(engine.generate(prompt, SamplingParams(4, seed=i)) for i in range(6)))
            s.live[0].stop()
            second = await asyncio.gather(*(engine.generate(prompt, SamplingParams(4, seed=i)) for i in range(6)))
            return first, second

        first, second = run(main())
        assert [c.token_ids for c in first] == [c.token_ids for c in second]  # seeded: re-sent requests sample the same
        m = engine.metrics()
        assert m["engine/server_failures"] == 1.0 and m["engine/servers_alive"] == 1.0
        s.live[1].stop()
        with pytest.raises(EngineUnavailable, match="every engine server is unreachable") as err:
            run(engine.generate(prompt, SamplingParams(4, seed=1)))
        assert s.urls[0] in str(err.value) and s.urls[1] in str(err.value) and "\n" not in str(err.value)


def test_a_bad_request_is_not_a_dead_server(tiny_tokenizer, sharp_tiny, tmp_path):
    model = sharp_tiny(9)
    with Servers(model, tiny_tokenizer, 1) as s:
        engine = RemoteEngine(s.urls, weights_dir=tmp_path / "w")
        with pytest.raises(EngineRequestError, match="outside the vocabulary"):
            run(engine.generate([1, 10_000], SamplingParams(4)))
        with pytest.raises(EngineRequestError, match="fills its context of 1024 tokens"):
            run(engine.generate([1] * 1024, SamplingParams(5000)))  # the prompt fills the context
        assert engine.metrics()["engine/server_failures"] == 0.0
        # a folder that does not fit: the server refuses it, and is not trusted afterwards
        other = make_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, num_heads=4, seed=0)
        with pytest.raises(EngineUnavailable, match="weight update failed"):
            run(engine.update_weights(other, 1))
        assert engine.version == 0


class PausedAnswers503:
    """ASGI middleware over an engine-server app that answers /generate with 503 from /pause_generation
    until /continue_generation, as vLLM does while paused with abort or wait; /update_weights_from_disk
    takes `load_s` longer, so requests land in the pause. `always` answers every /generate 503."""

    def __init__(self, app, load_s: float = 0.6):
        self.app, self.load_s = app, load_s
        self.paused = self.always = False
        self.answered_503 = 0

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path == "/generate" and (self.paused or self.always):
            self.answered_503 += 1
            body = b'{"detail": "paused"}'
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if path == "/pause_generation":
            self.paused = True
        elif path == "/update_weights_from_disk":
            await asyncio.sleep(self.load_s)
        await self.app(scope, receive, send)
        if path == "/continue_generation":
            self.paused = False


def test_a_503_while_paused_for_a_sync_is_retried_not_a_dead_server(tiny_tokenizer, sharp_tiny, tmp_path):
    model = sharp_tiny(10)
    trained = sharp_tiny(11)
    prompt = tiny_tokenizer.encode("copy: 3 4", add_special_tokens=False)
    app = PausedAnswers503(make_app(LocalEngine(copy.deepcopy(model), tiny_tokenizer), tiny_tokenizer, model_path="test"))
    with LiveServer(app) as url:
        engine = RemoteEngine([url], weights_dir=tmp_path / "w", timeout_s=30)

        async def main():
            sync = asyncio.create_task(engine.update_weights(trained, 1))
            while not app.paused:
                await asyncio.sleep(0.01)
            during = await asyncio.gather(*(engine.generate(prompt, SamplingParams(4, seed=i)) for i in range(3)))
            await sync
            return during

        during = run(main())
        assert app.answered_503 >= 1 and all(len(c.token_ids) >= 1 for c in during)
        m = engine.metrics()
        assert m["engine/server_failures"] == 0.0 and m["engine/servers_alive"] == 1.0 and m["engine/paused_retries"] >= 1
        assert engine.version == 1 and {c.version for c in during} == {1}  # answered after the continue

        # paused for longer than engine.timeout_s: then it is dead, in one line
        engine = RemoteEngine([url], weights_dir=tmp_path / "w2", timeout_s=0.3)
        app.load_s = 1.5

        async def too_long():
            sync = asyncio.create_task(engine.update_weights(trained, 2))
            while not app.paused:
                await asyncio.sleep(0.01)
            try:
                return await engine.generate(prompt, SamplingParams(4, seed=1))
            finally:
                await asyncio.gather(sync, return_exceptions=True)

        with pytest.raises(EngineUnavailable, match="while paused for longer than engine.timeout_s=0.3 s") as err:
            run(too_long())
        assert "\n" not in str(err.value)

        # a 503 outside any pause is a dead server, as before
        app.always, app.load_s = True, 0.0
        engine = RemoteEngine([url])
        with pytest.raises(EngineUnavailable, match="HTTP 503"):
            run(engine.generate(prompt, SamplingParams(4, seed=1)))
        assert engine.metrics()["engine/paused_retries"] == 0.0


def test_max_new_tokens_is_capped_to_the_context_left(tiny_tokenizer):
    small = make_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, num_heads=4, max_position_embeddings=24, seed=3)
    prompt = tiny_tokenizer.encode("copy: 1 2", add_special_tokens=False)
    with Servers(small, tiny_tokenizer, 1) as s:
        engine = RemoteEngine(s.urls)
        params = SamplingParams(max_new_tokens=100, temperature=1.0, ignore_eos=True)

        async def main():  # one batched /generate: the over-long prompt fails alone, the others are capped
            return await asyncio.gather(engine.generate(prompt, params), engine.generate(prompt, params, rid="b"),
                                        engine.generate([1] * 24, params), return_exceptions=True)

        a, b, full = run(main())
        assert not isinstance(a, BaseException) and not isinstance(b, BaseException), (a, b)
        assert len(a.token_ids) == len(b.token_ids) == 24 - len(prompt) and a.finish_reason == "length"
        assert isinstance(full, EngineRequestError) and "fills its context of 24 tokens" in str(full) and "\n" not in str(full)
        assert engine.metrics()["engine/server_failures"] == 0.0
        short = run(engine.generate(prompt, SamplingParams(max_new_tokens=3, ignore_eos=True)))
        assert len(short.token_ids) == 3  # under the cap: unchanged


def test_an_empty_control_answer_reads_as_json(tiny_tokenizer, sharp_tiny):
    """SGLang answers /abort_request 200 with an empty body: not an unreadable answer."""
    from seekrl.engines.adapters import SGLangAPI

    inner = make_app(LocalEngine(sharp_tiny(12), tiny_tokenizer), tiny_tokenizer, model_path="test")

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/abort_request":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await inner(scope, receive, send)

    with LiveServer(app) as url:
        engine = RemoteEngine([url])

        async def main():
            engine._ensure_loop()
            for call in SGLangAPI().abort(None) + SGLangAPI().abort("r-1"):
                assert call.json  # always a JSON body
                assert await engine._request(engine.servers[0], call) == {}

        run(main())
        assert engine.metrics()["engine/server_failures"] == 0.0


@pytest.mark.parametrize("drops", [1, 2, 3])
def test_a_dropped_connection_is_sent_again_not_a_dead_server(drops):
    """A connection closed with no answer (a keep-alive connection the server had just closed) is
    retried on the same server, twice at most; a third drop is a dead server, named."""
    from seekrl.engines.adapters import HTTPCall
    from seekrl.engines.remote import _ServerFailed

    server = RawServer(drops=drops)
    try:
        engine = RemoteEngine([server.url], timeout_s=10)

        async def main():
            engine._ensure_loop()
            return await engine._request(engine.servers[0], HTTPCall("POST", "/generate", {"text": "x"}))

        if drops <= 2:
            assert run(main(), timeout=60) == {"ok": True}
            assert engine.counters["dropped_retries"] == drops and engine.servers[0].alive
            assert engine.metrics()["engine/server_failures"] == 0.0
        else:
            with pytest.raises(_ServerFailed):
                run(main(), timeout=60)
            assert engine.counters["dropped_retries"] == 2 and not engine.servers[0].alive
            assert "RemoteProtocolError" in engine.servers[0].why or "ReadError" in engine.servers[0].why
        assert server.seen == min(drops + 1, 3)
    finally:
        server.close()
