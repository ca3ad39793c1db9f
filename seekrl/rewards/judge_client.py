"""The LLM judge's connection: an OpenAI-compatible `/chat/completions` endpoint, asked with
retries, a concurrency limit and an on-disk cache (rewards/judge.py builds the prompts and reads
the scores).

    client = JudgeClient("http://127.0.0.1:8002/v1", "judge-model", token=None, cache=JudgeCache(folder))
    score = await client.ask([{"role": "user", "content": prompt}], parse)   # parse(reply) -> float

Any server that speaks OpenAI's chat API works: `seekrl serve policy`, vLLM, SGLang, a hosted
API. The request is `{"model", "messages", "temperature", "max_tokens"}` (no `max_tokens` when it
is 0) with the bearer token in `Authorization`; the reply is `choices[0].message.content`.

- **Concurrency:** at most `concurrency` requests in flight (per event loop; waiting out a
  backoff does not hold a slot). The same question asked again while it is in flight waits for
  the first answer instead of sending a second request.
- **Retries:** a refused connection, a timeout, HTTP 429 or 5xx, an answer that is not an OpenAI
  chat completion, and a reply `parse` cannot read (it raises ValueError) are retried up to
  `retries` times, waiting `backoff_s * 2**k` (k = 0, 1, ...; times 1 to 1.25 at random, at
  most 60 s, at least a 429's or 503's `Retry-After`). Still failing: `RewardUnavailable`,
  one line naming the server and the last error (the trajectory is left out, not scored 0).
- **Refusals:** 401 / 403 (token), 404 (URL or model) fail every request alike: they raise
  `EngineRequestError` (one line, the run stops) rather than leave every trajectory out. Any
  other 4xx (a prompt over the judge's context, ...) concerns that request alone:
  `RewardUnavailable` at once, without retries.
- **Cache** (`JudgeCache`): one SQLite file, `judge_cache.sqlite`, in the cache folder. The key
  is a SHA-256 of (model, messages, temperature, max_tokens); the value is the judge's reply
  text, parsed again on every read, so a changed parser or score range needs no new requests.
  Only replies that parsed are stored. A rerun asks the judge nothing it answered before;
  several processes may share one folder (SQLite's locking). No pickle: text in, text out.
  `model` names the judge in the key: two judges on different servers need different
  `reward.judge_model` names (or cache folders).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seekrl.api.http import PerLoop
from seekrl.errors import ConfigError, EngineRequestError, RewardUnavailable
from seekrl.httpclient import async_client

__all__ = ["JudgeClient", "JudgeCache", "CACHE_FILE", "chat_url"]

CACHE_FILE = "judge_cache.sqlite"
MAX_BACKOFF_S = 60.0
_FATAL = {401: "set reward.judge_token_env to the variable holding the judge's token", 403: "the token is not allowed to use this judge",
          404: "check reward.judge_url (the base URL, e.g. http://127.0.0.1:8002/v1) and reward.judge_model"}


def chat_url(url: str) -> str:
    """The chat-completions URL of a base URL (`.../v1`), or the URL itself when it names the endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def _line(text: Any, limit: int = 200) -> str:
    out = " ".join(str(text).split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


class JudgeCache:
    """The judge's answers on disk (module docstring): `get(key)` -> reply text or None, `put`."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder).expanduser() / CACHE_FILE
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None)
            try:  # one write per answer: WAL commits without an fsync each (a file system without WAL keeps the default journal)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.OperationalError:
                pass
            self.db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, model TEXT NOT NULL, prompt TEXT NOT NULL, "
                            "reply TEXT NOT NULL, created REAL NOT NULL)")
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(f"reward.judge_cache: cannot use {self.path} as the judge's cache ({type(e).__name__}: {_line(e)}); "
                              "point reward.judge_cache at a writable folder, or 'off'") from None
        self.lock = threading.Lock()

    @staticmethod
    def key(model: str, messages: list[dict], settings: dict) -> str:
        blob = json.dumps({"model": model, "messages": messages, **settings}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        with self.lock:
            row = self.db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, model: str, messages: list[dict], reply: str) -> None:
        prompt = json.dumps(messages, ensure_ascii=False)
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO replies (key, model, prompt, reply, created) VALUES (?, ?, ?, ?, ?)",
                            (key, model, prompt, reply, time.time()))

    def __len__(self) -> int:
        with self.lock:
            return int(self.db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def close(self) -> None:
        with self.lock:
            self.db.close()


class _LoopState:
    """What belongs to one event loop: the HTTP client, the concurrency limit, questions in flight."""

    def __init__(self, client, concurrency: int):
        self.client = client
        self.sem = asyncio.Semaphore(concurrency)
        self.inflight: dict[str, asyncio.Future] = {}


class JudgeClient:
    """Asks an OpenAI-compatible chat endpoint for replies and parses them (module docstring)."""

    def __init__(self, url: str, model: str = "default", *, token: str | None = None, concurrency: int = 16, retries: int = 3,
                 backoff_s: float = 1.0, timeout_s: float = 60.0, max_tokens: int = 512, temperature: float = 0.0,
                 cache: JudgeCache | None = None):
        if concurrency < 1 or retries < 0 or backoff_s < 0 or timeout_s <= 0 or max_tokens < 0 or temperature < 0:
            raise ValueError("JudgeClient needs concurrency >= 1, retries >= 0, backoff_s >= 0, timeout_s > 0, max_tokens >= 0, temperature >= 0")
        self.url, self.model, self.token = chat_url(url), model, token
        self.concurrency, self.retries, self.backoff_s, self.timeout_s = concurrency, retries, backoff_s, timeout_s
        self.max_tokens, self.temperature, self.cache = max_tokens, temperature, cache
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0, "unavailable": 0, "in_flight_max": 0}
        self._in_flight = 0
        self._states: PerLoop[_LoopState] = PerLoop(self._new_state, client_of=lambda state: state.client)
        self._warned = False

    def _settings(self) -> dict:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens}

    def _new_state(self) -> _LoopState:
        client = async_client(token=self.token, timeout_s=self.timeout_s, max_connections=self.concurrency)
        return _LoopState(client, self.concurrency)

    async def ask(self, messages: list[dict], parse: Callable[[str], float]) -> float:
        """`parse(reply)` of the judge's reply to `messages`: from the cache, or from the server
        (module docstring). Raises RewardUnavailable, or EngineRequestError on 401/403/404."""
        key = JudgeCache.key(self.model, messages, self._settings())
        if self.cache is not None:
            reply = self.cache.get(key)
            if reply is not None:
                try:
                    score = parse(reply)
                except ValueError:
                    pass  # stored under another parser: ask again
                else:
                    self.stats["cache_hits"] += 1
                    return score
        state = self._states.get()
        task = state.inflight.get(key)
        if task is None:  # not on its way yet: one request for everyone who asks meanwhile
            task = state.inflight[key] = asyncio.get_running_loop().create_task(self._ask_server(state, key, messages, parse))
            task.add_done_callback(lambda t: (state.inflight.pop(key, None), t.cancelled() or t.exception()))
        _, score = await asyncio.shield(task)  # a caller cancelled leaves the answer to the others (and the cache)
        return score

    async def _ask_server(self, state: _LoopState, key: str, messages: list[dict], parse: Callable[[str], float]) -> tuple[str, float]:
        import httpx

        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        last, wait_at_least = "no attempt", 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
                await asyncio.sleep(max(delay, min(wait_at_least, MAX_BACKOFF_S)))
            wait_at_least = 0.0
            async with state.sem:
                self._in_flight += 1
                self.stats["in_flight_max"] = max(self.stats["in_flight_max"], self._in_flight)
                self.stats["requests"] += 1
                try:
                    r = await state.client.post(self.url, json=body)
                except httpx.HTTPError as e:  # refused, reset, timed out
                    last = f"{type(e).__name__}: {_line(e, 160) or 'no answer'}"
                    continue
                finally:
                    self._in_flight -= 1
            if r.status_code in _FATAL:
                raise EngineRequestError(f"the judge at {self.url} refused the request: HTTP {r.status_code}: {_line(r.text, 160)}; "
                                         f"{_FATAL[r.status_code]}")
            if r.status_code == 429 or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {_line(r.text, 160)}"
                wait_at_least = _retry_after(r.headers.get("retry-after"))
                continue
            if r.status_code != 200:  # this request's own problem (too long, ...): asking again will not help
                self._unavailable(f"HTTP {r.status_code}: {_line(r.text, 160)}")
            try:
                reply = _content(r.json())
            except ValueError as e:
                last = f"not an OpenAI chat completion: {_line(e, 160)}"
                continue
            try:
                score = parse(reply)
            except ValueError as e:
                last = f"unreadable score: {_line(e, 200)}"
                continue
            if self.cache is not None:
                self.cache.put(key, self.model, messages, reply)
            return reply, score
        self._unavailable(f"{self.retries + 1} attempts; last: {last}")

    def _unavailable(self, why: str):
        self.stats["unavailable"] += 1
        message = f"the judge at {self.url} could not score: {why}"
        if not self._warned:
            self._warned = True
            print(f"seekrl: warning: {message}; such trajectories are left out of the update (rollout/excluded/reward_unavailable)",
                  file=sys.stderr, flush=True)
        raise RewardUnavailable(message)

    async def aclose(self) -> None:
        await self._states.aclose()

    def close(self) -> None:
        """Close the cache; the HTTP client's connections end with their event loop."""
        self._states.forget()
        if self.cache is not None:
            self.cache.close()


def _retry_after(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0  # an HTTP date: keep the backoff


def _content(body: Any) -> str:
    """`choices[0].message.content` of a chat completion, or ValueError."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"no choices[0].message.content in {_line(json.dumps(body), 120)}") from None
    if not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is {type(content).__name__}, not text")
    return content
