"""LocalEngine: batched sampling with a transformers causal LM in this process, on CPU or GPU.

Concurrent `generate` calls are coalesced: each call enqueues a request and awaits a future; one
background task (started lazily on the running event loop) lets the loop tick so that all calls
of the same `asyncio.gather` arrive, then runs them as batches of at most `max_batch_size` in a
worker thread (torch releases the GIL, so tool coroutines keep running meanwhile).

The sampling loop is written by hand rather than with `model.generate`, because the trainer
needs the exact behaviour log-probs (base.py) and per-row stop strings: prompts are left-padded,
`position_ids = cumsum(mask) - 1`, one prefill fills a `DynamicCache`, then one token per step.
Rows may carry different temperature / top-p / top-k / max_new_tokens / stop strings. Finished
rows are dropped from the batch (`index_select` on the cache) once at least
`compact_fraction` of the batch is done, otherwise they ride along and their outputs are ignored.

Pausing, aborting, versions: `pause("hold")` holds new batches back while the batch in flight
finishes; `pause("abort")` also ends every queued and running request at its next step with the
tokens sampled so far (finish_reason "abort"); `pause("in_place")` parks the running batch between
two decode steps, so `update_weights` can swap the weights under it, and `resume()` continues it
with the new weights (over a KV cache the old weights computed); `pause("retract")` ends the
batch in flight at its next step and puts its requests back in the queue with the tokens sampled
so far, so that after `resume()` their prompt + those tokens are prefilled again under the new
weights and they continue (same seeded draws as an uncut request; one Completion in the end). Each sampled token is stamped with the version of the weights whose forward
pass produced its logits (`Completion.versions` when a call spans an update). `abort(rid)` ends one
request (or all); a caller whose `await generate(...)` is cancelled has its row dropped at the next
step, so a disconnected HTTP client stops costing compute.

Sampling is an inverse-CDF draw (one uniform per row, `searchsorted` in the cumulative
probabilities: exact, and far cheaper on CPU than `torch.multinomial` for large vocabularies)
from one engine-level `torch.Generator`, so runs are reproducible given the same sequence of
batches; a request with `SamplingParams.seed` draws its uniforms from its own generator instead,
so its samples do not depend on what else is in the batch.

Run the tests: `python -m pytest tests/integration/test_local_engine.py -q`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import glob
import os
import threading
import time
from dataclasses import dataclass

import torch

from seekrl.types import Completion, SamplingParams


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    rid: str | None = None
    aborted: bool = False  # set on the event loop's thread, read by the sampling thread at each step
    done: Completion | None = None  # what a retracted request sampled before it was put back in the queue
    gen_state: torch.Tensor | None = None  # its seeded generator at that point, so the rest draws as if uncut

    def remaining(self) -> tuple[list[int], SamplingParams]:
        """The prompt and params that continue this request (after a retract: prompt + tokens so far)."""
        if self.done is None:
            return self.prompt_ids, self.params
        n = len(self.done.token_ids)
        return self.prompt_ids + self.done.token_ids, dataclasses.replace(self.params, max_new_tokens=self.params.max_new_tokens - n)


PAUSE_MODES = ("hold", "abort", "in_place", "retract")


def _as_id_set(*values) -> set[int]:
    out: set[int] = set()
    for v in values:
        if v is None:
            continue
        if isinstance(v, (list, tuple, set)):
            out.update(int(x) for x in v if x is not None)
        else:
            out.add(int(v))
    return out


class LocalEngine:
    """An `InferenceEngine` (see base.py) over an in-process transformers causal LM."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        max_batch_size: int = 64,
        seed: int = 0,
        version: int = 0,
        compact_fraction: float = 0.25,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.compact_fraction = compact_fraction
        self.version = version
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        gen_config = getattr(model, "generation_config", None)
        self.eos_ids = _as_id_set(
            tokenizer.eos_token_id,
            getattr(model.config, "eos_token_id", None),
            getattr(gen_config, "eos_token_id", None),
        )
        if not self.eos_ids:
            raise ValueError("LocalEngine: neither the tokenizer nor the model config defines an eos token")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = (
            (lambda ids: backend.decode(ids, skip_special_tokens=False))
            if backend is not None
            else (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        )
        self.stats = {
            "batches": 0, "requests": 0, "tokens": 0, "forward_steps": 0, "prefill_tokens": 0, "seconds": 0.0, "aborted": 0,
            "joined": 0, "max_rows": 0,
        }
        self._inbox: collections.deque[_Request] = collections.deque()  # waiting requests (thread-safe ends)
        self._draining = 0  # update_weights waits for the batch in flight: no request may join it
        self._live: set[_Request] = set()  # queued or running requests, for abort()
        self._go = threading.Event()  # cleared by pause("in_place"): the sampling thread parks between steps
        self._go.set()
        self._parked = threading.Event()  # set while the sampling thread is parked
        self._busy = False  # a batch is being sampled (or about to be)
        self._retract = False  # set by pause("retract"): the batch in flight ends at its next step
        self._closed = False
        self._paused = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._unpaused: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    # ----------------------------------------------------------------------------- public API

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, rid: str | None = None) -> Completion:
        """Sample one completion; concurrent calls are batched together (see module docstring).
        `rid` names the request for `abort(rid)`; cancelling the await drops the request."""
        if not prompt_ids:
            raise ValueError("generate: prompt_ids is empty")
        if params.max_new_tokens <= 0:
            return Completion([], [], "length", self.version)
        loop = self._ensure_started()
        req = _Request([int(i) for i in prompt_ids], params, loop.create_future(), rid)
        self._live.add(req)
        self._inbox.append(req)
        self._wake.set()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.aborted = True  # a running batch drops the row at its next step
            raise
        finally:
            self._live.discard(req)

    def abort(self, rid: str | None = None) -> int:
        """End the request named `rid` (every request when None) at its next step; it returns the
        tokens sampled so far with finish_reason "abort". Returns how many requests were marked."""
        marked = [r for r in self._live if (rid is None or r.rid == rid) and not r.aborted]
        for r in marked:
            r.aborted = True
        return len(marked)

    async def update_weights(self, source: torch.nn.Module | str | os.PathLike, version: int) -> None:
        """Install `source`'s weights (a module, or a folder / file of *.safetensors); set `version`.

        When `source` is this engine's own model (shared weights, the in-process default) only
        the version changes. Waits for the batch in flight; never runs during generation.
        Under `pause("in_place")` it waits until the batch in flight is parked between two steps
        and swaps the weights under it; the rest of that batch samples with them after `resume()`.
        """
        self._ensure_started()
        if not self._go.is_set():
            await self._wait_parked()
            if source is not self.model:
                await asyncio.to_thread(self._load_weights, source)
            self.version = int(version)
            return
        self._draining += 1  # the batch in flight takes no new requests, so it ends
        try:
            async with self._lock:
                if source is not self.model:
                    await asyncio.to_thread(self._load_weights, source)
                self.version = int(version)
        finally:
            self._draining -= 1
            if self._inbox:
                self._wake.set()

    def pause(self, mode: str = "hold") -> None:
        """Hold new batches back until `resume()`. "hold": the batch in flight finishes; "abort":
        every queued and running request ends now with its tokens so far (finish "abort");
        "in_place": the batch in flight parks between two steps; "retract": the batch in flight
        stops at its next step and its requests wait in the queue with their tokens so far.
        Call on the loop's thread."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        self._paused = True
        if self._unpaused is not None:
            self._unpaused.clear()
        if mode == "abort":
            self.abort()
        elif mode == "in_place":
            self._go.clear()
        elif mode == "retract":
            self._retract = True

    def resume(self) -> None:
        self._paused = False
        self._retract = False
        self._go.set()
        if self._unpaused is not None:
            self._unpaused.set()
        if self._wake is not None and self._inbox:
            self._wake.set()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def queued(self) -> int:
        """Requests waiting for a place in a batch."""
        return len(self._inbox)

    @property
    def in_flight(self) -> int:
        """Requests not answered yet (waiting or being sampled)."""
        return len(self._live)

    def close(self) -> None:
        """Release a parked sampling thread for good (the process is ending)."""
        self._closed = True
        self._go.set()

    async def _wait_parked(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._busy and not self._parked.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the batch in flight did not park within {timeout_s:.0f} s")
            await asyncio.sleep(0.002)

    def metrics(self) -> dict[str, float]:
        """Counters for the run's metrics (none: the in-process engine has no servers to lose)."""
        return {}

    def state_dict(self) -> dict:
        """The version and the sampling generator's state (a uint8 tensor), for checkpoints."""
        return {"version": self.version, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])
        gen = state.get("generator")
        if gen is None:  # a checkpoint of a run that sampled on remote servers
            return
        gen = gen if isinstance(gen, torch.Tensor) else torch.tensor(list(gen), dtype=torch.uint8)
        self.generator.set_state(gen.to(dtype=torch.uint8, device="cpu"))

    # ----------------------------------------------------------------------------- batching

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new event loop (e.g. a second asyncio.run)
            self._loop = loop
            self._inbox.clear()  # requests of a closed event loop have nobody to answer
            self._wake = asyncio.Event()
            self._lock = asyncio.Lock()
            self._unpaused = asyncio.Event()
            if not self._paused:
                self._unpaused.set()
            self._worker = None
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run(), name="seekrl-local-engine")
        return loop

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for _ in range(3):  # let every caller of the same gather (and their sub-awaits) enqueue
                await asyncio.sleep(0)
            while True:  # while paused, requests wait here; those aborted meanwhile are answered
                self._answer_aborted_queued()
                if self._unpaused.is_set() or not self._inbox:
                    break
                try:
                    await asyncio.wait_for(self._unpaused.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
            if not self._inbox:
                continue
            self._busy = True
            try:
                async with self._lock:
                    await asyncio.to_thread(self._generate_batch)
            finally:
                self._busy = False
            if self._inbox:
                self._wake.set()

    def _answer_aborted_queued(self) -> None:
        """Forget cancelled callers in the queue; answer the aborted ones (nothing sampled since)."""
        waiting = list(self._inbox)
        self._inbox.clear()
        for r in waiting:
            if r.future.done():
                continue
            if r.aborted:
                self.stats["aborted"] += 1
                r.future.set_result(r.done or Completion([], [], "abort", self.version))
            else:
                self._inbox.append(r)

    def _finish(self, req: _Request, c: Completion | BaseException) -> None:
        """Answer a request (on the loop's thread); a retracted one goes back to the queue's front."""
        if req.future.done():
            return
        if isinstance(c, BaseException):
            req.future.set_exception(c)
            return
        c = _joined(req.done, c)
        if c.finish_reason == "retract":
            req.done = dataclasses.replace(c, finish_reason="abort")
            self._inbox.appendleft(req)
            self._wake.set()
        else:
            req.future.set_result(c)

    def _deliver(self, req: _Request, c: Completion | BaseException) -> None:
        """From the sampling thread: answer `req` as soon as its row is done (not at batch end)."""
        self._loop.call_soon_threadsafe(self._finish, req, c)

    def _take(self, room: int) -> list[_Request]:
        """From the sampling thread: up to `room` waiting requests, unless paused or draining."""
        out: list[_Request] = []
        while len(out) < room and not self._paused and not self._draining:
            try:
                r = self._inbox.popleft()
            except IndexError:
                break
            if r.future.done():  # its caller went away
                continue
            if r.aborted:
                self.stats["aborted"] += 1
                self._deliver(r, Completion([], [], "abort", self.version))
                continue
            out.append(r)
        return out

    # ----------------------------------------------------------------------------- sampling

    def _checkpoint(self) -> int:
        """Between two forward passes: park while paused in place; return the weights' version."""
        if not self._go.is_set():
            self._parked.set()
            while not self._go.wait(0.05) and not self._closed:
                pass
            self._parked.clear()
        return self.version

    def _generate_batch(self) -> None:
        """The sampling thread: run one batch until no row is left. Requests that arrive meanwhile
        join it between two steps (continuous batching); each row is answered when it is done."""
        t0 = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        batch = _Batch(self)
        try:
            with torch.inference_mode():
                version = self._checkpoint()
                batch.add(self._take(self.max_batch_size), version)
                while batch.rows:
                    batch.step()
                    room = self.max_batch_size - batch.active()
                    joiners = self._take(room) if room > 0 and batch.can_join else []
                    if batch.active() == 0 and not joiners:
                        break
                    batch.compact(force=bool(joiners))
                    version = self._checkpoint()
                    if batch.rows:
                        batch.decode(version)
                    if joiners:
                        self.stats["joined"] += len(joiners)
                        batch.add(joiners, version)
        except Exception as e:  # every request of the batch gets the error
            for row in batch.all_rows:
                if row.reason is None:
                    row.reason = "error"
                    self._deliver(row.req, e)
        finally:
            self.model.train(was_training)
            self.stats["batches"] += 1
            self.stats["seconds"] += time.perf_counter() - t0

    # ----------------------------------------------------------------------------- weights

    def _load_weights(self, source) -> None:
        if isinstance(source, torch.nn.Module):
            state = source.state_dict()
            where = type(source).__name__
        else:
            path = str(source)
            files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
            if not files or not all(f.endswith(".safetensors") and os.path.isfile(f) for f in files):
                raise ValueError(f"update_weights: '{path}' is not a folder with *.safetensors files or a .safetensors file")
            from safetensors.torch import load_file

            state = {}
            for f in files:
                state.update(load_file(f))
            where = path
        own = self.model.state_dict()
        ptr = {k: v.data_ptr() for k, v in own.items()}
        given = {ptr[k] for k in state if k in ptr}
        missing = [k for k in own if k not in state and ptr[k] not in given]  # tied weights are fine
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            raise ValueError(
                f"update_weights: the weights from {where} do not match the engine's model "
                f"({len(missing)} missing, e.g. {missing[:2]}; {len(unexpected)} unexpected, e.g. {unexpected[:2]}): "
                "push a model of the same architecture (merge LoRA adapters first, or give the engine the peft model)"
            )
        for k, v in state.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"update_weights: '{k}' has shape {tuple(v.shape)} in {where}, {tuple(own[k].shape)} in the engine's model")
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)


