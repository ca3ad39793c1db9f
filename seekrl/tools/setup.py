"""The tools of `tools.*`: the search tool over `tools.retriever` (an index folder, or a
retrieval server's URL), web_search and fetch_page over the API `tools.web_search` names
(tools/web.py; with search_r1 and no retriever, web search is the `search` tool), and the tools
of the `tools.mcp` servers, in one ToolExecutor."""

from __future__ import annotations

import asyncio
import importlib.util
import os

from seekrl.errors import ConfigError
from seekrl.retrieval.retriever import HTTPRetriever, LocalRetriever, load_index
from seekrl.tools.base import ToolPolicy, ToolRegistry
from seekrl.tools.config import ToolsConfig
from seekrl.tools.executor import ToolExecutor
from seekrl.tools.search import make_search_tool

__all__ = ["make_tool_executor", "web_tools"]


def make_tool_executor(tl: ToolsConfig) -> ToolExecutor:
    """The search tool (cached, one retry), the web tools (`web_tools`) and the MCP servers' tools
    (no retries or cache: a remote tool may have side effects); a name offered twice is an error."""
    registry = ToolRegistry()
    if tl.retriever:
        if tl.retriever.startswith(("http://", "https://")):
            retriever = HTTPRetriever(tl.retriever, token=tl.token, timeout=tl.timeout_s)
        else:
            retriever = LocalRetriever(load_index(tl.retriever))
        policy = ToolPolicy(timeout_s=tl.timeout_s, retries=1, cache_size=4096, max_calls=tl.max_calls)
        registry.register(make_search_tool(retriever, tl.topk, policy=policy, passage_words=tl.passage_words))
    if tl.web_search:
        for t in web_tools(tl):
            registry.register(t)
    if tl.mcp:
        from seekrl.tools.mcp import load_mcp_tools

        policy = ToolPolicy(timeout_s=tl.timeout_s, max_calls=tl.max_calls)
        for server in tl.mcp:
            for t in asyncio.run(load_mcp_tools(server, token=tl.mcp_token, policy=policy, timeout_s=tl.timeout_s)):
                if t.name in registry:
                    raise ValueError(f"tools.mcp: '{server}' offers a tool named '{t.name}' that another source already provides")
                registry.register(t)
    return ToolExecutor(registry)


def web_tools(tl: ToolsConfig) -> list:
    """web_search (and fetch_page) as `tools.web_*` say; the API key from the environment
    (`tools.web_search_key_env`), not needed offline. A missing key is a one-line ConfigError."""
    from seekrl.tools.web import make_web_tools

    fetch = tl.fetch_page and tl.format != "search_r1"
    needed = {"httpx": "tools.web_search", **({"trafilatura": "tools.fetch_page"} if fetch else {})}
    for module, what in needed.items():
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"{what} needs the {module} package: pip install 'seekrl[search]'")
    key = None
    if not tl.web_offline:
        key = os.environ.get(tl.web_key_env(), "").strip()
        if not key:
            raise ConfigError(f"tools.web_search={tl.web_search}: the environment variable {tl.web_key_env()} holding the API key "
                              "is not set; export it, or replay a cache with tools.web_offline=true")
    return make_web_tools(tl.web_search, key=key, url=tl.web_search_url, num=tl.topk, cache_dir=tl.web_cache,
                          offline=tl.web_offline, rate_limit=tl.web_rate_limit, timeout_s=tl.timeout_s,
                          max_chars=tl.fetch_max_chars, fetch=fetch, allow_private=tl.fetch_private,
                          max_calls=tl.max_calls, search_name="search" if tl.format == "search_r1" else "web_search")
