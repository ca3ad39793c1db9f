"""@tool schemas, the registry, and the executor's policies (timeouts, retries, limits, cache)."""

from __future__ import annotations

import asyncio
import time
from typing import Optional

import pytest

from seekrl.tools import EpisodeToolState, Tool, ToolCall, ToolExecutor, ToolPolicy, ToolRegistry, tool


@tool
async def search(query: str, top_k: int = 3, domains: Optional[list[str]] = None) -> str:
    """Search the corpus and return passages.

    More details that are not the description.

    Args:
        query: what to look for,
            continued on the next line.
        top_k (int): how many passages.
        domains: restrict to these sites.

    Returns:
        the passages.
    """
    return f"{query}|{top_k}|{domains}"


def test_tool_schema_from_signature_and_docstring():
    assert isinstance(search, Tool)
    assert search.name == "search"
    assert search.description == "Search the corpus and return passages."
    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for, continued on the next line."},
            "top_k": {"type": "integer", "description": "how many passages.", "default": 3},
            "domains": {"type": ["array", "null"], "items": {"type": "string"}, "description": "restrict to these sites.", "default": None},
        },
        "required": ["query"],
    }
    assert search.policy == ToolPolicy()


def test_tool_with_options_sync_function_and_registry():
    @tool(name="calc", timeout_s=2, max_calls=1)
    def add(a: float, b: float, exact: bool = False) -> float:
        """Add two numbers."""
        return a + b

    assert add.name == "calc" and add.policy.timeout_s == 2 and add.policy.max_calls == 1
    assert add.parameters["properties"]["a"] == {"type": "number"}
    assert add.parameters["required"] == ["a", "b"]
    assert asyncio.run(add(a=1, b=2)) == "3"  # sync functions run in a thread; output is text
    reg = ToolRegistry([search, add])
    assert reg.names() == ["search", "calc"] and reg.get("calc") is add and reg.get("nope") is None
    assert reg.schemas()[1] == {
        "type": "function",
        "function": {"name": "calc", "description": "Add two numbers.", "parameters": add.parameters},
    }
    with pytest.raises(ValueError, match="already registered"):
        reg.register(add)
    with pytest.raises(TypeError, match="unsupported parameter type"):

        @tool
        def bad(x: set) -> str:
            return ""


def run(coro):
    return asyncio.run(coro)


def test_unknown_tool_and_bad_args():
    ex = ToolExecutor(ToolRegistry([search]))
    st = EpisodeToolState()
    r = run(ex.run(ToolCall("serch", {"query": "x"}, ""), st))
    assert not r.ok and r.error == "unknown_tool" and r.text.startswith("Error:") and "search" in r.text
    for args, msg in [
        ({}, "missing argument(s): query"),
        ({"query": "x", "k": 1}, "unknown argument(s): k"),
        ({"query": 3}, "argument 'query': expected string"),
        ({"query": "x", "top_k": "many"}, "argument 'top_k'"),
        ({"query": "x", "top_k": True}, "argument 'top_k'"),
        ({"query": "x", "domains": [1]}, "argument 'domains'"),
    ]:
        r = run(ex.run(ToolCall("search", args, ""), st))
        assert not r.ok and r.error == "bad_args" and msg in r.text, (args, r.text)
    # a string that is exactly an integer is converted (DR Tulu attributes are strings)
    r = run(ex.run(ToolCall("search", {"query": "x", "top_k": "5", "domains": None}, ""), st))
    assert r.ok and r.text == "x|5|None"
    assert st.errors["bad_args"] == 6 and st.errors["unknown_tool"] == 1


def test_timeout_and_retries_with_backoff():
    attempts = []

    @tool(timeout_s=0.05, retries=2, backoff_s=0.02)
    async def flaky(query: str) -> str:
        """Fails twice, then works."""
        attempts.append(time.perf_counter())
        if len(attempts) == 1:
            raise RuntimeError("boom")
        if len(attempts) == 2:
            await asyncio.sleep(1)  # timed out
        return "ok"

    ex = ToolExecutor(ToolRegistry([flaky]))
    r = run(ex.run(ToolCall("flaky", {"query": "q"}, ""), EpisodeToolState()))
    assert r.ok and r.text == "ok" and r.attempts == 3 and len(attempts) == 3
    # backoff 0.02 before retry 1, 0.04 before retry 2 (the 2nd attempt also waited its 0.05 timeout)
    assert attempts[1] - attempts[0] >= 0.02 and attempts[2] - attempts[1] >= 0.05 + 0.04

    @tool(timeout_s=0.02)
    async def slow(query: str) -> str:
        """Always too slow."""
        await asyncio.sleep(1)
        return "never"

    st = EpisodeToolState()
    r = run(ToolExecutor(ToolRegistry([slow])).run(ToolCall("slow", {"query": "q"}, ""), st))
    assert not r.ok and r.error == "timeout" and "timed out" in r.text and r.seconds < 0.5
    assert st.errors == {"timeout": 1}

    @tool(retries=1, backoff_s=0)
    async def broken(query: str) -> str:
        """Always raises."""
        raise ValueError("bad index")

    r = run(ToolExecutor(ToolRegistry([broken])).run(ToolCall("broken", {"query": "q"}, ""), EpisodeToolState()))
    assert not r.ok and r.error == "exception" and r.attempts == 2 and "ValueError: bad index" in r.text