@dataclass(eq=False)
class _Row:
    """One request in the running batch: what it has sampled so far, and how it ends."""

    req: _Request
    i: int  # its index in the batch's `params` (the row sampler and seeded generators key on it)
    params: SamplingParams
    enders: set[int]  # token ids that end it (EOS unless ignore_eos, stop_token_ids)
    stops: tuple[str, ...]
    window: int  # tokens decoded to look for a stop string
    prefix: list[int]  # tail of the tokens sampled before a retract (a stop string may span the cut)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logps: list[float] = dataclasses.field(default_factory=list)
    vers: list[int] = dataclasses.field(default_factory=list)
    reason: str | None = None
    fwd: int = 0  # version of the weights whose forward pass gave the row's current logits


class _Batch:
    """The sampling thread's running batch: rows in KV-cache order, their cache, attention mask
    (left padding is 0), next positions and the logits of their next token.

    Rows are added by a prefill (each distinct prompt once, its cache expanded to the rows that
    share it) and merged into the running cache by left-padding the shorter of the two caches;
    finished rows are dropped from the cache (`compact`), and columns that no row attends to any
    more are cut off the left, so a long-lived batch does not grow without bound."""

    def __init__(self, engine: LocalEngine):
        from transformers.cache_utils import DynamicLayer

        self.e, self.dev = engine, engine.device
        self.rows: list[_Row] = []  # in cache order; finished rows ride along until compacted
        self.all_rows: list[_Row] = []
        self.params: list[SamplingParams] = []
        self.gens: dict[int, torch.Generator] = {}
        self.cache = self.mask_bL = self.pos_b1 = self.logits_bV = self.tok_b = None
        self.sampler: _RowSampler | None = None
        self.done = 0  # finished rows still in the cache
        self._plain_layer = DynamicLayer
        self.can_join = True  # left-padding merges need plain DynamicLayer caches (no sliding windows)

    def active(self) -> int:
        return len(self.rows) - self.done

    # -- adding rows
    def add(self, reqs: list[_Request], version: int) -> None:
        if not reqs:
            return
        e, dev = self.e, self.dev
        new: list[_Row] = []
        prompts = []
        for r in reqs:
            prompt, p = r.remaining()
            i = len(self.params)
            self.params.append(p)
            stops = tuple(x for x in p.stop if x)
            row = _Row(r, i, p, set(p.stop_token_ids) | (set() if p.ignore_eos else e.eos_ids), stops,
                       max((len(x) for x in stops), default=0) + 4, list(r.done.token_ids[-64:]) if r.done else [])
            if p.seed is not None and p.temperature > 0:
                g = torch.Generator(device=dev)
                g.manual_seed(int(p.seed))
                if r.gen_state is not None:  # a retracted request goes on drawing where it stopped
                    g.set_state(r.gen_state)
                self.gens[i] = g
            new.append(row)
            prompts.append(prompt)
        self.all_rows.extend(new)
        e.stats["requests"] += len(new)
        # The G samples of a task share their prompt: prefill each distinct prompt once.
        distinct: dict[tuple, int] = {}
        row_u = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        uniq = [list(k) for k in distinct]
        ulens = [len(p) for p in uniq]
        L = max(ulens)
        input_ids = torch.tensor([[e.pad_id] * (L - n) + p for p, n in zip(uniq, ulens)], dtype=torch.long, device=dev)
        mask_uL = torch.tensor([[0] * (L - n) + [1] * n for n in ulens], dtype=torch.long, device=dev)
        from transformers import DynamicCache

        cache = DynamicCache(config=e.model.config)
        out = e.model(input_ids=input_ids, attention_mask=mask_uL, position_ids=(mask_uL.cumsum(-1) - 1).clamp_min(0),
                      past_key_values=cache, use_cache=True, logits_to_keep=1)
        e.stats["forward_steps"] += 1
        e.stats["prefill_tokens"] += sum(ulens)
        logits_nV, mask_nL = out.logits[:, -1, :], mask_uL
        if len(uniq) < len(new):
            row_u_t = torch.tensor(row_u, dtype=torch.long, device=dev)
            cache.reorder_cache(row_u_t)
            logits_nV, mask_nL = logits_nV[row_u_t], mask_nL[row_u_t]
        pos_n1 = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)[:, None]
        for row in new:
            row.fwd = version
        self._merge(cache, mask_nL, pos_n1, logits_nV)
        self.rows.extend(new)
        self.sampler = _RowSampler(self.params, [r.i for r in self.rows], dev)
        e.stats["max_rows"] = max(e.stats["max_rows"], self.active())

    def _merge(self, cache, mask_nL, pos_n1, logits_nV) -> None:
        if self.cache is None:
            self.cache, self.mask_bL, self.pos_b1, self.logits_bV = cache, mask_nL, pos_n1, logits_nV
            self.can_join = all(type(layer) is self._plain_layer for layer in cache.layers)
            return
        L = max(self.mask_bL.shape[1], mask_nL.shape[1])
        pad = torch.nn.functional.pad
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([pad(old.keys, (0, 0, L - old.keys.shape[-2], 0)), pad(new.keys, (0, 0, L - new.keys.shape[-2], 0))])
            old.values = torch.cat([pad(old.values, (0, 0, L - old.values.shape[-2], 0)),
                                    pad(new.values, (0, 0, L - new.values.shape[-2], 0))])
        self.mask_bL = torch.cat([pad(self.mask_bL, (L - self.mask_bL.shape[1], 0)), pad(mask_nL, (L - mask_nL.shape[1], 0))])
        self.pos_b1 = torch.cat([self.pos_b1, pos_n1])
        self.logits_bV = torch.cat([self.logits_bV, logits_nV])

    # -- one step
    def step(self) -> None:
        """Sample one token for every unfinished row from `logits_bV`; answer the rows that end."""
        e = self.e
        retract = e._retract  # read once per step (set from the loop's thread)
        gen_before = {i: g.get_state() for i, g in self.gens.items()} if retract else {}
        tok_b, lp_b = self.sampler.pick(self.logits_bV, e.generator, self.gens)
        self.tok_b = tok_b
        host = torch.stack([tok_b.double(), lp_b.double()]).tolist()  # the one sync per step
        for j, row in enumerate(self.rows):
            if row.reason is not None:
                continue
            if row.req.aborted:
                row.reason = "abort"
            elif retract:
                row.reason = "retract"
                if row.i in self.gens:  # this step's draw is not used: rewind it
                    self.gens[row.i].set_state(gen_before[row.i])
                    row.req.gen_state = gen_before[row.i]
            else:
                tok = int(host[0][j])
                row.tokens.append(tok)
                row.logps.append(host[1][j])
                row.vers.append(row.fwd)
                if tok in row.enders:
                    row.reason = "stop"
                elif row.stops and any(x in e._decode((row.prefix + row.tokens)[-row.window :]) for x in row.stops):
                    row.reason = "stop"
                elif len(row.tokens) >= row.params.max_new_tokens:
                    row.reason = "length"
            if row.reason is not None:
                self.done += 1
                e.stats["tokens"] += len(row.tokens)
                e.stats["aborted"] += row.reason == "abort"
                e._deliver(row.req, _completion(row.tokens, row.logps, row.reason, row.vers, row.fwd))

    def compact(self, force: bool = False) -> None:
        """Drop finished rows from the cache once enough are done (or before rows join), and the
        left columns no remaining row attends to."""
        if not self.done or not (force or self.done >= max(1.0, self.e.compact_fraction * len(self.rows))):
            return
        keep = [j for j, row in enumerate(self.rows) if row.reason is None]
        self.rows = [self.rows[j] for j in keep]
        self.done = 0
        if not keep:
            self.cache = self.mask_bL = self.pos_b1 = self.logits_bV = self.tok_b = None
            return
        keep_t = torch.tensor(keep, dtype=torch.long, device=self.dev)
        self.cache.batch_select_indices(keep_t)
        self.mask_bL, self.pos_b1, self.tok_b = self.mask_bL[keep_t], self.pos_b1[keep_t], self.tok_b[keep_t]
        self.logits_bV = self.logits_bV[keep_t]
        first = int(self.mask_bL.any(dim=0).nonzero()[0])  # columns left of it are padding for every row
        if first > 0 and self.can_join:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask_bL = self.mask_bL[:, first:]
        self.sampler = _RowSampler(self.params, [r.i for r in self.rows], self.dev)

    def decode(self, version: int) -> None:
        """One forward pass of every row's last token: the logits of the next step."""
        self.mask_bL = torch.cat([self.mask_bL, self.mask_bL.new_ones(len(self.rows), 1)], dim=1)
        out = self.e.model(input_ids=self.tok_b[:, None], attention_mask=self.mask_bL, position_ids=self.pos_b1,
                           past_key_values=self.cache, use_cache=True)
        self.logits_bV = out.logits[:, -1, :]
        self.pos_b1 = self.pos_b1 + 1
        for row in self.rows:
            row.fwd = version
        self.e.stats["forward_steps"] += 1


