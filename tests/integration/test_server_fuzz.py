"""Fuzzing every POST endpoint of the engine, policy, retrieval and MCP servers with hypothesis.

Real servers on 127.0.0.1 (tests/live_server.py) over a tiny model with a 64-token context (so
any accepted generation is short) and a two-document BM25 index. Bodies are arbitrary JSON
(nested lists and objects of null, booleans, integers up to 10**40, finite floats, text) or
near-valid: an endpoint's own field names, each absent, plausible, out of range or of the wrong
type. Whatever arrives, the answer is never a 5xx, and every 4xx is one line of JSON with a
"detail". Examples are derandomized (the same every run) and bounded in number.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from live_server import LiveServer  # noqa: E402

from seekrl.engines.local import LocalEngine  # noqa: E402
from seekrl.models import make_tiny_model  # noqa: E402

TOKEN = "fuzz-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
CONTEXT = 64  # tokens: the fuzzed models' context, which bounds any accepted max_new_tokens


def fuzz_settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


# ---- strategies ---------------------------------------------------------------------------------
HUGE = st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40, -(10**40)])
INTS = st.integers() | HUGE
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=20)  # hypothesis' text never holds a lone surrogate (JSON could not carry one anyway)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                        max_leaves=16)


def near(valid: dict, edge: dict, required: tuple = ()):
    """A valid body (each field of `valid` present or not, `required` always), then 0-2 mutations:
    a field (or an unknown one) set to one of its `edge` values (out of range, wrong shape) or any JSON."""
    base = st.fixed_dictionaries({k: valid[k] for k in required}, optional={k: v for k, v in valid.items() if k not in required})
    keys = sorted(valid) + ["not_a_field"]
    mutation = st.sampled_from(keys).flatmap(lambda k: st.tuples(st.just(k), edge.get(k, st.nothing()) | ANY_JSON))
    return st.tuples(base, st.lists(mutation, max_size=2)).map(lambda t: {**t[0], **dict(t[1])})


def engine_bodies(vocab: int) -> dict:
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6)
    bad_ids = st.lists(st.integers(-2, vocab + 2) | HUGE, max_size=6)
    sampling = near(
        {"temperature": st.floats(0, 2) | st.just(0), "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 50),
         "max_new_tokens": st.integers(0, 8), "stop": TEXT | st.lists(TEXT, max_size=3),
         "stop_token_ids": st.lists(st.integers(0, vocab - 1), max_size=3), "ignore_eos": st.booleans(),
         "sampling_seed": st.integers(0, 2**63 - 1), "n": st.just(1), "skip_special_tokens": st.booleans(),
         "no_stop_trim": st.booleans(), "min_p": st.just(0.0), "repetition_penalty": st.just(1.0),
         "frequency_penalty": st.just(0.0), "presence_penalty": st.just(0.0)},
        {"temperature": st.sampled_from([-1, 1e-300, 5e-324, 1e-30, 100.0, 101]) | FLOATS,
         "top_p": st.sampled_from([0, 5e-324, 1e-30, 1.0000001, -0.1]) | FLOATS,
         "top_k": st.sampled_from([-2, 10**6]) | HUGE, "max_new_tokens": st.sampled_from([-1, CONTEXT, 10**6]) | HUGE,
         "stop": st.lists(TEXT, min_size=17, max_size=20) | st.lists(st.just(""), max_size=3),
         "stop_token_ids": bad_ids, "sampling_seed": st.sampled_from([-1, 2**63, 2**64]), "n": st.sampled_from([0, 2]),
         "min_p": FLOATS, "repetition_penalty": FLOATS, "frequency_penalty": FLOATS, "presence_penalty": FLOATS},
    )
    return {
        "/generate": near(
            {"input_ids": ids | st.lists(ids, min_size=1, max_size=3), "sampling_params": sampling | st.lists(sampling, max_size=3),
             "return_logprob": st.booleans(), "logprob_start_len": st.integers(0, 4), "rid": TEXT | st.lists(TEXT, max_size=3),
             "stream": st.just(False)},
            {"input_ids": bad_ids | st.lists(bad_ids, max_size=6) | st.just([[1], [2, 3], []]),
             "rid": st.lists(TEXT, min_size=4, max_size=5), "stream": st.just(True), "logprob_start_len": HUGE},
            required=("input_ids",),
        ),
        "/update_weights_from_disk": near(
            {"model_path": st.sampled_from(["/nonexistent/folder", "/tmp", "/", "."]) | TEXT, "weight_version": st.integers(0, 9),
             "load_format": st.none(), "flush_cache": st.booleans(), "abort_all_requests": st.booleans()},
            {"model_path": st.sampled_from(["", "\x00", "a" * 5000]), "weight_version": HUGE | TEXT | FLOATS},
            required=("model_path",),
        ),
        "/pause_generation": near({"mode": st.sampled_from(["abort", "retract", "in_place"])}, {"mode": TEXT}),
        "/continue_generation": ANY_JSON,
        "/abort_request": near({"rid": TEXT, "abort_all": st.booleans()}, {}),
        "/flush_cache": ANY_JSON,
        "/score": near(
            {"input_ids": ids | st.lists(ids, min_size=1, max_size=3), "start": st.integers(1, 6) | st.lists(st.integers(1, 6), max_size=3),
             "temperature": st.floats(1e-5, 2) | st.lists(st.floats(1e-5, 2), min_size=1, max_size=3)},
            {"input_ids": bad_ids | st.lists(bad_ids, max_size=6) | st.just([[1], [2, 3], []]) | st.lists(ids, min_size=5, max_size=6),
             "start": st.sampled_from([0, -1, 7]) | HUGE | st.lists(st.integers(-1, 8), max_size=4),
             "temperature": st.sampled_from([0, -1, 1e-300, 5e-324, 1e-30, 100.0, 101]) | FLOATS},
            required=("input_ids",),
        ),
    }


def policy_bodies(vocab: int) -> dict:
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6)
    bad_ids = st.lists(st.integers(-2, vocab + 2) | HUGE, max_size=6)
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | TEXT}, optional={"text": TEXT | ANY_JSON})
    message = near({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT},
                   {"role": st.sampled_from(["tool", "developer", ""]), "content": st.none() | st.lists(part, max_size=3)},
                   required=("role", "content"))
    valid = {
        "model": TEXT, "max_tokens": st.integers(1, 8), "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1),
        "top_k": st.integers(-1, 50), "n": st.integers(1, 3), "stop": TEXT | st.lists(TEXT, max_size=3),
        "seed": st.integers(-(2**63), 2**63 - 1 - 128), "stream": st.just(False),
    }
    edge = {
        "max_tokens": st.sampled_from([0, -1, 17, CONTEXT, 10**6]) | HUGE,
        "temperature": st.sampled_from([-1, 1e-300, 5e-324, 2.0000001]) | FLOATS,
        "top_p": st.sampled_from([0, 5e-324, 1e-30, 1.5]) | FLOATS, "top_k": HUGE | st.just(-2),
        "n": st.sampled_from([0, 5, 128, 129]) | HUGE, "stop": st.lists(TEXT, min_size=17, max_size=20),
        "seed": st.sampled_from([2**63 - 1 - 127, 2**63 - 1, 2**63, -(2**63) - 1]), "stream": st.just(True),
    }
    return {
        "/v1/chat/completions": near(
            {**valid, "messages": st.lists(message, min_size=1, max_size=3), "max_completion_tokens": st.integers(1, 8),
             "logprobs": st.booleans(), "top_logprobs": st.just(0)},
            {**edge, "messages": st.lists(message, max_size=0) | st.lists(ANY_JSON, min_size=1, max_size=2),
             "max_completion_tokens": edge["max_tokens"], "top_logprobs": st.sampled_from([1, -1]) | HUGE},
            required=("messages",),
        ),
        "/v1/completions": near(
            {**valid, "prompt": TEXT | st.lists(TEXT, min_size=1, max_size=3) | ids | st.lists(ids, min_size=1, max_size=3),
             "logprobs": st.integers(0, 5), "echo": st.just(False)},
            {**edge, "prompt": st.just("") | st.just([]) | bad_ids | st.lists(bad_ids, max_size=6) | st.lists(TEXT, min_size=5, max_size=6),
             "logprobs": st.sampled_from([-1, 6]) | HUGE, "echo": st.just(True)},
            required=("prompt",),
        ),
    }


RETRIEVAL_BODIES = {
    "/retrieve": near(
        {"queries": st.lists(TEXT, max_size=5), "topk": st.integers(1, 50) | st.none(), "return_scores": st.booleans()},
        {"queries": st.lists(TEXT, min_size=9, max_size=10) | TEXT, "topk": st.sampled_from([0, -1, 51]) | HUGE},
        required=("queries",),
    ),
}


def requests_for(bodies: dict):
    """(path, body): a POST endpoint, then arbitrary JSON (a third) or a near-valid body for it."""
    return st.sampled_from(sorted(bodies)).flatmap(lambda path: st.tuples(st.just(path), st.one_of(ANY_JSON, bodies[path], bodies[path])))


def check(client: httpx.Client, path: str, body) -> httpx.Response:
    """POST `body`; never a 5xx, every 4xx one line of JSON with a non-empty "detail"."""
    r = client.post(path, content=json.dumps(body).encode())
    assert r.status_code < 500, f"POST {path} {body!r} -> {r.status_code} {r.text}"
    assert "Traceback" not in r.text
    if 400 <= r.status_code < 500:
        assert "\n" not in r.text, r.text
        payload = r.json()
        assert isinstance(payload, dict) and isinstance(payload.get("detail"), str) and payload["detail"], r.text
    else:
        r.json()
    return r


# ---- servers --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model(tiny_tokenizer):
    """A private tiny model with a 64-token context (the fuzzed engine may be sent weight updates)."""
    return make_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, num_heads=4, max_position_embeddings=CONTEXT, seed=5).eval()


def _serve_engine(make_app, small_model, tiny_tokenizer, **limits):
    """A client of `make_app(LocalEngine, tokenizer, token=TOKEN, **limits)` served on loopback."""
    engine = LocalEngine(small_model, tiny_tokenizer, max_batch_size=8, seed=0)
    try:
        with LiveServer(make_app(engine, tiny_tokenizer, token=TOKEN, max_body_bytes=100_000, **limits)) as url, \
                httpx.Client(base_url=url, headers=AUTH, timeout=60) as client:
            yield client
    finally:
        engine.close()


@pytest.fixture(scope="module")
def engine_server(small_model, tiny_tokenizer):
    from seekrl.servers.engine import make_app

    yield from _serve_engine(make_app, small_model, tiny_tokenizer, model_path="fuzz", max_prompts_per_request=4,
                             default_max_new_tokens=4)


@pytest.fixture(scope="module")
def policy_server(small_model, tiny_tokenizer):
    from seekrl.servers.policy import make_app

    yield from _serve_engine(make_app, small_model, tiny_tokenizer, model_name="fuzz", max_tokens_cap=16, default_max_tokens=4,
                             max_prompts_per_request=4, max_completions_per_request=8)


@pytest.fixture(scope="module")
def retrieval_server():
    pytest.importorskip("bm25s")
    from seekrl.data.corpus import Document
    from seekrl.retrieval.bm25 import BM25Index
    from seekrl.servers.retrieval import make_app

    docs = [Document.from_title_text("0", "Paris", "Paris is the capital of France."),
            Document.from_title_text("1", "Nile", "The Nile is a river in Africa.")]
    app = make_app(BM25Index.build(docs), token=TOKEN, max_body_bytes=100_000, max_topk=50, max_queries=8)
    with LiveServer(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=60) as client:
        yield client


# ---- the fuzz tests -------------------------------------------------------------------------------
def test_engine_server_fuzz(engine_server, tiny_tokenizer):
    @fuzz_settings(150)
    @given(requests_for(engine_bodies(len(tiny_tokenizer))))
    def run(request):
        path, body = request
        try:
            check(engine_server, path, body)
        finally:
            if path == "/pause_generation":  # a paused engine would hold every later /generate
                assert engine_server.post("/continue_generation").status_code == 200

    run()
    assert engine_server.get("/health").json() == {"status": "ok"}


def test_policy_server_fuzz(policy_server, tiny_tokenizer):
    @fuzz_settings(120)
    @given(requests_for(policy_bodies(len(tiny_tokenizer))))
    def run(request):
        check(policy_server, *request)

    run()


def test_retrieval_server_fuzz(retrieval_server):
    @fuzz_settings(100)
    @given(requests_for(RETRIEVAL_BODIES))
    def run(request):
        check(retrieval_server, *request)

    run()


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory):
    """`seekrl serve mcp`'s app (fastmcp, streamable HTTP) with an initialized session."""
    pytest.importorskip("fastmcp")
    from seekrl.data.corpus import Document
    from seekrl.retrieval.bm25 import BM25Index
    from seekrl.servers.mcp import make_mcp_server

    index = tmp_path_factory.mktemp("mcp-fuzz") / "index"
    BM25Index.build([Document.from_title_text("0", "Paris", "Paris is the capital of France."),
                     Document.from_title_text("1", "Nile", "The Nile is a river in Africa.")]).save(index)
    with LiveServer(make_mcp_server(index, topk=1).http_app(), lifespan="on") as url, \
            httpx.Client(base_url=url, headers=MCP_HEADERS, timeout=60) as client:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}}
        r = client.post("/mcp", json=init)
        assert r.status_code == 200, r.text
        session = {"mcp-session-id": r.headers["mcp-session-id"]}
        client.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        yield client, session


