"""The `tools:` config section: the call format and the tools an agent may call (the search tool
over a retriever, web search and page reading over an HTTP search API, the tools of MCP servers).
tools/setup.py reads it (`make_tool_executor`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range
from seekrl.tools.web import SEARCH_APIS

__all__ = ["ToolsConfig", "ToolFormat"]

ToolFormat = Literal["search_r1", "dr_tulu", "hermes"]


@dataclass
class ToolsConfig:
    format: ToolFormat | None = None
    """Tool-call format: search_r1 | dr_tulu | hermes; none is single-turn RL without tools."""
    retriever: str | None = None
    """The search tool's backend: an index folder (seekrl index build) or a server URL (http://127.0.0.1:8000/retrieve)."""
    topk: int = 3
    """Passages (or web results) returned per search."""
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
    web_search: Literal["serper", "brave"] | None = None
    """The web_search tool over an HTTP search API: serper (POST, X-API-KEY) | brave (GET, X-Subscription-Token); none: no web search. With tools.format=search_r1 (and no retriever) it is the search tool <search> calls."""
    web_search_url: str | None = None
    """The search API's endpoint; none: the API's public one (https://google.serper.dev/search, https://api.search.brave.com/res/v1/web/search)."""
    web_search_key_env: str | None = None
    """Environment variable holding the search API's key (never the key itself); none: SERPER_API_KEY or BRAVE_API_KEY."""
    fetch_page: bool = True
    """With tools.web_search: also offer fetch_page(url), the main text of a web page (not with search_r1, which calls one tool)."""
    fetch_max_chars: Annotated[int, Range(ge=1)] = 5000
    """fetch_page returns at most this many characters of a page's text (a cut is marked)."""
    fetch_private: bool = False
    """Let fetch_page read loopback, private-network and reserved addresses (off: the model cannot reach the machine's own or internal services)."""
    web_cache: str | None = None
    """Folder of the web tools' disk cache: one JSON file per search or page, keyed by the request; a cached request is not sent again. none: no disk cache."""
    web_offline: bool = False
    """Replay tools.web_cache and never reach the network: a request it lacks is an error observation. Needs no API key."""
    web_rate_limit: Annotated[float, Range(ge=0, hint="0: no limit")] = 1.0
    """Requests per second each web tool sends (cache hits send none); 0: no limit."""

    def web_key_env(self) -> str:
        """The environment variable that holds the search API's key."""
        return self.web_search_key_env or SEARCH_APIS[self.web_search or "serper"].key_env

    def check(self) -> None:
        if self.format is None:
            return
        if not self.retriever and not self.mcp and not self.web_search:
            raise ConfigError("tools.retriever, tools.web_search and tools.mcp are all empty; give an index folder or server URL, "
                              "a search API (serper or brave), or MCP servers")
        if self.retriever and not self.retriever.startswith(("http://", "https://")) and not (Path(self.retriever) / "meta.json").is_file():
            raise ConfigError(f"tools.retriever: '{self.retriever}' is not an index folder (no meta.json); build one with seekrl index build")
        if self.passage_words < 0:
            raise ConfigError(f"tools.passage_words must be 0 (whole passages) or a positive word count, got {self.passage_words}")
        if self.web_search:
            self._check_web()

    def _check_web(self) -> None:
        api = SEARCH_APIS[self.web_search]
        if self.format == "search_r1" and self.retriever:
            raise ConfigError("tools.format=search_r1 calls one tool, search: give tools.retriever or tools.web_search, not both "
                              "(dr_tulu and hermes call several)")
        if not 1 <= self.topk <= api.max_results:
            raise ConfigError(f"tools.topk: the {api.name} API returns 1 to {api.max_results} results per search, got {self.topk}")
        if self.web_search_url and not self.web_search_url.startswith(("http://", "https://")):
            raise ConfigError(f"tools.web_search_url: '{self.web_search_url}' is not an http:// or https:// URL")
        if self.web_offline:
            if not self.web_cache:
                raise ConfigError("tools.web_offline=true replays tools.web_cache, which is not set; name the cache folder of the "
                                  "recorded run")
            if not Path(self.web_cache).is_dir():
                raise ConfigError(f"tools.web_offline=true: the cache folder tools.web_cache='{self.web_cache}' does not exist; "
                                  "name the folder a recorded run wrote")
            return
        env = self.web_key_env()
        if not os.environ.get(env, "").strip():
            raise ConfigError(f"tools.web_search={self.web_search}: the environment variable {env} holding the API key is not set; "
                              f"export it (tools.web_search_key_env names another), or replay a cache with tools.web_offline=true")
