"""The web tools (seekrl/tools/web.py, webcache.py): web_search in the Serper and Brave shapes,
fetch_page, the disk cache and offline replay, the rate limit, failures as observations, and the
missing-key error. A local HTTP server on 127.0.0.1 serves recorded answers; nothing here reaches
the internet."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from seekrl.config import load_config
from seekrl.errors import ConfigError
from seekrl.tools import ToolExecutor, ToolRegistry, get_format
from seekrl.tools.base import ToolCall
from seekrl.tools.config import ToolsConfig
from seekrl.tools.executor import EpisodeToolState
from seekrl.tools.setup import make_tool_executor
from seekrl.tools.web import format_results, make_fetch_page_tool, make_web_search_tool, make_web_tools
from seekrl.tools.webcache import RateLimiter, WebCache

KEY = "secret-key-123"

SERPER = {  # recorded answers, by query
    "capital of France": {"searchParameters": {"q": "capital of France"}, "organic": [
        {"title": "Paris - Wikipedia", "link": "https://en.wikipedia.org/wiki/Paris", "snippet": "Paris is the capital of France.",
         "position": 1},
        {"title": "France", "link": "https://en.wikipedia.org/wiki/France", "snippet": "France is a country in Europe.", "position": 2},
    ]},
    "nothing": {"searchParameters": {"q": "nothing"}},
}
BRAVE = {
    "capital of France": {"type": "search", "web": {"type": "search", "results": [
        {"title": "Paris &amp; its history", "url": "https://example.org/paris",
         "description": "<strong>Paris</strong> is the capital of France."},
    ]}},
}
PARIS_HTML = """<html><head><title>Paris</title></head><body>
<nav><a href="/">Home</a> | <a href="/about">About us</a> | <a href="/login">Log in</a></nav>
<article><h1>Paris</h1>
<p>Paris is the capital and most populous city of France, with an estimated population of two million residents.</p>
<p>The city is a major railway, highway and air-transport hub served by two international airports.</p>
</article>
<footer>Copyright 2026 Example Encyclopedia. All rights reserved.</footer>
<script>var tracking = "do not show this";</script>
</body></html>"""


class Recorder(BaseHTTPRequestHandler):
    """Serves the recorded answers and HTML pages; every request is appended to server.log."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes | str, ctype: str = "application/json", headers: dict | None = None):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: bytes = b""):
        url = urlsplit(self.path)
        entry = {"method": self.command, "path": url.path, "query": parse_qs(url.query), "headers": dict(self.headers),
                 "body": body.decode() if body else "", "time": time.monotonic()}
        with self.server.lock:
            self.server.log.append(entry)
        return entry

    def do_POST(self):
        entry = self._record(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if entry["path"] == "/serper/search":
            if self.headers.get("X-API-KEY") != KEY:
                return self._send(401, '{"message": "Unauthorized."}')
            req = json.loads(entry["body"])
            return self._send(200, json.dumps(SERPER.get(req["q"], {"organic": []})))
        if entry["path"] == "/fail500/search":
            return self._send(500, "internal error")
        if entry["path"] == "/limited/search":
            return self._send(429, '{"message": "Too many requests"}')
        if entry["path"] == "/notjson/search":
            return self._send(200, "<html>oops</html>", "text/html")
        self._send(404, "{}")

    def do_GET(self):
        entry = self._record()
        path = entry["path"]
        if path == "/brave/res/v1/web/search":
            if self.headers.get("X-Subscription-Token") != KEY:
                return self._send(401, '{"error": "bad token"}')
            return self._send(200, json.dumps(BRAVE.get(entry["query"]["q"][0], {})))
        if path == "/pages/paris.html":
            return self._send(200, PARIS_HTML, "text/html; charset=utf-8")
        if path == "/pages/notes.txt":
            return self._send(200, "plain notes: " + "x" * 50, "text/plain")
        if path == "/pages/report.pdf":
            return self._send(200, b"%PDF-1.4", "application/pdf")
        if path == "/go":
            return self._send(302, "", "text/plain", {"Location": "/pages/paris.html"})
        if path == "/pages/broken":
            return self._send(503, "down", "text/plain")
        self._send(404, "<html><body>not found</body></html>", "text/html")


class Server:
    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)  # a free port
        self.httpd.log, self.httpd.lock = [], threading.Lock()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def log(self) -> list[dict]:
        with self.httpd.lock:
            return list(self.httpd.log)

    def requests(self, path: str) -> list[dict]:
        return [e for e in self.log if e["path"] == path]


