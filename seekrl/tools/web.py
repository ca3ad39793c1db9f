"""Web search and page reading as tools, replayable offline: `web_search(query)` over an HTTP
search API and `fetch_page(url)`, the readable text of a page.

    tools = make_web_tools("serper", key=os.environ["SERPER_API_KEY"], cache_dir="runs/web_cache")
    executor = ToolExecutor(ToolRegistry(tools))       # the model calls web_search / fetch_page

The config builds them from `tools.web_search` and the `tools.web_*` / `tools.fetch_*` keys
(tools/setup.py); they are plain `FunctionTool`s, so every call format reaches them
(`<call_tool name="web_search">query</call_tool>`, JSON tool calls; with search_r1 the search
is the `search` tool that `<search>` calls).

Search APIs (`SEARCH_APIS`), the two common shapes:
- `serper`: `POST https://google.serper.dev/search`, header `X-API-KEY`, JSON `{"q", "num"}`
  -> `{"organic": [{"title", "link", "snippet"}, ...]}`;
- `brave`: `GET https://api.search.brave.com/res/v1/web/search?q=...&count=N`, header
  `X-Subscription-Token` -> `{"web": {"results": [{"title", "url", "description"}, ...]}}`.
`url=` points either at another endpoint of the same shape (a proxy, a test server). The results
reach the model one per line, `Doc i(Title: <title>) [<url>] <snippet>` (HTML tags and entities
of the API's text removed), or "No results.".

`fetch_page(url)` GETs an http(s) URL (redirects followed, at most 5, each checked), reads at
most 5 MB and returns its main text, extracted by trafilatura (navigation, scripts, boilerplate
left out; its plain html2txt when the extractor finds no main text; text/plain as it is), cut
to `max_chars` with a marker. It refuses loopback, private and reserved addresses (the host is
resolved first) unless `allow_private`: the model chooses the URL, so it must not reach the
machine's own services.

The cache (tools/webcache.py): each search is saved under `{"tool", "api", "query", "num"}`
(normalised results, not the key or the endpoint), each page under `{"tool", "url"}` (its
extracted text before the cut, or the page's own failure: an HTTP 4xx, a type that is not
text), so a replay from the same folder sees the same observations. A cached request sends
nothing and takes no rate-limit slot; `offline` sends nothing at all and a request the cache
lacks is a `WebCacheMiss`.

Failures, all raised for the executor (tools/executor.py) to turn into error observations and
count (`rollout/tool_errors`): a search API that cannot be reached, times out, answers 429 or
5xx is `WebUnavailable` (a `ServiceUnavailable`: `error="unavailable"`, the episode is left out
of the update, as for the retriever); any other refusal (401 bad key, 400) or unreadable answer
is `WebSearchError`; a page that cannot be read is `FetchError` (the model's choice of URL, not
the infrastructure's: an ordinary tool error).
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urljoin, urlsplit

from seekrl.api.http import PerLoop
from seekrl.errors import ServiceUnavailable
from seekrl.tools.base import FunctionTool, ToolPolicy, tool
from seekrl.tools.webcache import RateLimiter, WebCache

__all__ = ["SEARCH_APIS", "SearchApi", "WebResult", "WebUnavailable", "WebSearchError", "FetchError", "PageError",
           "make_web_search_tool", "make_fetch_page_tool", "make_web_tools", "format_results", "page_text", "MAX_PAGE_BYTES"]

MAX_PAGE_BYTES = 5_000_000  # fetch_page reads at most this much of a page
MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; seekrl web tools)"


class WebUnavailable(ServiceUnavailable):
    """The search API could not be reached, timed out, or answered 429 / 5xx."""


class WebSearchError(RuntimeError):
    """The search API refused the request (4xx other than 429) or answered something unreadable."""


class FetchError(RuntimeError):
    """A page could not be read (network, 5xx, a refused address, a bad URL); not cached."""


class PageError(FetchError):
    """The page's own answer (an HTTP 4xx, a type that is not text): cached, so a replay sees it too."""


