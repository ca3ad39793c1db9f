"""seekrl's HTTP servers, in one place, sharing one set of guards (seekrl/api/guards.py).

    policy.py     OpenAI-compatible chat / completions API over a policy   (seekrl serve policy)
    retrieval.py  Search-R1's /retrieve API over a BM25 / dense index      (seekrl serve retriever)
    mcp.py        the same index as an MCP `search` tool (fastmcp)         (seekrl serve mcp)
    engine.py     SGLang's native RL API over a LocalEngine                (seekrl serve engine)
    guards.py     (seekrl/api/guards.py) bearer token, bounded JSON bodies, counters, disconnects: what they all share

Nothing is imported here, so `import seekrl.servers.guards` stays free of fastapi / torch.
"""