def test_mcp_server_fuzz(mcp_server):
    """The MCP server parses its bodies with fastmcp (not a Guard): arbitrary JSON-RPC bodies, with
    and without the session, and tools/call with fuzzed arguments never get a 5xx; a tool that
    refuses its arguments answers a JSON-RPC error or an isError result, not a crash."""
    client, session = mcp_server
    arguments = near({"query": TEXT, "topk": st.integers(-3, 60)},
                     {"query": ANY_JSON, "topk": HUGE | FLOATS | TEXT}, required=("query",))
    call = st.builds(lambda i, name, args: {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                             "params": {"name": name, "arguments": args}},
                     st.integers(1, 10**6), st.sampled_from(["search", "search", "nope"]), arguments | ANY_JSON)
    rpc = st.builds(lambda i, method, params: {"jsonrpc": "2.0", "id": i, "method": method, "params": params},
                    st.integers(1, 10**6) | TEXT, st.sampled_from(["tools/list", "tools/call", "initialize", "ping", "x"]), ANY_JSON)

    @fuzz_settings(100)
    @given(st.one_of(call, call, rpc, ANY_JSON), st.booleans())
    def run(body, with_session):
        r = client.post("/mcp", content=json.dumps(body).encode(), headers=session if with_session else {})
        assert r.status_code < 500, f"{body!r} -> {r.status_code} {r.text}"
        assert "Traceback" not in r.text

    run()


