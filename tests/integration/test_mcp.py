"""MCP tools over real servers on 127.0.0.1: seekrl's search server and the MCP client tools.

A tiny BM25 index is served over streamable HTTP by `make_mcp_server` in a uvicorn thread (no
token) and by `python -m seekrl.servers.mcp` in a subprocess (token from $SEEKRL_MCP_TOKEN),
and over stdio by the same command with --stdio. The tools go through `ToolExecutor` and a
DR Tulu episode of `ToolAgentWorkflow` with a scripted engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import time

import pytest
from procs import stop_process

pytest.importorskip("bm25s")
pytest.importorskip("fastmcp")
uvicorn = pytest.importorskip("uvicorn")

from live_server import LiveServer, free_port  # noqa: E402

from seekrl.data.corpus import Document  # noqa: E402
from seekrl.retrieval.bm25 import BM25Index  # noqa: E402
from seekrl.rewards.rubric import Rubric  # noqa: E402
from seekrl.servers.mcp import TOKEN_ENV, make_mcp_server  # noqa: E402
from seekrl.tools import EpisodeToolState, ToolCall, ToolExecutor, ToolPolicy, ToolRegistry, get_format  # noqa: E402
from seekrl.tools.mcp import MCPConnection, MCPConnectionError, load_mcp_tools  # noqa: E402
from seekrl.tools.search import format_passages  # noqa: E402
from seekrl.types import Completion, SamplingParams, Task  # noqa: E402
from seekrl.workflows.tool_agent import ToolAgentWorkflow  # noqa: E402

TOKEN = "mcp-s3cret"
DOCS = [
    Document.from_title_text("0", "Alpha", "alpha is the first letter of the Greek alphabet."),
    Document.from_title_text("1", "Berlin", "Berlin is the capital of Germany."),
    Document.from_title_text("2", "Nile", "The Nile is a river in Africa."),
]
ALPHA, BERLIN, NILE = (format_passages([(d, 1.0)]) for d in DOCS)  # "Doc 1(Title: ...) ..."


def _wait_port(port: int, alive, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if not alive() or time.monotonic() > deadline:
                raise RuntimeError(f"MCP server on port {port} did not start") from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcp") / "index"
    BM25Index.build(DOCS).save(d)
    return d


def _http_server(index_dir, port: int) -> LiveServer:
    """`make_mcp_server` over streamable HTTP on 127.0.0.1:`port`, no token, started."""
    return LiveServer(make_mcp_server(index_dir, topk=1).http_app(), port=port, lifespan="on").start()


@pytest.fixture(scope="module")
def url(index_dir):
    port = free_port()
    server = _http_server(index_dir, port)
    yield f"http://127.0.0.1:{port}/mcp"
    server.stop()


@pytest.fixture(scope="module")
def token_url(index_dir):
    """`python -m seekrl.servers.mcp` over HTTP in a subprocess, token from the environment."""
    port = free_port()
    env = {**os.environ, TOKEN_ENV: TOKEN}
    cmd = [sys.executable, "-m", "seekrl.servers.mcp", "--index", str(index_dir), "--port", str(port), "--topk", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    try:
        _wait_port(port, lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(proc, timeout=10)




def _run(call: ToolCall, tools, state: EpisodeToolState | None = None):
    state = state or EpisodeToolState()
    return asyncio.run(ToolExecutor(ToolRegistry(tools)).run(call, state)), state


def test_lists_search_with_its_schema(url):
    (search,) = asyncio.run(load_mcp_tools(url))
    assert search.name == "search"
    assert search.description.startswith("Search the knowledge base")
    assert search.parameters["properties"]["query"]["type"] == "string"
    assert search.parameters["properties"]["topk"] == {"default": 1, "type": "integer", "description": "how many passages to return."}
    assert search.parameters["required"] == ["query"]
    assert search.policy == ToolPolicy(timeout_s=30.0)
    assert ToolRegistry([search]).schemas()[0]["function"]["parameters"] == search.parameters


def test_executor_calls_search_and_reuses_one_session(url):
    tools = asyncio.run(load_mcp_tools(url, policy=ToolPolicy(timeout_s=10, max_concurrency=2)))
    (search,) = tools
    assert tools[0].policy.max_concurrency == 2
    ex = ToolExecutor(ToolRegistry(tools))

    async def main():  # a different event loop from the one that listed the tools
        state = EpisodeToolState()
        first = await ex.run(ToolCall("search", {"query": "alpha"}, ""), state)
        client = await search.connection.client()
        calls = [ToolCall("search", {"query": q, "topk": "2"}, "") for q in ("Berlin capital alpha", "Nile river", "alpha")]
        rest = await ex.run_many(calls, state)
        same = (await search.connection.client()) is client
        await search.aclose()
        return first, rest, same, state

    first, rest, same, state = asyncio.run(main())
    assert first.ok and first.text == ALPHA
    assert all(r.ok for r in rest) and same
    assert rest[0].text == format_passages([(DOCS[1], 2.0), (DOCS[0], 1.0)])
    assert rest[1].text == NILE
    assert state.calls["search"] == 4 and not state.errors


def test_server_side_error_is_a_counted_error_result(url):
    tools = asyncio.run(load_mcp_tools(url))
    res, state = _run(ToolCall("search", {"query": "alpha", "topk": "0"}, ""), tools)
    assert not res.ok and res.error == "exception"
    assert res.text == "Error: 'search' failed: MCPToolError: search: topk must be in 1..50, got 0"
    assert state.errors["exception"] == 1
    res, _ = _run(ToolCall("search", {"query": "alpha", "k": "2"}, ""), tools)  # checked by the executor first
    assert res.error == "bad_args"


def test_token_is_enforced(token_url):
    with pytest.raises(MCPConnectionError, match="401"):
        asyncio.run(load_mcp_tools(token_url))
    with pytest.raises(MCPConnectionError, match="wrong bearer token"):
        asyncio.run(load_mcp_tools(token_url, token="not-it"))
    tools = asyncio.run(load_mcp_tools(token_url, token=TOKEN))
    res, _ = _run(ToolCall("search", {"query": "alpha"}, ""), tools)
    assert res.ok and res.text == ALPHA
    # The same tool through a connection without the token: an error observation, not an exception,
    # and the infrastructure's failure (the server refused the session), not the model's: "unavailable".
    tokenless = [dataclasses.replace(tools[0], connection=MCPConnection(token_url, timeout_s=5))]
    res, state = _run(ToolCall("search", {"query": "alpha"}, ""), tokenless)
    assert not res.ok and res.error == "unavailable" and "HTTP 401" in res.text
    assert state.errors["unavailable"] == 1
    assert TOKEN not in repr(tools[0]) and TOKEN not in repr(tools[0].connection)


def test_session_reopens_after_a_server_restart(index_dir):
    port = free_port()
    server = _http_server(index_dir, port)
    (search,) = asyncio.run(load_mcp_tools(f"http://127.0.0.1:{port}/mcp", timeout_s=5))
    ex = ToolExecutor(ToolRegistry([search]))
    call = ToolCall("search", {"query": "alpha"}, "")

    async def main():
        nonlocal server
        state = EpisodeToolState()
        before = await ex.run(call, state)
        await asyncio.to_thread(server.stop)
        down = await ex.run(call, state)  # an error observation, not an exception
        server = await asyncio.to_thread(_http_server, index_dir, port)
        after = [await ex.run(call, state) for _ in range(2)]
        await search.aclose()
        return before, down, after, state

    try:
        before, down, after, state = asyncio.run(main())
    finally:
        server.stop()
    assert before.ok and before.text == ALPHA
    assert not down.ok and down.text.startswith("Error: 'search' failed: MCPConnectionError: ")
    assert down.error == "unavailable"  # the server was down: its episode is left out of the update
    assert [r.text for r in after] == [ALPHA, ALPHA] and state.errors["unavailable"] == 1


def test_unreachable_server_is_one_clear_line():
    with pytest.raises(MCPConnectionError, match=r"^cannot connect to MCP server http://127\.0\.0\.1:\d+/mcp: ") as e:
        asyncio.run(load_mcp_tools(f"http://127.0.0.1:{free_port()}/mcp", timeout_s=5))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="only sent over HTTP"):
        MCPConnection("python server.py", token="x")


def test_stdio_transport(index_dir):
    cmd = f"python -m seekrl.servers.mcp --index {index_dir} --stdio --topk 1"

    async def main():
        (search,) = await load_mcp_tools(cmd)
        ex = ToolExecutor(ToolRegistry([search]))
        state = EpisodeToolState()
        ok = await ex.run(ToolCall("search", {"query": "alpha"}, ""), state)
        bad = await ex.run(ToolCall("search", {"query": "alpha", "topk": 0}, ""), state)
        await search.aclose()
        return ok, bad, state

    ok, bad, state = asyncio.run(main())
    assert ok.ok and ok.text == ALPHA
    assert not bad.ok and "topk must be in 1..50" in bad.text and state.errors["exception"] == 1


def test_dr_tulu_episode_makes_a_real_mcp_call(url, tiny_tokenizer):
    tok = tiny_tokenizer
    tools = asyncio.run(load_mcp_tools(url))
    turns = ['<call_tool name="search">alpha</call_tool>', "<answer>alpha</answer>"]

    class Scripted:
        def __init__(self):
            self.prompts = []

        async def generate(self, prompt_ids, params):
            self.prompts.append(list(prompt_ids))
            ids = tok.encode(turns[len(self.prompts) - 1], add_special_tokens=False)
            return Completion(ids, [-0.5] * len(ids), "stop", 3)

    task = Task(id="a", prompt=[{"role": "user", "content": "Question: what is alpha?"}], answer="alpha", source="t", meta={})
    wf = ToolAgentWorkflow(
        tok, SamplingParams(max_new_tokens=64), Rubric(["qa_em"]), get_format("dr_tulu"), ToolExecutor(ToolRegistry(tools)),
        max_turns=2, max_obs_tokens=256, max_total_tokens=512,
    )
    eng = Scripted()
    (traj,) = asyncio.run(wf.run(task, eng, 1)).trajectories
    assert traj.finish_reason == "answered" and traj.reward == 1.0
    assert traj.metrics["tool_calls/search"] == 1 and traj.metrics["tool_errors"] == 0
    obs = f"\n<tool_output>{ALPHA}</tool_output>\n"
    assert traj.text == turns[0] + obs + turns[1]
    inserted = [i for i, m in zip(traj.completion_ids, traj.loss_mask) if m == 0]
    assert inserted == tok.encode(obs, add_special_tokens=False)
    assert eng.prompts[1] == traj.prompt_ids + traj.completion_ids[: len(eng.prompts[1]) - len(traj.prompt_ids)]


def test_body_limit_413(index_dir):
    """`python -m seekrl.servers.mcp --max-body-mb`: a body past the limit is a one-line 413 (declared
    length or chunked), the normal MCP calls under it still work."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "seekrl.servers.mcp", "--index", str(index_dir), "--port", str(port), "--topk", "1",
           "--max-body-mb", "0.002"]
    proc = subprocess.Popen(cmd, env={k: v for k, v in os.environ.items() if k != TOKEN_ENV}, stdout=subprocess.DEVNULL)
    try:
        _wait_port(port, lambda: proc.poll() is None)
        url = f"http://127.0.0.1:{port}/mcp"
        tools = asyncio.run(load_mcp_tools(url))
        res, _ = _run(ToolCall("search", {"query": "alpha"}, ""), tools)
        assert res.ok and res.text == ALPHA
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "' + b"a" * 3000 + b'"}}'
        r = httpx.post(url, content=big, headers=headers, timeout=10)
        assert r.status_code == 413 and "\n" not in r.text and "over the limit of 2000 bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b"a" * 500

        r = httpx.post(url, content=chunks(), headers=headers, timeout=10)
        assert r.status_code == 413 and "over the limit" in r.json()["detail"]
        res, state = _run(ToolCall("search", {"query": "alpha " * 600}, ""), tools)  # through the client: an error result
        assert not res.ok and state.errors
    finally:
        stop_process(proc, timeout=10)
