"""RemoteEngine: the InferenceEngine protocol (base.py) over inference servers on HTTP.

    engine = RemoteEngine(["http://127.0.0.1:30000"], api="sglang", weights_dir=run_dir / "engine" / "weights")
    c = await engine.generate(prompt_ids, SamplingParams(max_new_tokens=64, seed=1))
    await engine.update_weights(model, version=1)       # disk sync: write, pause, load, continue

Tokens in, tokens + log-probs + per-token weight versions out, exactly as LocalEngine, so every
workflow, `seekrl train` and `seekrl eval` run unchanged with `engine.kind=remote`. The per-API
wire format (SGLang's native /generate, spoken by `seekrl serve engine`; vLLM's /v1/completions
and dev endpoints) lives in adapters.py; this module routes, retries and syncs.

Routing: least-loaded (fewest requests in flight) among the live servers, and every turn of one
episode to the server its first turn went to (its prefix is cached there). An episode is an
asyncio task (workflows run each episode in its own task), so the choice is kept in a
ContextVar: a turn inherits its episode's server, and separate episodes choose afresh.

Failures: a server that refuses the connection, times out (`timeout_s`; weight loads and the
pause / continue around them: `weight_sync_timeout_s`), or answers 5xx is marked dead and
counted (`engine/server_failures`); its request is sent again to another live server (with the
same seed it samples the same tokens on a server that honours seeds: seekrl's server and vLLM;
SGLang only when started with --enable-deterministic-inference, which started SGLang servers
are). When no server is left, `generate` and `update_weights` raise `EngineUnavailable`, one line
naming the servers and the last error; the CLI prints it and exits 1. A 4xx answer is a bad
request, not a dead server: `EngineRequestError`. One exception: a 503 answered while that server
is being paused or synced (vLLM answers 503 to new requests while paused with abort or wait) means
"paused": the request is sent again to the same server after a short wait (50 ms, doubling up
to 1 s), for at most `timeout_s`, and counted in `engine/paused_retries`; only past that is the
server dead. A connection that breaks with no answer (a read, write or protocol error: the
server closed a reused keep-alive connection as the request went out) is sent again to the same
server, at most twice, counted in `engine/dropped_retries`; httpx drops the broken connection.
The client closes idle connections after 2 s, before the servers' 5-second keep-alive does, so
that race is rare.

Context: the first request to a server reads its largest context once (`model_info`: seekrl's
`max_context`, vLLM's `max_model_len`, SGLang's `context_length` where its /model_info or
/server_info reports one). Each request's max_new_tokens is then capped to the context left
after its prompt (SGLang answers 400 to prompt + max_new_tokens over the context, failing a
whole batched call; the capped request ends "length" at the context's end). A prompt that
already fills the context is an `EngineRequestError` for that request only.

Batching (api sglang): the generate calls that reach one server within the same event-loop tick
go out as one /generate with lists of input_ids, sampling_params and rids (SGLang's batch form),
so a GRPO step costs a few HTTP requests, not one per sample. vLLM's /v1/completions takes one
set of sampling parameters per request, so its calls go one by one.

Weight sync (`update_weights`): a module is written as a safetensors folder `<weights_dir>/v<N>`
atomically (weights.py); every live server gets pause(in_place) -> load from disk -> continue, in
parallel; then folders older than the newest `keep_weights` are removed. A server that fails to
load is dead from then on (it would sample from stale weights).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import torch

from seekrl.engines.adapters import AdapterError, HTTPCall, get_api
from seekrl.engines.weights import prune_weights, write_weights
from seekrl.errors import EngineRequestError, EngineUnavailable
from seekrl.httpclient import async_client, send, timeout
from seekrl.types import Completion, SamplingParams

__all__ = ["RemoteEngine", "EngineUnavailable", "EngineRequestError"]


class _ServerFailed(Exception):
    pass


class _ServerPaused(Exception):
    """A 503 from a server that is being paused or synced: retry later on the same server."""


@dataclass(eq=False)
class _Server:
    url: str
    sem: asyncio.Semaphore | None = None
    inflight: int = 0
    alive: bool = True
    why: str = ""
    requests: int = 0
    queued: list = field(default_factory=list)  # (HTTPCall, Future) waiting for the next batched request
    pausing: int = 0  # pause windows open on this server (paused, not yet continued): a 503 then means "paused"
    pause_epoch: int = 0  # bumped at each pause and continue, so a 503 sent before a continue still counts as paused
    context: int | None = None  # the server's largest prompt + completion, read once (None: unknown, no cap)
    context_read: asyncio.Task | None = None


_ids = itertools.count()


class RemoteEngine:
    """An `InferenceEngine` over one or more HTTP servers (see the module docstring)."""

    def __init__(
        self,
        urls: list[str],
        *,
        api: str = "sglang",
        token: str | None = None,
        timeout_s: float = 300.0,
        weight_sync_timeout_s: float = 600.0,
        max_concurrent: int = 256,
        weights_dir: str | os.PathLike | None = None,
        keep_weights: int = 2,
        version: int = 0,
        exact_logprobs: bool = False,
        on_close=None,
        max_batch: int = 256,
    ):
        if not urls:
            raise ValueError("RemoteEngine needs at least one server URL")
        self.api = get_api(api)
        self.servers = [_Server(u.rstrip("/")) for u in urls]
        self.token = token
        self.timeout_s = float(timeout_s)
        self.weight_sync_timeout_s = float(weight_sync_timeout_s)  # weight loads, and the pause / continue around them
        self.max_concurrent = int(max_concurrent)
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.keep_weights = keep_weights
        self.version = int(version)
        self.exact_logprobs = exact_logprobs  # True only for seekrl's fp32 servers on the trainer's weights
        self._on_close = on_close
        self.max_batch = max_batch if self.api.name == "sglang" else 1  # prompts per /generate
        self._sticky: contextvars.ContextVar[_Server | None] = contextvars.ContextVar(f"seekrl-remote-{next(_ids)}", default=None)
        self._rids = itertools.count()
        self.counters = {"server_failures": 0, "retries": 0, "requests": 0, "http_requests": 0, "weight_syncs": 0, "weight_sync_s": 0.0,
                         "paused_retries": 0, "dropped_retries": 0}
        self._paused = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._unpaused: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()  # batch senders in flight (the loop keeps only weak references)
        self._server_pause: asyncio.Task | None = None  # pause("abort") on the servers, until update_weights or resume
        self._pause_paths = {calls[0].path for calls in (self.api.pause(m) for m in ("abort", "in_place")) if calls}
        self._resume_paths = {c.path for c in self.api.resume()}

    # ----------------------------------------------------------------------------- protocol

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, rid: str | None = None) -> Completion:
        """Sample one completion on a server (see the module docstring for routing and retries)."""
        if not prompt_ids:
            raise ValueError("generate: prompt_ids is empty")
        if params.max_new_tokens <= 0:
            return Completion([], [], "length", self.version)
        self._ensure_loop()
        await self._unpaused.wait()
        rid = rid or f"seekrl-{os.getpid()}-{next(self._rids)}"
        self.api.generate(list(prompt_ids), params, rid)  # a request the adapter refuses fails before any I/O
        version_at_start = self.version
        tried: set[int] = set()
        while True:
            server = self._choose(tried)
            tried.add(id(server))
            server.inflight += 1  # counted from the choice on, so a burst of requests spreads out
            try:
                call = self.api.generate(list(prompt_ids), await self._fit_context(server, len(prompt_ids), params), rid)
                body = await self._generate_on(server, call)
            except _ServerFailed:
                self.counters["retries"] += 1
                continue
            finally:
                server.inflight -= 1
            try:
                res = self.api.parse_generate(body, list(prompt_ids))
            except AdapterError as e:
                raise EngineRequestError(f"engine server {server.url} sent an answer seekrl cannot read: {e}") from None
            version = res.version if res.version is not None else version_at_start
            versions = res.versions
            if versions is not None:
                version = versions[0] if versions else version
                if all(v == version for v in versions):
                    versions = None
            return Completion(list(res.token_ids), list(res.logprobs), res.finish_reason, int(version), versions)

    async def update_weights(self, source: torch.nn.Module | str | os.PathLike, version: int) -> None:
        """Write `source` (a module) as `<weights_dir>/v<version>`, or take a folder as it is, and
        load it on every live server: pause(in_place) -> update from disk -> continue."""
        self._ensure_loop()
        t0 = time.perf_counter()
        if isinstance(source, torch.nn.Module):
            if self.weights_dir is None:
                raise ValueError("RemoteEngine.update_weights(module) needs weights_dir, where the servers can read the folder")
            folder = await asyncio.to_thread(write_weights, source, self.weights_dir, version,
                                             untie_embeddings=self.api.name == "vllm")  # weights.untie_lm_head
        else:
            folder = Path(source)
        pause = self.api.pause("in_place")
        if self._server_pause is not None:  # pause("abort") paused the servers already
            paused, self._server_pause = self._server_pause, None
            await paused
            pause = []
        await self._on_live([*pause, *self.api.update_from_disk(str(folder), int(version)), *self.api.resume()])
        self._live()  # raises EngineUnavailable when the update killed every server
        self.version = int(version)
        if self.weights_dir is not None and isinstance(source, torch.nn.Module):
            prune_weights(self.weights_dir, self.keep_weights, protect=folder)
        self.counters["weight_syncs"] += 1
        self.counters["weight_sync_s"] += time.perf_counter() - t0

    def pause(self, mode: str = "hold") -> None:
        """New `generate` calls wait in this process until `resume()`. "abort" also pauses every live
        server with abort, so the requests in flight come back now with their tokens so far (finish
        "abort"); the next `update_weights` loads into the paused servers, and continues them.
        Other modes leave the requests on the servers running."""
        self._paused = True
        if self._unpaused is not None:
            self._unpaused.clear()
        if mode == "abort" and self._server_pause is None:
            self._ensure_loop()
            calls = self.api.pause("abort")
            self._server_pause = asyncio.get_running_loop().create_task(self._on_live(calls))

    def resume(self) -> None:
        self._paused = False
        if self._unpaused is not None:
            self._unpaused.set()
        if self._server_pause is not None:  # paused with abort and not updated: continue the servers
            paused, self._server_pause = self._server_pause, None
            self._spawn(self._continue_after(paused))

    async def _on_live(self, calls: list[HTTPCall]) -> None:
        """`calls`, in order, on every live server at once. A server that fails them is dead from then
        on (it would sample from stale weights); any other error is raised."""
        results = await asyncio.gather(*(self._sync_one(s, calls) for s in self._live()), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, _ServerFailed):
                raise r

    async def _fit_context(self, server: _Server, n_prompt: int, params: SamplingParams) -> SamplingParams:
        """`params` with max_new_tokens capped to the context `server` has left after the prompt
        (read once per server); EngineRequestError when the prompt fills it already."""
        if server.context_read is None:
            server.context_read = asyncio.get_running_loop().create_task(self._read_context(server))
        await asyncio.shield(server.context_read)
        context = server.context
        if context is None:
            return params
        left = context - n_prompt
        if left <= 0:
            raise EngineRequestError(f"engine server {server.url}: the prompt of {n_prompt} tokens fills its context of {context} "
                                     "tokens; shorten the prompt (rollout.max_prompt_tokens, rollout.max_total_tokens)")
        return replace(params, max_new_tokens=left) if params.max_new_tokens > left else params

    async def _read_context(self, server: _Server) -> None:
        """server.context from its model_info call(s); unknown (None) when none reports one."""
        for call in self.api.context_calls():
            try:
                body = await self._request(server, call, counted=False)
            except EngineRequestError:  # not served (404) or refused: try the next, else no cap
                continue
            except _ServerFailed:
                server.context_read = None  # a dead server: the caller re-routes; nothing cached
                raise
            context = self.api.parse_context(body)
            if context is not None:
                server.context = context
                return

    async def _continue_after(self, paused: asyncio.Task) -> None:
        await asyncio.wait([paused])
        await self._on_live(self.api.resume())

    # ----------------------------------------------------------------------------- run state

    def metrics(self) -> dict[str, float]:
        """Counters for the run's metrics.jsonl (`engine/...`)."""
        out = {f"engine/{k}": float(v) for k, v in self.counters.items()}
        out["engine/servers_alive"] = float(sum(s.alive for s in self.servers))
        return out

    def state_dict(self) -> dict:
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def close(self) -> None:
        """Stop the servers this engine started (if any). Safe to call twice."""
        self._client = None  # its connections die with the event loop that made them
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    # ----------------------------------------------------------------------------- internals

    def _ensure_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop and self._client is not None:
            return
        self._loop = loop
        self._client = async_client(token=self.token, timeout_s=self.timeout_s,
                                    max_connections=self.max_concurrent * len(self.servers) + 8, max_keepalive=64)
        for s in self.servers:
            s.sem = asyncio.Semaphore(self.max_concurrent)
            if s.context_read is not None and not s.context_read.done():  # a read the previous loop left unfinished
                s.context_read = None
        self._unpaused = asyncio.Event()
        if not self._paused:
            self._unpaused.set()

    def _dropped(self) -> None:
        self.counters["dropped_retries"] += 1

    def _live(self) -> list[_Server]:
        live = [s for s in self.servers if s.alive]
        if not live:
            raise EngineUnavailable(self._dead_message())
        return live

    def _dead_message(self) -> str:
        dead = "; ".join(f"{s.url} ({s.why})" for s in self.servers)
        if len(self.servers) == 1:
            return f"engine server {self.servers[0].url} is unreachable: {self.servers[0].why}"
        return f"every engine server is unreachable: {dead}"

    def _choose(self, tried: set[int]) -> _Server:
        """The episode's server if it is alive and untried; else the least loaded live one."""
        live = self._live()
        sticky = self._sticky.get()
        if sticky is not None and sticky.alive and id(sticky) not in tried:
            return sticky
        fresh = [s for s in live if id(s) not in tried] or live
        server = min(fresh, key=lambda s: (s.inflight, s.requests))
        self._sticky.set(server)
        return server

    def _fail(self, server: _Server, why: str) -> None:
        if server.alive:
            server.alive = False
            server.why = why
            self.counters["server_failures"] += 1

    async def _request(self, server: _Server, call: HTTPCall, *, control: bool = False, counted: bool = True):
        """One HTTP call; a dead server raises _ServerFailed (after marking it), a 4xx EngineRequestError.
        A 503 while the server is paused is retried on it, for at most engine.timeout_s (module docstring).
        `control`: a weight-sync call (engine.weight_sync_timeout_s); `counted`: in engine/http_requests.
        An empty 2xx answer (SGLang's /abort_request) reads as {}."""
        deadline = time.monotonic() + self.timeout_s
        wait = 0.05
        while True:
            try:
                return await self._request_once(server, call, control=control, counted=counted)
            except _ServerPaused:
                if time.monotonic() + wait > deadline:
                    self._fail(server, f"HTTP 503 on {call.path} while paused for longer than engine.timeout_s={self.timeout_s:g} s")
                    raise _ServerFailed from None
                self.counters["paused_retries"] += 1
                await asyncio.sleep(wait)
                wait = min(wait * 2, 1.0)

    async def _request_once(self, server: _Server, call: HTTPCall, *, control: bool = False, counted: bool = True):
        path = call.path.split("?", 1)[0]
        is_pause, is_resume = call.path in self._pause_paths, call.path in self._resume_paths
        if is_pause:  # from the moment it is sent: a request answered 503 by the pausing server is "paused"
            server.pausing += 1
            server.pause_epoch += 1
        paused_at_send, epoch = server.pausing > 0, server.pause_epoch
        timeout_s = self.weight_sync_timeout_s if control else self.timeout_s
        key = "engine.weight_sync_timeout_s" if control else "engine.timeout_s"
        r = None
        try:
            async with server.sem:
                try:
                    r = await send(self._client, call.method, server.url + call.path, json=call.json,
                                   timeout=timeout(timeout_s), on_resend=self._dropped)
                except httpx.TimeoutException:
                    self._fail(server, f"no answer to {path} within {key}={timeout_s:g} s")
                    raise _ServerFailed from None
                except httpx.TransportError as e:
                    self._fail(server, f"{type(e).__name__}: {e}".strip().rstrip(":"))
                    raise _ServerFailed from None
        finally:
            if is_pause and (r is None or r.status_code >= 400):
                server.pausing = max(server.pausing - 1, 0)  # the pause did not take
        if is_resume and r.status_code < 400:
            server.pausing = 0
            server.pause_epoch += 1
        self.counters["http_requests"] += counted
        if r.status_code == 503 and server.alive and (paused_at_send or server.pausing > 0 or server.pause_epoch != epoch):
            raise _ServerPaused
        if r.status_code >= 500:
            self._fail(server, f"HTTP {r.status_code} on {call.path}: {_short(r.text)}")
            raise _ServerFailed
        try:
            body = r.json() if r.content.strip() or r.status_code >= 300 else {}
        except ValueError:
            body = None
        if r.status_code >= 400:
            raise EngineRequestError(f"engine server {server.url} refused {call.path} with HTTP {r.status_code}: {_message(body, r.text)}")
        if body is None:
            raise EngineRequestError(f"engine server {server.url} answered {call.path} with something that is not JSON: {_short(r.text)}")
        return body

    async def _generate_on(self, server: _Server, call: HTTPCall):
        """The server's answer to one generate call: sent alone, or batched with the calls that
        reach the same server in the same tick (see the module docstring)."""
        server.requests += 1
        self.counters["requests"] += 1
        if self.max_batch <= 1:
            return await self._request(server, call)
        future = asyncio.get_running_loop().create_future()
        server.queued.append((call, future))
        if len(server.queued) == 1:
            self._spawn(self._flush(server))
        return await future

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, server: _Server) -> None:
        for _ in range(3):  # let every caller of the same gather (and their sub-awaits) enqueue
            await asyncio.sleep(0)
        while server.queued:
            items, server.queued = server.queued[: self.max_batch], server.queued[self.max_batch :]
            items = [(c, f) for c, f in items if not f.done()]  # callers cancelled meanwhile
            if items:
                self._spawn(self._send_batch(server, items))

    async def _send_batch(self, server: _Server, items: list) -> None:
        calls = [c for c, _ in items]
        merged = HTTPCall(calls[0].method, calls[0].path, {
            **calls[0].json, **{k: [c.json[k] for c in calls] for k in ("input_ids", "sampling_params", "rid")}})
        try:
            body = await self._request(server, merged)
            if not isinstance(body, list) or len(body) != len(items):
                raise EngineRequestError(f"engine server {server.url} answered {len(items)} prompts with "
                                         f"{len(body) if isinstance(body, list) else 'one object'}")
        except BaseException as e:  # _ServerFailed re-routes each call; anything else reaches every caller
            for _, f in items:
                if not f.done():
                    f.set_exception(_ServerFailed() if isinstance(e, _ServerFailed) else e)
            if not isinstance(e, Exception):
                raise
            return
        for (_, f), answer in zip(items, body):
            if not f.done():
                f.set_result(answer)

    async def _sync_one(self, server: _Server, calls: list[HTTPCall]) -> None:
        for call in calls:
            try:
                body = await self._request(server, call, control=True)
                self.api.check_update(call, body)
            except (EngineRequestError, AdapterError) as e:
                self._fail(server, f"weight update failed: {e}")
                raise _ServerFailed from None


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _message(body, text: str) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return _short(err["message"])
        for key in ("message", "detail"):
            if isinstance(body.get(key), str):
                return _short(body[key])
    return _short(text)