@dataclass(frozen=True)
class WebResult:
    title: str
    url: str
    snippet: str


_TAG = re.compile(r"<[^>]+>")


def _clean(text) -> str:
    """API text as plain text: HTML tags (Brave's <strong>) and entities removed, whitespace collapsed."""
    return " ".join(html.unescape(_TAG.sub("", str(text or ""))).split())


def _items(body, path: tuple[str, ...], api: str) -> list:
    if not isinstance(body, dict):
        raise WebSearchError(f"the {api} API answered {type(body).__name__} JSON, not an object")
    node = body
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:  # no results: the APIs leave the field out
            return []
    if not isinstance(node, list):
        raise WebSearchError(f"the {api} API's {'.'.join(path)} is a {type(node).__name__}, not a list")
    return [x for x in node if isinstance(x, dict)]


@dataclass(frozen=True)
class SearchApi:
    """One API shape: its public endpoint, the variable that holds its key by default, the most
    results one request may ask for, how a request is built and how results are read."""

    name: str
    url: str
    key_env: str
    max_results: int
    request: Callable[[str, str, str, int], dict]  # (endpoint, key, query, num) -> httpx request kwargs
    results: Callable[[object], list[WebResult]]  # the JSON body -> results


def _serper_request(url: str, key: str, query: str, num: int) -> dict:
    return {"method": "POST", "url": url, "headers": {"X-API-KEY": key, "Content-Type": "application/json"},
            "json": {"q": query, "num": num}}


def _serper_results(body) -> list[WebResult]:
    return [WebResult(_clean(x.get("title")), str(x.get("link") or ""), _clean(x.get("snippet")))
            for x in _items(body, ("organic",), "serper")]


def _brave_request(url: str, key: str, query: str, num: int) -> dict:
    return {"method": "GET", "url": url, "headers": {"X-Subscription-Token": key, "Accept": "application/json"},
            "params": {"q": query, "count": num}}


def _brave_results(body) -> list[WebResult]:
    return [WebResult(_clean(x.get("title")), str(x.get("url") or ""), _clean(x.get("description")))
            for x in _items(body, ("web", "results"), "brave")]


SEARCH_APIS: dict[str, SearchApi] = {
    "serper": SearchApi("serper", "https://google.serper.dev/search", "SERPER_API_KEY", 100, _serper_request, _serper_results),
    "brave": SearchApi("brave", "https://api.search.brave.com/res/v1/web/search", "BRAVE_API_KEY", 20, _brave_request,
                       _brave_results),
}


def format_results(results: list[WebResult]) -> str:
    """`Doc i(Title: t) [url] snippet` lines in rank order, or "No results."."""
    if not results:
        return "No results."
    return "\n".join(f"Doc {i + 1}(Title: {r.title}) [{r.url}] {r.snippet}".rstrip() for i, r in enumerate(results))


def _http(timeout_s: float) -> PerLoop:
    """An httpx.AsyncClient per event loop (connection pooling), made on first use."""

    def make():
        import httpx

        return httpx.AsyncClient(timeout=timeout_s, headers={"User-Agent": USER_AGENT})

    return PerLoop(make)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------ web_search