@pytest.fixture
def server():
    s = Server()
    s.thread.start()
    try:
        yield s
    finally:  # runs when the test fails too
        s.httpd.shutdown()
        s.httpd.server_close()
        s.thread.join(timeout=10)


def run(coro):
    return asyncio.run(coro)


def call(executor: ToolExecutor, name: str, **args):
    return run(executor.run(ToolCall(name, args, ""), EpisodeToolState()))


# ------------------------------------------------------------------------------------ search


def test_serper_shape(server, tmp_path):
    t = make_web_search_tool("serper", key=KEY, url=server.url + "/serper/search", num=2)
    text = run(t(query=" capital of France "))
    assert text == ("Doc 1(Title: Paris - Wikipedia) [https://en.wikipedia.org/wiki/Paris] Paris is the capital of France.\n"
                    "Doc 2(Title: France) [https://en.wikipedia.org/wiki/France] France is a country in Europe.")
    (req,) = server.requests("/serper/search")
    assert req["method"] == "POST" and req["headers"]["X-API-KEY"] == KEY
    assert json.loads(req["body"]) == {"q": "capital of France", "num": 2}
    assert run(t(query="nothing")) == "No results."  # the API leaves "organic" out


def test_brave_shape(server):
    t = make_web_search_tool("brave", key=KEY, url=server.url + "/brave/res/v1/web/search", num=3)
    text = run(t(query="capital of France"))
    assert text == "Doc 1(Title: Paris & its history) [https://example.org/paris] Paris is the capital of France."
    (req,) = server.requests("/brave/res/v1/web/search")
    assert req["method"] == "GET" and req["headers"]["X-Subscription-Token"] == KEY
    assert req["query"] == {"q": ["capital of France"], "count": ["3"]}
    assert run(t(query="unknown")) == "No results."


def test_cache_second_call_sends_nothing_and_holds_no_key(server, tmp_path):
    url = server.url + "/serper/search"
    first = run(make_web_search_tool("serper", key=KEY, url=url, cache=WebCache(tmp_path))(query="capital of France"))
    again = make_web_search_tool("serper", key=KEY, url=url, cache=WebCache(tmp_path))  # a new run, the same folder
    assert run(again(query="capital of France")) == first
    assert len(server.requests("/serper/search")) == 1
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1
    entry = json.loads(files[0].read_text())
    assert entry["key"] == {"tool": "web_search", "api": "serper", "query": "capital of France", "num": 3}
    assert KEY not in files[0].read_text() and server.url not in files[0].read_text()
    # a damaged file is a miss, and is written again
    files[0].write_text("{not json")
    assert run(again(query="capital of France")) == first
    assert len(server.requests("/serper/search")) == 2


def test_offline_replay_same_observations_and_a_miss_is_an_error_observation(server, tmp_path):
    live = ToolExecutor(ToolRegistry(make_web_tools("serper", key=KEY, url=server.url + "/serper/search", cache_dir=str(tmp_path),
                                                    rate_limit=0, allow_private=True)))
    recorded = [call(live, "web_search", query="capital of France"),
                call(live, "fetch_page", url=server.url + "/pages/paris.html"),
                call(live, "fetch_page", url=server.url + "/pages/missing")]
    assert [r.ok for r in recorded] == [True, True, False]
    sent = len(server.log)

    replay = ToolExecutor(ToolRegistry(make_web_tools("serper", key=None, cache_dir=str(tmp_path), offline=True)))
    again = [call(replay, "web_search", query="capital of France"),
             call(replay, "fetch_page", url=server.url + "/pages/paris.html"),
             call(replay, "fetch_page", url=server.url + "/pages/missing")]
    assert [r.text for r in again] == [r.text for r in recorded]  # a page's 404 replays too
    miss = call(replay, "web_search", query="capital of Italy")
    assert not miss.ok and miss.error == "exception" and miss.attempts == 1
    assert miss.text.startswith("Error: 'web_search' failed: WebCacheMiss: web_search query 'capital of Italy' is not in the web cache")
    assert len(server.log) == sent  # replay sent nothing
    with pytest.raises(ValueError, match="needs a key"):
        make_web_search_tool("serper", key=None)


