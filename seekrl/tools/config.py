"""The `tools:` config section: the call format and the tools an agent may call (the search tool
over a retriever, the tools of MCP servers). tools/setup.py reads it (`make_tool_executor`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range

__all__ = ["ToolsConfig", "ToolFormat"]

ToolFormat = Literal["search_r1", "dr_tulu", "hermes"]


@dataclass
class ToolsConfig:
    format: ToolFormat | None = None
    """Tool-call format: search_r1 | dr_tulu | hermes; none is single-turn RL without tools."""
    retriever: str | None = None
    """The search tool's backend: an index folder (seekrl index build) or a server URL (http://127.0.0.1:8000/retrieve)."""
    topk: int = 3
    """Passages returned per search."""
    passage_words: int = 0
    """Each returned passage cut to its title and first N words of text (0: whole passages)."""
    token: str | None = None
    """Bearer token for a remote retriever."""
    timeout_s: Annotated[float, Range(gt=0, text="a finite number > 0 (seconds)")] = 30.0
    """Timeout of one tool call, in seconds."""
    max_calls: int | None = None
    """Calls per tool per episode; past it the model is told the limit was reached."""
    mcp: list[str] = field(default_factory=list)
    """MCP servers whose tools the agent may call: streamable-HTTP URLs (http://127.0.0.1:8001/mcp) or stdio command lines."""
    mcp_token: str | None = None
    """Bearer token for the HTTP MCP servers."""

    def check(self) -> None:
        if self.format is None:
            return
        if not self.retriever and not self.mcp:
            raise ConfigError("tools.retriever and tools.mcp are both empty; give an index folder or server URL, or MCP servers")
        if self.retriever and not self.retriever.startswith(("http://", "https://")) and not (Path(self.retriever) / "meta.json").is_file():
            raise ConfigError(f"tools.retriever: '{self.retriever}' is not an index folder (no meta.json); build one with seekrl index build")
        if self.passage_words < 0:
            raise ConfigError(f"tools.passage_words must be 0 (whole passages) or a positive word count, got {self.passage_words}")
