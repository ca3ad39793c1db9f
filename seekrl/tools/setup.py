"""The tools of `tools.*`: the search tool over `tools.retriever` (an index folder, or a
retrieval server's URL) and the tools of the `tools.mcp` servers, in one ToolExecutor."""

from __future__ import annotations

import asyncio

from seekrl.retrieval.retriever import HTTPRetriever, LocalRetriever, load_index
from seekrl.tools.base import ToolPolicy, ToolRegistry
from seekrl.tools.config import ToolsConfig
from seekrl.tools.executor import ToolExecutor
from seekrl.tools.search import make_search_tool

__all__ = ["make_tool_executor"]


def make_tool_executor(tl: ToolsConfig) -> ToolExecutor:
    """The search tool (cached, one retry) and the MCP servers' tools (no retries or cache: a
    remote tool may have side effects); a name offered twice is an error."""
    registry = ToolRegistry()
    if tl.retriever:
        if tl.retriever.startswith(("http://", "https://")):
            retriever = HTTPRetriever(tl.retriever, token=tl.token, timeout=tl.timeout_s)
        else:
            retriever = LocalRetriever(load_index(tl.retriever))
        policy = ToolPolicy(timeout_s=tl.timeout_s, retries=1, cache_size=4096, max_calls=tl.max_calls)
        registry.register(make_search_tool(retriever, tl.topk, policy=policy, passage_words=tl.passage_words))
    if tl.mcp:
        from seekrl.tools.mcp import load_mcp_tools

        policy = ToolPolicy(timeout_s=tl.timeout_s, max_calls=tl.max_calls)
        for server in tl.mcp:
            for t in asyncio.run(load_mcp_tools(server, token=tl.mcp_token, policy=policy, timeout_s=tl.timeout_s)):
                if t.name in registry:
                    raise ValueError(f"tools.mcp: '{server}' offers a tool named '{t.name}' that another source already provides")
                registry.register(t)
    return ToolExecutor(registry)