def test_rate_limit_spaces_requests(server):
    limiter = RateLimiter(5.0)
    assert [round(limiter.reserve(), 2) for _ in range(3)] == [0.0, 0.2, 0.4]
    assert RateLimiter(0).reserve() == 0.0

    t = make_web_search_tool("serper", key=KEY, url=server.url + "/serper/search", limiter=RateLimiter(5.0))

    async def five() -> float:
        await t(query="warm-up")  # the connection is open before the measured requests
        start = time.monotonic()
        await asyncio.gather(*(t(query=f"q{i}") for i in range(4)))
        return start

    start = run(five())
    times = sorted(e["time"] for e in server.requests("/serper/search"))[1:]
    assert len(times) == 4
    # 5 per second: the k-th request is sent no earlier than its slot, start + 0.2·k. A loaded
    # machine only delays arrivals, so this holds under load; without the limiter all four
    # would arrive within a few milliseconds of start.
    late = [round(a - start, 3) for a in times]
    assert all(a >= 0.2 * k - 0.01 for k, a in enumerate(late)), late


def test_failures_become_counted_observations(server):
    def search_at(path: str, key: str = KEY):
        registry = ToolRegistry(make_web_tools("serper", key=key, url=server.url + path, rate_limit=0, fetch=False))
        return call(ToolExecutor(registry), "web_search", query="capital of France")

    down = search_at("/fail500/search")
    assert (down.ok, down.error, down.attempts) == (False, "unavailable", 2)  # one retry, then the episode is left out
    assert "answered 500" in down.text
    assert search_at("/limited/search").error == "unavailable"
    bad_key = search_at("/serper/search", key="bad-key-987")
    assert bad_key.error == "exception" and "answered 401 (a missing or wrong API key)" in bad_key.text
    assert "bad-key-987" not in bad_key.text
    assert "not JSON" in search_at("/notjson/search").text
    s = Server()  # a port nothing listens on
    s.httpd.server_close()
    refused = ToolExecutor(ToolRegistry(make_web_tools("serper", key=KEY, url=s.url + "/search", rate_limit=0, fetch=False)))
    r = call(refused, "web_search", query="x")
    assert r.error == "unavailable" and "could not be reached" in r.text
    state = EpisodeToolState()
    run(refused.run(ToolCall("web_search", {"query": "x"}, ""), state))
    assert state.errors == {"unavailable": 1}


# ------------------------------------------------------------------------------------ fetch_page


def test_fetch_page_text_cut_redirect_and_errors(server, tmp_path):
    t = make_fetch_page_tool(allow_private=True, cache=WebCache(tmp_path))
    text = run(t(url=server.url + "/pages/paris.html"))
    assert "Paris is the capital and most populous city of France" in text and "airports" in text
    assert "tracking" not in text and "Log in" not in text
    assert run(t(url=server.url + "/go")) == text  # the redirect is followed
    assert run(t(url=server.url + "/pages/paris.html")) == text
    assert len(server.requests("/pages/paris.html")) == 2  # once directly, once through /go; then the cache
    assert run(t(url=server.url + "/pages/notes.txt")).startswith("plain notes: xxx")

    short = make_fetch_page_tool(allow_private=True, max_chars=20, cache=WebCache(tmp_path))
    cut = run(short(url=server.url + "/pages/paris.html"))
    assert cut == text[:20] + f" ... [cut: {len(text) - 20} more characters]"

    ex = ToolExecutor(ToolRegistry([make_fetch_page_tool(allow_private=True)]))
    for path, words in (("/pages/missing", "answered HTTP 404"), ("/pages/report.pdf", "not a web page or text"),
                        ("/pages/broken", "answered HTTP 503")):
        r = call(ex, "fetch_page", url=server.url + path)
        assert not r.ok and r.error == "exception" and words in r.text, r.text
    assert "is not an http:// or https:// URL" in call(ex, "fetch_page", url="file:///etc/passwd").text


def test_fetch_page_refuses_private_addresses(server):
    ex = ToolExecutor(ToolRegistry([make_fetch_page_tool()]))
    for url in (server.url + "/pages/paris.html", "http://localhost:1/x", "http://[::1]:1/", "http://169.254.169.254/latest"):
        r = call(ex, "fetch_page", url=url)
        assert not r.ok and "a loopback, private or reserved address (tools.fetch_private=true allows it)" in r.text, r.text
    assert server.log == []