def test_concurrency_limit_shared_across_episodes():
    live = {"now": 0, "max": 0}

    @tool(max_concurrency=3)
    async def busy(query: str) -> str:
        """Sleeps a little."""
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        await asyncio.sleep(0.01)
        live["now"] -= 1
        return query

    ex = ToolExecutor(ToolRegistry([busy]))

    async def main():
        states = [EpisodeToolState() for _ in range(4)]
        return await asyncio.gather(
            *(ex.run_many([ToolCall("busy", {"query": f"{i}-{j}"}, "") for j in range(3)], st) for i, st in enumerate(states))
        )

    out = run(main())
    assert [[r.text for r in rs] for rs in out] == [[f"{i}-{j}" for j in range(3)] for i in range(4)]  # call order
    assert live["max"] == 3 and ex.max_in_flight["busy"] == 3


def test_cache_hits_and_lru_eviction():
    calls = []

    @tool(cache_size=2)
    async def look(query: str, k: int = 1) -> str:
        """Cached."""
        calls.append((query, k))
        return f"{query}{k}"

    ex = ToolExecutor(ToolRegistry([look]))
    st = EpisodeToolState()

    def go(args):
        return run(ex.run(ToolCall("look", args, ""), st))

    assert not go({"query": "a"}).cached
    r = go({"query": "a"})
    assert r.cached and r.text == "a1"
    assert go({"k": "1", "query": "a"}).cached  # same args after validation, any order
    go({"query": "b"})
    go({"query": "c"})  # evicts "a" (least recently used)
    assert not go({"query": "a"}).cached
    assert calls == [("a", 1), ("b", 1), ("c", 1), ("a", 1)]


def test_max_calls_per_episode():
    runs = []

    @tool(max_calls=2)
    async def limited(query: str) -> str:
        """Twice per episode."""
        runs.append(query)
        return "fine"

    ex = ToolExecutor(ToolRegistry([limited]))
    a, b = EpisodeToolState(), EpisodeToolState()
    out = [run(ex.run(ToolCall("limited", {"query": str(i)}, ""), a)) for i in range(4)]
    assert [r.ok for r in out] == [True, True, False, False]
    assert out[2].error == "max_calls" and "limit of 2 calls to 'limited'" in out[2].text and "not run" in out[2].text
    assert run(ex.run(ToolCall("limited", {"query": "x"}, ""), b)).ok  # a new episode has its own budget
    assert runs == ["0", "1", "x"] and a.calls["limited"] == 4


def test_a_server_that_cannot_be_reached_is_unavailable_not_the_models_error():
    import socket

    from seekrl.retrieval.retriever import HTTPRetriever
    from seekrl.tools.search import make_search_tool

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    retriever = HTTPRetriever(f"http://127.0.0.1:{port}/retrieve", timeout=2.0)
    search = make_search_tool(retriever, topk=1, policy=ToolPolicy(retries=1, backoff_s=0))
    st = EpisodeToolState()
    r = run(ToolExecutor(ToolRegistry([search])).run(ToolCall("search", {"query": "q"}, ""), st))
    assert not r.ok and r.error == "unavailable" and r.attempts == 2 and "RetrieverUnavailable" in r.text
    assert st.errors == {"unavailable": 1}
    run(retriever.aclose())

    @tool(retries=0)
    async def refused(query: str) -> str:
        """A socket-level failure."""
        raise ConnectionRefusedError("connection refused")

    r = run(ToolExecutor(ToolRegistry([refused])).run(ToolCall("refused", {"query": "q"}, ""), EpisodeToolState()))
    assert r.error == "unavailable"