def _joined(before: Completion | None, after: Completion) -> Completion:
    """A retracted request's tokens so far, then what it sampled after it was put back."""
    if before is None:
        return after
    vers = before.token_versions() + after.token_versions()
    tokens, logps = before.token_ids + after.token_ids, before.logprobs + after.logprobs
    return _completion(tokens, logps, after.finish_reason, vers, after.version)


def _completion(tokens: list[int], logps: list[float], reason: str, vers: list[int], current: int) -> Completion:
    """A Completion stamped with its first token's version; per-token versions only when they differ."""
    version = vers[0] if vers else current
    spans = None if all(v == version for v in vers) else vers
    return Completion(tokens, logps, reason, version, spans)


class _RowSampler:
    """Per-row temperature / top-k / top-p for the current batch rows, as tensors."""

    def __init__(self, params: list[SamplingParams], rows: list[int], device: torch.device):
        ps = [params[i] for i in rows]
        self.rows = rows
        self.greedy = [p.temperature <= 0 for p in ps]
        self.all_greedy = all(self.greedy)
        self.any_greedy = any(self.greedy)
        temps = [1.0 if g else float(p.temperature) for g, p in zip(self.greedy, ps)]
        self.temp_b1 = None if all(t == 1.0 for t in temps) else torch.tensor(temps, device=device)[:, None]
        self.greedy_b = torch.tensor(self.greedy, device=device) if self.any_greedy else None
        top_k = [0 if g else int(p.top_k) for g, p in zip(self.greedy, ps)]
        top_p = [1.0 if g else float(p.top_p) for g, p in zip(self.greedy, ps)]
        self.any_top_k = any(k > 0 for k in top_k)
        self.max_top_k = max(top_k)
        self.any_top_p = any(p < 1.0 for p in top_p)
        self.top_k_b = torch.tensor(top_k, device=device)
        self.top_p_b1 = torch.tensor([p if p < 1.0 else 2.0 for p in top_p], device=device)[:, None]

    def pick(self, logits_bV: torch.Tensor, generator: torch.Generator, row_gens: dict[int, torch.Generator]):
        """Choose one token per row; return it and its log-prob under log_softmax(logits / T)."""
        logits_bV = logits_bV.float()
        scaled_bV = logits_bV if self.temp_b1 is None else logits_bV / self.temp_b1
        logp_bV = torch.log_softmax(scaled_bV, dim=-1)
        if self.all_greedy:
            tok_b = logits_bV.argmax(dim=-1)
        else:
            if self.any_top_k or self.any_top_p:
                probs_bV = torch.softmax(self._filter(scaled_bV), dim=-1)
            else:
                probs_bV = logp_bV.exp()
            # Inverse-CDF draw: one uniform per row (cheap even for a 150k vocabulary).
            cdf_bV = probs_bV.double().cumsum_(dim=-1)
            u_b = torch.rand(len(self.rows), generator=generator, dtype=torch.float64, device=cdf_bV.device)
            for j, i in enumerate(self.rows):
                if i in row_gens:
                    u_b[j] = torch.rand((), generator=row_gens[i], dtype=torch.float64, device=cdf_bV.device)
            x_b1 = (u_b * cdf_bV[:, -1])[:, None]
            tok_b = torch.searchsorted(cdf_bV, x_b1, right=True).squeeze(1).clamp_max_(cdf_bV.shape[1] - 1)
            if self.any_greedy:
                tok_b = torch.where(self.greedy_b, logits_bV.argmax(dim=-1), tok_b)
        lp_b = logp_bV.gather(1, tok_b[:, None]).squeeze(1)
        return tok_b, lp_b

    def _filter(self, scaled_bV: torch.Tensor) -> torch.Tensor:
        """Mask (-inf) the tokens outside top-k, then outside the top-p nucleus of what is left."""
        V = scaled_bV.shape[-1]
        k_b = torch.where(self.top_k_b > 0, self.top_k_b.clamp(max=V), V)
        if not self.any_top_p:  # top-k only: a partial top-k is much cheaper than a full sort
            kmax = min(self.max_top_k, V)
            top_bK = scaled_bV.topk(kmax, dim=-1).values
            thresh_b1 = top_bK.gather(1, (k_b.clamp(max=kmax) - 1)[:, None])
            thresh_b1 = thresh_b1.masked_fill(self.top_k_b[:, None] <= 0, float("-inf"))
            return scaled_bV.masked_fill(scaled_bV < thresh_b1, float("-inf"))
        sorted_bV = scaled_bV.sort(dim=-1, descending=True).values
        if self.any_top_k:
            ranks_V = torch.arange(V, device=scaled_bV.device)
            sorted_bV = sorted_bV.masked_fill(ranks_V[None, :] >= k_b[:, None], float("-inf"))
        probs_bV = torch.softmax(sorted_bV, dim=-1)
        before_bV = probs_bV.cumsum(dim=-1) - probs_bV  # mass strictly above each rank
        n_keep_b = torch.minimum(k_b, (before_bV < self.top_p_b1).sum(dim=-1).clamp_min(1))
        thresh_b1 = sorted_bV.gather(1, (n_keep_b - 1)[:, None])
        return scaled_bV.masked_fill(scaled_bV < thresh_b1, float("-inf"))
