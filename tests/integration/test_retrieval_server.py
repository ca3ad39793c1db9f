"""The retrieval server on 127.0.0.1: Search-R1's /retrieve API, auth, limits, and HTTPRetriever.

A real uvicorn server runs in a thread on a free loopback port over a small BM25 index.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


from live_server import LiveServer, RawServer, free_port  # noqa: E402

from seekrl.data.corpus import Document  # noqa: E402
from seekrl.retrieval.bm25 import BM25Index  # noqa: E402
from seekrl.retrieval.retriever import HTTPRetriever, LocalRetriever, RetrieverError  # noqa: E402
from seekrl.servers.retrieval import make_app  # noqa: E402

TOKEN = "s3cret-token"
DOCS = [
    Document.from_title_text(str(i), t, x)
    for i, (t, x) in enumerate(
        [
            ("Paris", "Paris is the capital and most populous city of France."),
            ("Berlin", "Berlin is the capital and largest city of Germany."),
            ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level."),
            ("Python (programming language)", "Python is a programming language created by Guido van Rossum."),
            ("Amazon River", "The Amazon River in South America is the largest river by discharge."),
            ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
        ]
    )
]
QUERIES = ["capital of France", "longest river in Africa", "who created Python"]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build(DOCS)


@pytest.fixture(scope="module")
def server(index):
    """Base URL of a live server with a token, a 2,000-byte body limit and max_topk=5."""
    with LiveServer(make_app(index, token=TOKEN, max_topk=5, max_body_bytes=2_000, max_queries=8)) as url:
        yield url


@pytest.fixture(scope="module")
def open_server(index):
    """Base URL of a live server without a token (as Search-R1's own server runs)."""
    with LiveServer(make_app(index)) as url:
        yield url


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_health_and_server_info(server):
    r = httpx.get(server + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert httpx.get(server + "/server_info").status_code == 401
    info = httpx.get(server + "/server_info", headers=AUTH).json()
    assert info["documents"] == len(DOCS) and info["limits"]["max_topk"] == 5 and "requests" in info["stats"]


def test_retrieve_with_scores_matches_search_r1_shape(server, index):
    r = httpx.post(server + "/retrieve", json={"queries": QUERIES, "topk": 2, "return_scores": True}, headers=AUTH)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert set(r.json()) == {"result"} and len(result) == len(QUERIES)
    expected = index.search(QUERIES, topk=2)
    for hits, want in zip(result, expected):
        assert len(hits) == len(want)
        for hit, (doc, score) in zip(hits, want):
            assert set(hit) == {"document", "score"}
            assert hit["document"] == {"id": doc.id, "contents": doc.contents}
            assert hit["score"] == pytest.approx(score)
    assert result[0][0]["document"]["contents"].startswith('"Paris"\n')


def test_retrieve_without_scores(server):
    r = httpx.post(server + "/retrieve", json={"queries": QUERIES, "topk": 1, "return_scores": False}, headers=AUTH)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert [[set(d) for d in hits] for hits in result] == [[{"id", "contents"}]] * len(QUERIES)
    assert result[1][0]["contents"].startswith('"Nile"')
    # return_scores defaults to false and topk to 3, as in Search-R1
    r = httpx.post(server + "/retrieve", json={"queries": ["river"]}, headers=AUTH)
    assert r.status_code == 200 and len(r.json()["result"][0]) == 2  # only 2 documents mention rivers
    assert "document" not in r.json()["result"][0][0]


def test_search_r1_client_code(open_server):
    """Search-R1's llm_agent/generation.py: `_batch_search` + `_passages2string`, as written there."""
    try:
        import requests as http
    except ImportError:  # the same call with httpx
        http = httpx

    class Config:
        search_url = open_server + "/retrieve"
        topk = 3

    config = Config()

    def _batch_search(queries):
        payload = {"queries": queries, "topk": config.topk, "return_scores": True}
        return http.post(config.search_url, json=payload).json()

    def _passages2string(retrieval_result):
        format_reference = ""
        for idx, doc_item in enumerate(retrieval_result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            format_reference += f"Doc {idx+1}(Title: {title}) {text}\n"
        return format_reference

    results = _batch_search(QUERIES)["result"]
    strings = [_passages2string(result) for result in results]
    assert strings[0].startswith('Doc 1(Title: "Paris") Paris is the capital')
    assert strings[2].startswith('Doc 1(Title: "Python (programming language)") Python is')
    # and without scores: the documents themselves
    payload = {"queries": QUERIES, "topk": 3, "return_scores": False}
    docs = http.post(config.search_url, json=payload).json()["result"]
    assert docs[0][0]["contents"].split("\n")[0] == '"Paris"'


def test_auth(server):
    body = {"queries": ["x"], "topk": 1}
    r = httpx.post(server + "/retrieve", json=body)
    assert r.status_code == 401 and "missing bearer token" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(server + "/retrieve", json=body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["detail"] == "invalid bearer token"
    assert httpx.post(server + "/retrieve", json=body, headers=AUTH).status_code == 200


def test_body_limit(server):
    big = {"queries": ["capital " * 300], "topk": 1}
    r = httpx.post(server + "/retrieve", json=big, headers=AUTH)
    assert r.status_code == 413 and "over the limit of 2000 bytes" in r.json()["detail"]

    # no Content-Length (chunked upload): counted while streaming
    def chunks():
        yield b'{"queries": ["'
        for _ in range(30):
            yield b"x" * 100
        yield b'"]}'

    r = httpx.post(server + "/retrieve", content=chunks(), headers=AUTH)
    assert r.status_code == 413


@pytest.mark.parametrize(
    "payload, status, message",
    [
        ({"topk": 3}, 422, "queries: Field required"),
        ({"queries": ["a"], "topk": 0}, 422, "topk: Input should be greater than or equal to 1"),
        ({"queries": ["a", 7], "topk": 1}, 422, "queries.1: Input should be a valid string"),
        ({"queries": "not a list"}, 422, "queries: Input should be a valid list"),
        ([1, 2], 422, "body must be a JSON object"),
        ({"queries": ["a"], "topk": 6}, 400, "topk=6 is over this server's limit of 5"),
        ({"queries": ["a"] * 9}, 400, "9 queries in one request; this server's limit is 8"),
    ],
)
def test_bad_payloads(server, payload, status, message):
    r = httpx.post(server + "/retrieve", json=payload, headers=AUTH)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]


def test_invalid_json(server):
    r = httpx.post(server + "/retrieve", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["detail"]


def test_empty_queries(server):
    r = httpx.post(server + "/retrieve", json={"queries": []}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"result": []}


def test_http_retriever_matches_local(server, index):
    async def run():
        local = await LocalRetriever(index).search(QUERIES, 3)
        async with HTTPRetriever(server + "/retrieve", token=TOKEN) as remote:
            got = await remote.search(QUERIES, 3)
            # concurrent requests share the client
            many = await asyncio.gather(*(remote.search([q], 2) for q in QUERIES * 3))
        async with HTTPRetriever(server, token="wrong") as bad:  # bare base URL gets /retrieve
            with pytest.raises(RetrieverError, match="401"):
                await bad.search(QUERIES, 3)
        return local, got, many

    local, got, many = asyncio.run(run())
    assert [[d for d, _ in h] for h in got] == [[d for d, _ in h] for h in local]
    assert all(abs(a[1] - b[1]) < 1e-4 for g, w in zip(got, local) for a, b in zip(g, w))
    assert [m[0][0][0] for m in many] == [h[0][0] for h in local] * 3


def test_http_retriever_unreachable():
    async def run():
        async with HTTPRetriever(f"http://127.0.0.1:{free_port()}", timeout=2) as r:
            await r.search(["x"], 1)

    with pytest.raises(RetrieverError, match="failed"):
        asyncio.run(run())


ANSWER = b'{"result": [[{"document": {"id": "0", "contents": "\\"Paris\\"\\nParis is in France."}, "score": 2.5}]]}'


@pytest.mark.parametrize("drops", [1, 2, 3])
def test_http_retriever_resends_a_request_whose_connection_broke(drops):
    """A connection closed with no answer (a pooled connection the server had just closed) is
    sent again, twice at most; a third is a failed search, named, as for a dead server."""

    async def run():
        async with HTTPRetriever(server.url, timeout=10) as r:
            try:
                return await r.search(["capital of France"], 1)
            finally:
                stats.update(r.stats)

    stats = {}
    with RawServer(ANSWER, drops=drops) as server:
        if drops <= 2:
            [[(doc, score)]] = asyncio.run(asyncio.wait_for(run(), 60))
            assert doc.title == "Paris" and score == 2.5
        else:
            with pytest.raises(RetrieverError, match="RemoteProtocolError|ReadError"):
                asyncio.run(asyncio.wait_for(run(), 60))
        assert stats["resent"] == min(drops, 2) and server.seen == min(drops + 1, 3)


def test_http_clients_close_idle_connections_before_the_servers_keep_alive():
    """Servers close an idle connection after 5 s (uvicorn, vLLM); seekrl's clients close theirs
    after KEEPALIVE_S, so a request never goes out on a connection the server is closing."""
    from seekrl.httpclient import KEEPALIVE_S

    async def run():
        async with HTTPRetriever(server.url, timeout=10) as r:
            await r.search(["a"], 1)
            await r.search(["b"], 1)  # at once: the same connection
            at_once = server.connections
            await asyncio.sleep(KEEPALIVE_S + 0.5)
            await r.search(["c"], 1)  # idle for longer than KEEPALIVE_S: a new one
            return at_once, server.connections

    assert KEEPALIVE_S < 5
    with RawServer(ANSWER) as server:
        assert asyncio.run(asyncio.wait_for(run(), 60)) == (1, 2)


def test_search_failure_is_a_500_and_counted():
    class Broken:
        async def search(self, queries, topk):
            raise RuntimeError("index on fire")

    with LiveServer(make_app(Broken())) as url:
        r = httpx.post(url + "/retrieve", json={"queries": ["x"]})
        assert r.status_code == 500 and r.json()["detail"] == "retrieval failed: RuntimeError: index on fire"
        info = httpx.get(url + "/server_info").json()
        assert info["stats"]["errors"] == 1 and info["documents"] is None
    with pytest.raises(TypeError, match="needs a Retriever"):
        make_app(object())


def test_resent_searches_reach_the_step_metrics(tiny_tokenizer):
    """A retrieval request sent again after a dropped connection is counted where a run reads it:
    the search tool's counter, through the tool executor and the tool agent, in every step's
    rollout metrics as `tools/search/resent`, and in an eval's metrics as what the eval re-sent
    (`eval/tools/search/resent`)."""
    from seekrl.evaluate import evaluate
    from seekrl.observe.metrics import undocumented
    from seekrl.rewards.rubric import Rubric
    from seekrl.rollout.executor import batch_metrics
    from seekrl.tools import get_format
    from seekrl.tools.config import ToolsConfig
    from seekrl.tools.setup import make_tool_executor
    from seekrl.types import Completion, SamplingParams, Task
    from seekrl.workflows.tool_agent import ToolAgentWorkflow

    class TwoTurns:  # a search, then the answer
        query = "capital of France"

        async def generate(self, prompt_ids, params):
            seen = "</information>" in tiny_tokenizer.decode(prompt_ids)
            ids = tiny_tokenizer.encode("<answer> Paris </answer>" if seen else f"<search> {self.query} </search>",
                                        add_special_tokens=False)
            return Completion(ids, [-0.5] * len(ids), "stop", 0)

    task = Task(id="t0", prompt=[{"role": "user", "content": "Question: what is the capital of France?"}], answer="Paris")
    with RawServer(ANSWER, drops=1) as server:
        executor = make_tool_executor(ToolsConfig(retriever=server.url))
        wf = ToolAgentWorkflow(tiny_tokenizer, SamplingParams(max_new_tokens=32), Rubric(["qa_em"]), get_format("search_r1"), executor)
        assert wf.metrics() == {"tools/search/resent": 0.0}
        group = asyncio.run(asyncio.wait_for(wf.run(task, TwoTurns(), 1), 60))
        assert server.seen == 2  # the dropped request and its re-send
        metrics = batch_metrics([group], 0, interrupted=0, queue=0, wait_s=0.0, workflow=wf)
        server.drops = 3  # the eval's search (another query: the tool caches results) is dropped once too
        TwoTurns.query = "the capital city of France"
        scores, _ = asyncio.run(asyncio.wait_for(evaluate(wf, TwoTurns(), [task], 1, SamplingParams(max_new_tokens=32), "qa_em"), 60))
        assert server.seen == 4
    [t] = group.trajectories
    assert t.finish_reason == "answered" and "Paris is in France." in t.text and group.rewards == [1.0]
    assert metrics["tools/search/resent"] == 1.0
    # `seekrl eval` (and an eval during RL) reports what its own episodes re-sent, not the run's total
    assert scores["eval/em"] == 1.0 and scores["eval/tools/search/resent"] == 1.0 and wf.metrics()["tools/search/resent"] == 2.0
    assert undocumented(scores) == []