# ------------------------------------------------------------------------------------ formats, config, setup


def test_call_formats_reach_the_web_tools(server):
    ex = ToolExecutor(ToolRegistry(make_web_tools("serper", key=KEY, url=server.url + "/serper/search", rate_limit=0,
                                                  allow_private=True)))
    turn = (f'<call_tool name="web_search">capital of France</call_tool>'
            f'<call_tool name="fetch_page">{server.url}/pages/paris.html</call_tool>')
    parsed = get_format("dr_tulu").parse(turn)
    assert [c.args for c in parsed.calls] == [{"query": "capital of France"}, {"url": server.url + "/pages/paris.html"}]
    results = run(ex.run_many(parsed.calls, EpisodeToolState()))
    assert all(r.ok for r in results) and "Paris - Wikipedia" in results[0].text and "populous" in results[1].text
    hermes = get_format("hermes").parse('<tool_call>{"name": "web_search", "arguments": {"query": "capital of France"}}</tool_call>')
    assert run(ex.run_many(hermes.calls, EpisodeToolState()))[0].text == results[0].text
    assert format_results([]) == "No results."


def test_setup_builds_the_tools_from_config(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SEARCH_KEY", KEY)
    tl = ToolsConfig(format="dr_tulu", web_search="serper", web_search_url=server.url + "/serper/search",
                     web_search_key_env="MY_SEARCH_KEY", web_cache=str(tmp_path), fetch_max_chars=50)
    ex = make_tool_executor(tl)
    assert ex.registry.names() == ["web_search", "fetch_page"]
    assert "Paris - Wikipedia" in call(ex, "web_search", query="capital of France").text
    r1 = make_tool_executor(ToolsConfig(format="search_r1", web_search="serper", web_search_url=server.url + "/serper/search",
                                        web_search_key_env="MY_SEARCH_KEY", web_cache=str(tmp_path), web_rate_limit=0))
    assert r1.registry.names() == ["search"]  # <search> calls it; fetch_page cannot be called in search_r1
    assert call(r1, "search", query="capital of France").text == call(ex, "web_search", query="capital of France").text
    assert len(server.requests("/serper/search")) == 1  # the second executor read the cache


def _config_error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    return str(e.value)


def test_config_missing_key_and_other_mistakes(tmp_path, monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    monkeypatch.delenv("BRAVE_API_KEY", raising=False)
    base = ["tools.format=dr_tulu"]
    msg = _config_error([*base, "tools.web_search=serper"])
    assert msg == ("tools.web_search=serper: the environment variable SERPER_API_KEY holding the API key is not set; export it "
                   "(tools.web_search_key_env names another), or replay a cache with tools.web_offline=true")
    assert "\n" not in msg
    assert "BRAVE_API_KEY" in _config_error([*base, "tools.web_search=brave"])
    assert "OTHER_KEY" in _config_error([*base, "tools.web_search=brave", "tools.web_search_key_env=OTHER_KEY"])
    # offline replay needs no key, but a cache folder that exists
    cfg = load_config(None, [*base, "tools.web_search=serper", "tools.web_offline=true", f"tools.web_cache={tmp_path}"])
    assert cfg.tools.web_offline and make_tool_executor(cfg.tools).registry.names() == ["web_search", "fetch_page"]
    assert "tools.web_cache, which is not set" in _config_error([*base, "tools.web_search=serper", "tools.web_offline=true"])
    assert "does not exist" in _config_error([*base, "tools.web_search=serper", "tools.web_offline=true",
                                              f"tools.web_cache={tmp_path / 'nope'}"])
    monkeypatch.setenv("BRAVE_API_KEY", KEY)
    assert "returns 1 to 20 results per search, got 50" in _config_error([*base, "tools.web_search=brave", "tools.topk=50"])
    assert "not one of serper, brave" in _config_error([*base, "tools.web_search=bing"])
    assert "web_rate_limit: must be" in _config_error([*base, "tools.web_search=brave", "tools.web_rate_limit=-1"])
    assert "not an http:// or https:// URL" in _config_error([*base, "tools.web_search=brave", "tools.web_search_url=ftp://x"])
    assert "calls one tool" in _config_error(["tools.format=search_r1", "tools.web_search=brave", "tools.retriever=http://x/retrieve"])
    assert load_config(None, [*base, "tools.web_search=brave"]).tools.web_search == "brave"