def make_web_search_tool(api: str, *, key: str | None, url: str | None = None, num: int = 3, cache: WebCache | None = None,
                         limiter: RateLimiter | None = None, timeout_s: float = 30.0, name: str = "web_search",
                         policy: ToolPolicy | None = None) -> FunctionTool:
    """A `web_search(query)` tool over the API `api` (a key of SEARCH_APIS) at `url` (default: its
    public endpoint), `num` results per search; `key` may be None only for an offline cache."""
    if api not in SEARCH_APIS:
        raise ValueError(f"unknown search API {api!r}; known: {', '.join(SEARCH_APIS)}")
    spec = SEARCH_APIS[api]
    cache = cache or WebCache(None)
    if not key and not cache.offline:
        raise ValueError(f"the {api} search API needs a key (${spec.key_env}), unless it replays a cache offline")
    if not 1 <= num <= spec.max_results:
        raise ValueError(f"the {api} API returns 1 to {spec.max_results} results per search, not {num}")
    endpoint = url or spec.url
    limiter = limiter or RateLimiter(0)
    http = _http(timeout_s)

    async def request(query: str) -> list[WebResult]:
        import httpx

        await limiter.wait()
        try:
            resp = await http.get().request(**spec.request(endpoint, key or "", query, num))
        except httpx.TransportError as e:  # refused, DNS, timeout
            raise WebUnavailable(f"search API {endpoint} could not be reached: {type(e).__name__}: {_short(str(e))}") from e
        status = resp.status_code
        if status == 429 or status >= 500:
            raise WebUnavailable(f"search API {endpoint} answered {status}: {_short(resp.text)}")
        if status != 200:
            hint = " (a missing or wrong API key)" if status in (401, 403) else ""
            raise WebSearchError(f"search API {endpoint} answered {status}{hint}: {_short(resp.text)}")
        try:
            body = resp.json()
        except ValueError:
            raise WebSearchError(f"search API {endpoint} answered something that is not JSON: {_short(resp.text)}") from None
        return spec.results(body)[:num]

    async def web_search(query: str) -> str:
        """Search the web and return the top results: the title, URL and snippet of each.

        Args:
            query: what to look for, in a few words.
        """
        q = query.strip()
        if not q:
            raise ValueError("the query is empty")
        ck = {"tool": "web_search", "api": api, "query": q, "num": num}
        value = cache.lookup(ck, f"web_search query {q!r}")
        if value is None:
            value = {"results": [asdict(r) for r in await request(q)]}
            cache.put(ck, value)
        return format_results([WebResult(**r) for r in value["results"]])

    return tool(web_search, name=name, policy=policy or ToolPolicy(timeout_s=timeout_s, retries=1, cache_size=4096))


# ------------------------------------------------------------------------------------ fetch_page


def page_text(body: bytes, kind: str, charset: str | None = None) -> str:
    """The readable text of a page: `kind` "text" decoded as it is, "html" through trafilatura
    (module docstring); `charset` is the one the server declared, if any."""
    if kind == "text":
        return body.decode(charset or "utf-8", errors="replace").strip()
    import trafilatura

    doc: bytes | str = body
    if charset:
        try:
            doc = body.decode(charset, errors="replace")
        except LookupError:  # a charset Python does not know: let trafilatura guess
            pass
    text = trafilatura.extract(doc, favor_recall=True, include_comments=False, include_tables=True)
    if not text:
        text = trafilatura.html2txt(doc)
    return (text or "").strip()


def _page_kind(content_type: str) -> str | None:
    ctype = content_type.split(";")[0].strip().lower()
    if ctype in ("", "text/html", "application/xhtml+xml"):
        return "html"
    if ctype.startswith("text/") or ctype in ("application/json", "application/xml"):
        return "text"
    return None


def _checked_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"{url!r} is not an http:// or https:// URL")
    return url


async def _check_host(url: str, allow_private: bool) -> None:
    """Refuse a host that is (or resolves to) a loopback, private, link-local or reserved address."""
    if allow_private:
        return
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        addrs = [ipaddress.ip_address(host)]
    except ValueError:
        if host == "localhost" or host.endswith(".localhost"):
            addrs = [ipaddress.ip_address("127.0.0.1")]
        else:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as e:
                raise FetchError(f"cannot resolve {host}: {e.strerror}") from None
            addrs = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    for a in addrs:
        mapped = getattr(a, "ipv4_mapped", None)
        if not (mapped or a).is_global:
            raise FetchError(f"fetch_page does not read {host} ({a}): a loopback, private or reserved address "
                             "(tools.fetch_private=true allows it)")


