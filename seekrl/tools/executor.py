"""ToolExecutor: runs the model's tool calls under each tool's `ToolPolicy`, and never raises.

A failing tool is part of the environment, not a bug in the run (DESIGN.md, Habit 9): an unknown
tool, bad arguments, an exception, a timeout or a spent call budget all become a `ToolResult`
with `ok=False` and text for the model ("Error: ..."), and the workflow counts them. A server that
cannot be reached (`seekrl.errors.ServiceUnavailable`, `ConnectionError`) after the retries is
`error="unavailable"`: an infrastructure failure, whose episode the workflow marks and the
trainer leaves out (Trajectory.status).

- arguments are checked against the tool's JSON schema (missing, unknown, wrong type). A string
  that parses exactly as the integer / number / boolean the schema asks for is converted (the
  DR Tulu format writes every argument as an XML attribute string); anything else is an error.
- each attempt runs under `asyncio.wait_for(timeout_s)`; after an exception or a timeout it is
  retried up to `retries` times, sleeping `backoff_s * 2**k` before retry k (outside the
  concurrency slot).
- one `asyncio.Semaphore(max_concurrency)` per tool, shared by every episode that uses this
  executor: it bounds the load on a retriever or an API, not the number of episodes.
- an LRU cache of successful results keyed by (name, sorted args, defaults filled in) when
  `cache_size > 0`; a cache hit takes no concurrency slot.
- `max_calls` counts calls per tool per episode (`EpisodeToolState`); past it the tool is not
  run and the model is told the limit was reached.

`run_many(calls, state)` runs the calls of one turn concurrently; results come in call order.
Cancellation (`asyncio.CancelledError`) is not an error and propagates.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from seekrl.errors import ServiceUnavailable
from seekrl.tools.base import ToolCall, ToolRegistry, ToolResult

__all__ = ["ToolExecutor", "EpisodeToolState", "validate_args"]


@dataclass
class EpisodeToolState:
    """Per-episode counters: calls per tool (attempted, including refused ones) and failures."""

    calls: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)  # by error kind


_PY_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _coerce(value, types: list[str]):
    """`value` converted to one of the JSON `types`, or raise ValueError."""
    for t in types:
        ok = _PY_TYPES.get(t)
        if ok is None:
            continue
        if isinstance(value, bool) and t in ("integer", "number"):
            continue  # True is an int in Python, not in JSON
        if isinstance(value, ok):
            return value
    if isinstance(value, str):
        s = value.strip()
        for t in types:
            try:
                if t == "integer":
                    return int(s)
                if t == "number":
                    return float(s)
            except ValueError:
                pass
            if t == "boolean" and s.lower() in ("true", "false"):
                return s.lower() == "true"
    raise ValueError(f"expected {' or '.join(types)}, got {type(value).__name__} {value!r}")


def validate_args(args: dict, schema: dict) -> dict:
    """`args` checked (and string-coerced, see module docstring) against `schema`; ValueError names the problem."""
    if not isinstance(args, dict):
        raise ValueError(f"arguments must be an object, got {type(args).__name__}")
    props: dict = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        raise ValueError(f"missing argument(s): {', '.join(missing)}")
    unknown = [k for k in args if k not in props]
    if unknown:
        raise ValueError(f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(props) or 'none'}")
    out = {}
    for k, v in args.items():
        p = props[k]
        types = p.get("type")
        if types is None:
            out[k] = v
            continue
        types = [types] if isinstance(types, str) else list(types)
        try:
            v = _coerce(v, types)
            if "array" in types and isinstance(v, (list, tuple)) and "items" in p and "type" in p["items"]:
                it = p["items"]["type"]
                v = [_coerce(x, [it] if isinstance(it, str) else list(it)) for x in v]
        except ValueError as e:
            raise ValueError(f"argument '{k}': {e}") from None
        out[k] = v
    return out


class ToolExecutor:
    """Runs `ToolCall`s against a `ToolRegistry`; see module docstring. Shared by all episodes."""

    def __init__(self, registry: ToolRegistry):
        self.registry = registry
        self._caches: dict[str, OrderedDict] = {}
        self._sems: dict[str, asyncio.Semaphore] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight: Counter = Counter()  # calls running now, per tool (for tests and logs)
        self.max_in_flight: Counter = Counter()

    def _sem(self, name: str, limit: int) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a semaphore belongs to one event loop
            self._loop, self._sems = loop, {}
        sem = self._sems.get(name)
        if sem is None:
            sem = self._sems[name] = asyncio.Semaphore(max(1, limit))
        return sem

    def metrics(self) -> dict[str, float]:
        """The tools' run-level counters (`FunctionTool.counters`), as `tools/<name>/<counter>`:
        e.g. `tools/search/resent`, the retrieval requests sent again after a dropped connection."""
        out: dict[str, float] = {}
        for name in self.registry.names():
            counters = getattr(self.registry.get(name), "counters", None)
            if counters is not None:
                out.update({f"tools/{name}/{k}": float(v) for k, v in counters().items()})
        return out

    async def run_many(self, calls: list[ToolCall], state: EpisodeToolState) -> list[ToolResult]:
        return list(await asyncio.gather(*(self.run(c, state) for c in calls)))

    async def run(self, call: ToolCall, state: EpisodeToolState) -> ToolResult:
        t0 = time.perf_counter()
        try:
            res = await self._run(call, state)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in our own checks must not crash the episode either
            res = ToolResult(call.name, f"Error: {type(e).__name__}: {e}", ok=False, error="exception")
        res.seconds = time.perf_counter() - t0
        if not res.ok:
            state.errors[res.error or "exception"] += 1
        return res

    async def _run(self, call: ToolCall, state: EpisodeToolState) -> ToolResult:
        t = self.registry.get(call.name)
        if t is None:
            known = ", ".join(self.registry.names()) or "none"
            return ToolResult(call.name, f"Error: unknown tool '{call.name}'. Available tools: {known}.", False, "unknown_tool")
        pol = t.policy
        state.calls[call.name] += 1
        if pol.max_calls is not None and state.calls[call.name] > pol.max_calls:
            return ToolResult(
                call.name,
                f"Error: the limit of {pol.max_calls} calls to '{call.name}' in this episode was reached; "
                "the tool was not run. Answer with what you have.",
                False,
                "max_calls",
            )
        try:
            args = validate_args(call.args, t.parameters)
        except ValueError as e:
            return ToolResult(call.name, f"Error: bad arguments for '{call.name}': {e}", False, "bad_args")

        cache = None
        if pol.cache_size > 0:
            cache = self._caches.setdefault(call.name, OrderedDict())
            defaults = {k: p["default"] for k, p in t.parameters.get("properties", {}).items() if "default" in p}
            key = json.dumps({**defaults, **args}, sort_keys=True, default=str)  # omitted = default
            if key in cache:
                cache.move_to_end(key)
                return ToolResult(call.name, cache[key], True, None, cached=True)

        sem = self._sem(call.name, pol.max_concurrency)
        error, kind = "", "exception"
        for attempt in range(pol.retries + 1):
            if attempt:
                await asyncio.sleep(pol.backoff_s * 2 ** (attempt - 1))
            async with sem:
                self.in_flight[call.name] += 1
                self.max_in_flight[call.name] = max(self.max_in_flight[call.name], self.in_flight[call.name])
                try:
                    text = await asyncio.wait_for(t(**args), timeout=pol.timeout_s)
                    text = text if isinstance(text, str) else str(text)
                except asyncio.TimeoutError:
                    error, kind = f"'{call.name}' timed out after {pol.timeout_s:g} s", "timeout"
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a server that cannot be reached is the infrastructure's failure, not the model's
                    kind = "unavailable" if isinstance(e, (ServiceUnavailable, ConnectionError)) else "exception"
                    error = f"'{call.name}' failed: {type(e).__name__}: {e}"
                    continue
                finally:
                    self.in_flight[call.name] -= 1
            if cache is not None:
                cache[key] = text
                while len(cache) > pol.cache_size:
                    cache.popitem(last=False)
            return ToolResult(call.name, text, True, None, attempts=attempt + 1)
        return ToolResult(call.name, f"Error: {error}", False, kind, attempts=pol.retries + 1)