# ---- what the fuzzing found (500s before the fix), kept as explicit cases -----------------------------
@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-45, 9.9e-6])
def test_a_temperature_too_small_for_float32_is_a_400_not_a_500(engine_server, policy_server, temperature):
    # float32 turns it into 0 (or logits / T into inf): NaN log-probs, which JSON cannot encode
    r = check(policy_server, "/v1/completions", {"prompt": "0", "max_tokens": 2, "temperature": temperature, "logprobs": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert r.json()["detail"] == f"temperature={temperature} is too small to sample with; send 0 for greedy decoding or at least 1e-05"
    r = check(engine_server, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "temperature": temperature},
                                         "return_logprob": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.temperature"
    for ok in (0, 1e-5):  # greedy, and the smallest temperature that samples
        assert check(policy_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "0"}], "max_tokens": 2,
                                                              "temperature": ok}).status_code == 200
        assert check(engine_server, "/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 2, "temperature": ok},
                                                  "return_logprob": True}).status_code == 200


@pytest.mark.parametrize("model_path", ["a" * 5000, "x/" * 3000, "nul\x00byte"])
def test_an_unreadable_model_path_is_a_400_not_a_500(engine_server, model_path):
    r = check(engine_server, "/update_weights_from_disk", {"model_path": model_path})  # ENAMETOOLONG from os.stat before
    assert r.status_code == 400 and r.json()["success"] is False and "model_path '" in r.json()["detail"]
