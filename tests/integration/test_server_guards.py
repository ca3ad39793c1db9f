"""The shared guards (seekrl/servers/guards.py) on real servers on 127.0.0.1.

The policy server (LocalEngine over the tiny model) and the retrieval server (a small BM25
index) get the same hostile requests: 100,000 nested lists, lone surrogates, bad UTF-8, wrong
types, an oversized body, bearer schemes in any case, a wrong token. Each answers a one-line
JSON 4xx in its own shape and counts it in GET /server_info (token), while GET /health stays
open and says only "ok". The policy server also bounds prompts and prompts x n per request and
cancels the generation of a client that hangs up; the MCP server accepts "bearer" in any case.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from live_server import LiveServer  # noqa: E402

from seekrl.engines.local import LocalEngine  # noqa: E402
from seekrl.servers.policy import make_app as make_policy_app  # noqa: E402

TOKEN = "guard-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 250_000  # bytes: room for 100,000 nested lists (200,000 bytes), so depth is what fails
DEEP = b"[" * 100_000 + b"]" * 100_000
CHAT = "/v1/chat/completions"


@dataclasses.dataclass
class Target:
    """A live server and how to talk to its main POST endpoint."""

    name: str
    url: str
    path: str
    valid: dict  # a request that succeeds
    field: str  # its list-of-strings field
    app: object

    def post(self, body, headers: dict | None = AUTH, path: str | None = None) -> httpx.Response:
        """POST `body` (bytes, an iterator of bytes, or a JSON value) to `path` (default: the main one)."""
        content = body if isinstance(body, bytes) or hasattr(body, "__next__") else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        return httpx.post(self.url + (path or self.path), content=content, headers=headers, timeout=30)

    def info(self) -> dict:
        r = httpx.get(self.url + "/server_info", headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()


def detail(r: httpx.Response) -> str:
    """The one-line message of an error response, checked for shape and for leaks."""
    assert "Traceback" not in r.text and "\n" not in r.text, r.text
    body = r.json()
    assert body["detail"] and "\n" not in body["detail"]
    if "error" in body:  # the policy server: OpenAI's shape too
        assert body["error"]["message"] == body["detail"]
    return body["detail"]


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    return LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=16)


@pytest.fixture(scope="module")
def policy(engine, tiny_tokenizer):
    app = make_policy_app(
        engine, tiny_tokenizer, model_name="tiny", token=TOKEN, max_body_bytes=LIMIT, max_tokens_cap=1000,
        max_prompts_per_request=4, max_completions_per_request=8,
    )
    with LiveServer(app) as url:
        yield Target("policy", url, "/v1/completions", {"prompt": ["the quick"], "max_tokens": 2}, "prompt", app)


@pytest.fixture(scope="module")
def retrieval():
    pytest.importorskip("bm25s")
    from seekrl.data.corpus import Document
    from seekrl.retrieval.bm25 import BM25Index
    from seekrl.servers.retrieval import make_app

    docs = [Document.from_title_text("0", "Paris", "Paris is the capital of France."),
            Document.from_title_text("1", "Nile", "The Nile is a river in Africa.")]
    app = make_app(BM25Index.build(docs), token=TOKEN, max_body_bytes=LIMIT)
    with LiveServer(app) as url:
        yield Target("retrieval", url, "/retrieve", {"queries": ["capital"], "topk": 1}, "queries", app)


@pytest.fixture(params=["policy", "retrieval"])
def target(request) -> Target:
    return request.getfixturevalue(request.param)


# ---- hostile bodies -----------------------------------------------------------------------------
def test_100k_nested_lists_are_a_fast_one_line_400(target):
    for body in (DEEP, b'{"%s": ' % target.field.encode() + DEEP + b"}"):
        t0 = time.monotonic()
        r = target.post(body)
        assert r.status_code == 400 and detail(r) == "JSON nested deeper than 32 levels"
        assert time.monotonic() - t0 < 5
    # below the recursion limit, over max_depth: caught by the walk after parsing
    r = target.post(b'{"%s": ' % target.field.encode() + b"[" * 40 + b"]" * 40 + b"}")
    assert r.status_code == 400 and "nested deeper than 32" in detail(r)


def test_lone_surrogates_and_bad_utf8_are_400s(target):
    r = target.post(b'{"%s": ["fine", "bad \\ud800"]}' % target.field.encode())
    assert r.status_code == 400 and "lone surrogate \\ud800" in detail(r) and f"{target.field}.1" in detail(r)
    r = target.post(json.dumps(target.valid)[:-1].encode() + b', "\\udc00": 1}')  # an ignored key
    assert r.status_code == 400 and "lone surrogate" in detail(r)
    r = target.post(b'{"%s": ["\xff\xfe"]}' % target.field.encode())
    assert r.status_code == 400 and "not valid UTF-8" in detail(r)
    r = target.post(b'{"%s": ["x"], "topk": NaN, "max_tokens": NaN}' % target.field.encode())
    assert r.status_code == 400 and "NaN" in detail(r)


@pytest.mark.parametrize(
    "payload",
    [
        {"queries": {"a": [1]}, "prompt": {"a": [1]}, "topk": "many", "max_tokens": "many"},
        {"queries": [[["x"]]], "prompt": [[["x"]]]},
        {"queries": [10**40], "prompt": [10**40], "seed": 10**40},
        ["not", "an", "object"],
        "a string",
        None,
    ],
)
def test_wrong_types_are_one_line_4xx(target, payload):
    r = target.post(payload)
    assert 400 <= r.status_code < 500 and r.status_code != 401, r.text
    detail(r)


def test_body_over_the_limit_is_a_413(target):
    big = {**target.valid, "pad": "x" * LIMIT}
    r = target.post(big)
    assert r.status_code == 413 and f"limit of {LIMIT} bytes" in detail(r)

    def chunks():  # no Content-Length: counted as it streams
        yield b'{"pad": "'
        for _ in range(LIMIT // 10_000 + 1):
            yield b"x" * 10_000
        yield b'"}'

    assert target.post(chunks()).status_code == 413


# ---- auth, /health, /server_info ----------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_bearer_scheme_in_any_case(target, scheme):
    r = target.post(target.valid, headers={"Authorization": f"{scheme} {TOKEN}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
def test_wrong_or_missing_token_is_a_401(target, headers):
    r = target.post(target.valid, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "bearer" in detail(r).lower()


def test_health_is_open_and_says_nothing_else(target):
    r = httpx.get(target.url + "/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_server_info_needs_the_token_and_counts_rejections(target):
    assert httpx.get(target.url + "/server_info", timeout=30).status_code == 401
    before = target.info()["stats"]
    assert target.post(b"{not json").status_code == 400
    assert target.post(target.valid, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert target.post(target.valid).status_code == 200
    info = target.info()
    stats = info["stats"]
    assert stats["rejected"] - before["rejected"] == 2
    assert stats["requests"] - before["requests"] == 4  # the first /server_info, then three posts
    assert stats["errors"] == before["errors"] and {"cancelled", "errors"} <= set(stats)
    assert info["limits"]["max_body_bytes"] == LIMIT and info["limits"]["max_depth"] == 32 and info["limits"]["auth"] is True
    assert TOKEN not in json.dumps(info)
    assert target.app.state.stats is target.app.state.guard.stats


# ---- the policy server's own limits -------------------------------------------------------------
def test_too_many_prompts_is_a_413_and_too_many_completions_a_400(policy):
    r = policy.post({"prompt": ["a b"] * 5, "max_tokens": 2})
    assert r.status_code == 413 and detail(r) == "5 prompts in one request; this server's limit is 4"
    assert r.json()["error"]["param"] == "prompt"
    r = policy.post({"prompt": ["a b"] * 3, "max_tokens": 2, "n": 3})
    assert r.status_code == 400 and "3 prompts x n=3 is 9 completions; this server's limit is 8" in detail(r)
    r = policy.post({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 9}, path=CHAT)
    assert r.status_code == 400 and "n=9 is 9 completions" in detail(r)
    r = policy.post({"prompt": ["a b"] * 4, "max_tokens": 2, "n": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 8


def test_lone_surrogate_in_a_chat_message_is_a_400(policy):
    r = policy.post(b'{"messages": [{"role": "user", "content": "hi \\udbff"}], "max_tokens": 2}', path=CHAT)
    assert r.status_code == 400 and "messages.0.content" in detail(r) and "lone surrogate" in detail(r)


def test_a_client_that_hangs_up_has_its_generation_cancelled(policy, engine):
    """Greedy decoding of the tiny model runs to max_tokens (about 1 ms a step and row on CPU):
    the client gives up after 0.5 s, long before the 8 x 960 tokens are done."""
    before = policy.info()["stats"]
    tokens_before = engine.stats["tokens"]
    body = {"prompt": "the quick brown fox", "max_tokens": 960, "temperature": 0, "n": 8}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(policy.url + "/v1/completions", json=body, headers=AUTH, timeout=httpx.Timeout(30, read=0.5))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2:
        stats = policy.info()["stats"]
        if stats["cancelled"] > before["cancelled"] and engine.stats["tokens"] > tokens_before:
            break  # the server saw the hang-up and the engine's batch has ended
        time.sleep(0.05)
    assert stats["cancelled"] == before["cancelled"] + 1, stats
    assert engine.queued == 0 and engine.in_flight == 0  # nothing queued or in flight for it
    assert tokens_before < engine.stats["tokens"] < tokens_before + 8 * 960  # stopped early
    assert stats["completions"] == before["completions"]
    # and the engine still serves
    assert policy.post(policy.valid).status_code == 200


# ---- MCP: the SDK's bearer check, our token compare ---------------------------------------------
def test_mcp_accepts_the_bearer_scheme_in_any_case(tmp_path):
    pytest.importorskip("bm25s")
    pytest.importorskip("fastmcp")
    from seekrl.data.corpus import Document
    from seekrl.retrieval.bm25 import BM25Index
    from seekrl.servers.mcp import make_mcp_server

    BM25Index.build([Document.from_title_text("0", "Alpha", "alpha is a letter.")]).save(tmp_path / "index")
    app = make_mcp_server(tmp_path / "index", token=TOKEN).http_app()
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    with LiveServer(app, lifespan="on") as url:
        for auth, status in [(f"Bearer {TOKEN}", 200), (f"bearer {TOKEN}", 200), (f"BEARER {TOKEN}", 200),
                             ("Bearer wrong", 401), (None, 401)]:
            headers = {**accept, **({"Authorization": auth} if auth else {})}
            r = httpx.post(url + "/mcp", json=init, headers=headers, timeout=30)
            assert r.status_code == status, (auth, r.status_code, r.text)
