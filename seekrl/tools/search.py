"""The search tool: a Retriever (in-process index or the HTTP server) behind the Tool interface.

Results are formatted as Search-R1 formats them for the model, one passage per line:
`Doc 1(Title: "<title>") <text>`. The retriever is any object with
`async search(queries, topk) -> [[(Document, score), ...]]` (seekrl.retrieval.retriever), so the
same tool serves BM25, dense and remote indices; its errors become observations through the
executor like any tool error.
"""

from __future__ import annotations

from seekrl.tools.base import FunctionTool, ToolPolicy, tool

__all__ = ["make_search_tool", "format_passages"]


def format_passages(hits, words: int = 0) -> str:
    """`Doc i(Title: "t") text` lines, in rank order, as Search-R1's `_passages2string` writes
    them: the title is the first line of `contents` as it is, quotes included. `words` > 0 keeps
    the first `words` words of each text (`...` marks a cut)."""
    lines = []
    for i, (doc, _score) in enumerate(hits):
        title, _, text = doc.contents.partition("\n")
        if words > 0:
            split = text.split()
            text = " ".join(split[:words]) + (" ..." if len(split) > words else "")
        lines.append(f"Doc {i + 1}(Title: {title}) {text}")
    return "\n".join(lines)


def make_search_tool(retriever, topk: int = 3, name: str = "search", policy: ToolPolicy | None = None,
                     passage_words: int = 0) -> FunctionTool:
    """A `search(query)` tool over `retriever` returning the top `topk` passages as text (each cut
    to `passage_words` words when > 0)."""
    if topk < 1:
        raise ValueError(f"search topk must be at least 1, got {topk}")
    if passage_words < 0:
        raise ValueError(f"search passage_words must be 0 (whole passages) or positive, got {passage_words}")

    async def search(query: str) -> str:
        """Search the knowledge base and return the most relevant passages.

        Args:
            query: what to look for, in a few words.
        """
        hits = (await retriever.search([query], topk))[0]
        return format_passages(hits, passage_words) if hits else "No results."

    t = tool(search, name=name, policy=policy or ToolPolicy(timeout_s=30.0, retries=1, cache_size=4096))
    stats = getattr(retriever, "stats", None)  # HTTPRetriever: {"resent": n}
    if isinstance(stats, dict):
        t.counters = lambda: dict(stats)
    return t
