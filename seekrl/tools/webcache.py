"""What makes the web tools (tools/web.py) replayable and polite: a disk cache keyed by the
request, and a requests-per-second limit.

    cache = WebCache("runs/web_cache")
    key = {"tool": "web_search", "api": "serper", "query": "capital of France", "num": 3}
    cache.get(key)          # None, or the value saved for exactly this key
    cache.put(key, {"results": [...]})

One JSON file per request, `<folder>/<sha256 of the key>[:2]/<sha256>.json`, holding
`{"key": ..., "value": ...}` (sorted keys, UTF-8): readable, diffable, safe to copy between
machines, and nothing in it is executed (no pickle). A file is written to a temporary name and
renamed, so a reader (another episode, another process) sees a whole file or none. The key
never holds a secret (the tools leave the API key out of it); a file whose stored key differs
from the request's, or that is not valid JSON, is a miss.

`offline=True` is replay: `lookup` raises `WebCacheMiss` for a request the cache does not hold,
and nothing is sent; the tool executor turns that into an error observation ("Error: ...") that
the workflow counts with the other tool errors (`rollout/tool_errors`).

`RateLimiter(rate)` spaces the requests that go out to at most `rate` per second, across every
episode and event loop of the process (a slot is taken under a thread lock, then slept until);
`rate=0` is no limit. Cache hits take no slot.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["WebCache", "WebCacheMiss", "RateLimiter", "cache_key_text"]


class WebCacheMiss(RuntimeError):
    """Offline replay asked for a request the cache does not hold (the message names it)."""


def cache_key_text(key: dict) -> str:
    """The canonical text of a key (sorted keys, no spaces): what the file name hashes."""
    return json.dumps(key, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class WebCache:
    """Request -> response on disk (module docstring). `folder=None` keeps nothing (every lookup
    misses); `offline=True` makes a miss a `WebCacheMiss`."""

    def __init__(self, folder: str | os.PathLike | None, *, offline: bool = False) -> None:
        if offline and folder is None:
            raise ValueError("offline replay needs a cache folder")
        self.folder = Path(folder) if folder is not None else None
        self.offline = offline
        self.hits = 0
        self.misses = 0

    def path(self, key: dict) -> Path | None:
        if self.folder is None:
            return None
        digest = hashlib.sha256(cache_key_text(key).encode("utf-8")).hexdigest()
        return self.folder / digest[:2] / f"{digest}.json"

    def get(self, key: dict):
        """The value saved for `key`, or None."""
        path = self.path(key)
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != json.loads(cache_key_text(key)):
            return None
        return entry.get("value")

    def lookup(self, key: dict, what: str):
        """`get`, counting hits and misses; offline, a miss raises WebCacheMiss naming `what`."""
        value = self.get(key)
        if value is not None:
            self.hits += 1
            return value
        self.misses += 1
        if self.offline:
            raise WebCacheMiss(f"{what} is not in the web cache {self.folder} (offline replay, tools.web_offline=true, "
                               "sends no request)")
        return None

    def put(self, key: dict, value) -> None:
        """Save `value` for `key` (no-op without a folder or when offline)."""
        path = self.path(key)
        if path is None or self.offline:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"key": key, "value": value}, sort_keys=True, ensure_ascii=False, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem[:8], suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class RateLimiter:
    """At most `rate` requests per second (module docstring); `await limiter.wait()` before each."""

    def __init__(self, rate: float) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0 requests per second, got {rate}")
        self.rate = float(rate)
        self._next = 0.0  # time.monotonic() of the next free slot
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take the next slot; the seconds to wait until it."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + 1.0 / self.rate
            return slot - now

    async def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)