def make_fetch_page_tool(*, max_chars: int = 5000, cache: WebCache | None = None, limiter: RateLimiter | None = None,
                         timeout_s: float = 30.0, allow_private: bool = False, name: str = "fetch_page",
                         policy: ToolPolicy | None = None) -> FunctionTool:
    """A `fetch_page(url)` tool: the readable text of the page, at most `max_chars` characters."""
    if max_chars < 1:
        raise ValueError(f"fetch_page max_chars must be at least 1, got {max_chars}")
    cache = cache or WebCache(None)
    limiter = limiter or RateLimiter(0)
    http = _http(timeout_s)

    async def read(url: str) -> str:
        import httpx

        for _ in range(MAX_REDIRECTS + 1):
            await _check_host(url, allow_private)
            await limiter.wait()
            try:
                async with http.get().stream("GET", url) as resp:
                    status = resp.status_code
                    if resp.is_redirect and "location" in resp.headers:
                        url = _checked_url(urljoin(url, resp.headers["location"]))
                        continue
                    if status in (408, 429) or status >= 500:
                        raise FetchError(f"{url} answered HTTP {status} {resp.reason_phrase}".rstrip())
                    if status >= 400:
                        raise PageError(f"{url} answered HTTP {status} {resp.reason_phrase}".rstrip())
                    ctype = resp.headers.get("content-type", "")
                    kind = _page_kind(ctype)
                    if kind is None:
                        raise PageError(f"{url} is not a web page or text (content-type {ctype.split(';')[0]})")
                    body = bytearray()
                    async for chunk in resp.aiter_bytes():
                        body += chunk
                        if len(body) >= MAX_PAGE_BYTES:
                            break
                    charset = resp.charset_encoding
            except httpx.TransportError as e:  # refused, DNS, timeout, a broken transfer
                raise FetchError(f"cannot read {url}: {type(e).__name__}: {_short(str(e))}") from e
            return await asyncio.to_thread(page_text, bytes(body[:MAX_PAGE_BYTES]), kind, charset)
        raise PageError(f"{url}: more than {MAX_REDIRECTS} redirects")

    async def fetch_page(url: str) -> str:
        """Read a web page and return its main text (menus, ads and scripts left out), cut to a maximum length.

        Args:
            url: the page's address, http:// or https:// (e.g. a URL from web_search).
        """
        u = _checked_url(url.strip())
        ck = {"tool": "fetch_page", "url": u}
        value = cache.lookup(ck, f"page {u}")
        if value is None:
            try:
                value = {"text": await read(u)}
            except PageError as e:
                value = {"error": str(e)}
            cache.put(ck, value)
        if "error" in value:
            raise PageError(value["error"])
        text = value["text"] or "(the page has no readable text)"
        if len(text) > max_chars:
            text = f"{text[:max_chars]} ... [cut: {len(text) - max_chars} more characters]"
        return text

    return tool(fetch_page, name=name, policy=policy or ToolPolicy(timeout_s=timeout_s, cache_size=4096))


def make_web_tools(api: str, *, key: str | None, url: str | None = None, num: int = 3, cache_dir: str | None = None,
                   offline: bool = False, rate_limit: float = 1.0, timeout_s: float = 30.0, max_chars: int = 5000,
                   fetch: bool = True, allow_private: bool = False, max_calls: int | None = None,
                   search_name: str = "web_search") -> list[FunctionTool]:
    """web_search (named `search_name`) and, with `fetch`, fetch_page, sharing one cache folder
    (`cache_dir`; `offline` replays it); each tool sends at most `rate_limit` requests per second.
    Search retries once (not offline: a miss stays a miss); both keep an in-memory LRU too."""
    cache = WebCache(cache_dir, offline=offline)
    retries = 0 if offline else 1
    tools = [make_web_search_tool(
        api, key=key, url=url, num=num, cache=cache, limiter=RateLimiter(rate_limit), timeout_s=timeout_s, name=search_name,
        policy=ToolPolicy(timeout_s=timeout_s, retries=retries, cache_size=4096, max_calls=max_calls))]
    if fetch:
        tools.append(make_fetch_page_tool(
            max_chars=max_chars, cache=cache, limiter=RateLimiter(rate_limit), timeout_s=timeout_s, allow_private=allow_private,
            policy=ToolPolicy(timeout_s=timeout_s, cache_size=4096, max_calls=max_calls)))
    return tools
