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

The running batch (prefill, KV-cache merge, one sampling step, compaction) and the row sampler
live in engines/sampling.py; this module holds the queue, the controls and the weights.
`compile="auto"|"true"` (rollout.compile; "auto" is the config's default) keeps the running
batch's KV cache in pre-allocated buffers; "true" (and "auto" on CUDA) also `torch.compile`s its
one-token decode, one graph per (rows, length) bucket (engines/static_decode.py; same tokens and
log-probs as the growing-cache "false" path, the constructor's default). Weight updates copy
into the parameters in place, so compiled graphs see them.

`reuse_kv_tokens` (rollout.reuse_kv_tokens) > 0 keeps the keys and values of finished requests
for the next turn of their episode, so that turn prefills only the new tokens (engines/prefix_kv.py).

Run the tests: `python -m pytest tests/integration/test_local_engine.py tests/integration/test_engine_control.py
tests/integration/test_compiled_decode.py -q`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import glob
import os
import threading
import time

import torch

from seekrl.engines.base import text_decoder
from seekrl.engines.prefix_kv import PrefixKV
from seekrl.engines.sampling import Batch, Request, joined
from seekrl.engines.static_decode import decode_graphs
from seekrl.types import Completion, SamplingParams

__all__ = ["LocalEngine", "PAUSE_MODES"]


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

    exact_logprobs = True  # the trainer's own code and weights (fp32 to 1e-4; see base.py); an instance in another dtype says False

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        max_batch_size: int = 64,
        seed: int = 0,
        version: int = 0,
        compact_fraction: float = 0.25,
        compile: str | bool = "false",
        reuse_kv_tokens: int = 0,
        exact_logprobs: bool = True,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.exact_logprobs = exact_logprobs  # False: weights in another dtype than the trainer's (engine.dtype)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.compact_fraction = compact_fraction
        self.version = version
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # None ("false"): DynamicCache decode; else the static KV cache and its compiled decode (static_decode.py)
        self.decode_graphs = decode_graphs(model, compile, self.device)
        # finished requests' keys and values for the next turn of their episode (engines/prefix_kv.py); None: off
        self.prefix_kv = PrefixKV(reuse_kv_tokens) if reuse_kv_tokens > 0 else None
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
        self.decode_text = text_decoder(tokenizer)  # ids -> text, specials kept (stop strings)
        self.stats = {
            "batches": 0, "requests": 0, "tokens": 0, "forward_steps": 0, "prefill_tokens": 0, "seconds": 0.0, "aborted": 0,
            "joined": 0, "max_rows": 0,
        }
        self._inbox: collections.deque[Request] = collections.deque()  # waiting requests (thread-safe ends)
        self._draining = 0  # update_weights waits for the batch in flight: no request may join it
        self._live: set[Request] = set()  # queued or running requests, for abort()
        self._go = threading.Event()  # cleared by pause("in_place"): the sampling thread parks between steps
        self._go.set()
        self._parked = threading.Event()  # set while the sampling thread is parked
        self._busy = False  # a batch is being sampled (or about to be)
        self.retracting = False  # set by pause("retract"): the batch in flight ends at its next step (the batch reads it)
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
        req = Request([int(i) for i in prompt_ids], params, loop.create_future(), rid)
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
            self._forget_prefixes()
            return
        self._draining += 1  # the batch in flight takes no new requests, so it ends
        try:
            async with self._lock:
                if source is not self.model:
                    await asyncio.to_thread(self._load_weights, source)
                self.version = int(version)
                self._forget_prefixes()
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
            self.retracting = True

    def resume(self) -> None:
        self._paused = False
        self.retracting = False
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

    def _forget_prefixes(self) -> None:
        """New weights (shared ones change in place): stored keys and values are no longer a prefill's."""
        if self.prefix_kv is not None:
            self.prefix_kv.clear()

    def state_dict(self) -> dict:
        """The version and the sampling generator's state (a uint8 tensor), for checkpoints."""
        return {"version": self.version, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])
        self._forget_prefixes()
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

    def _finish(self, req: Request, c: Completion | BaseException) -> None:
        """Answer a request (on the loop's thread); a retracted one goes back to the queue's front."""
        if req.future.done():
            return
        if isinstance(c, BaseException):
            req.future.set_exception(c)
            return
        c = joined(req.done, c)
        if c.finish_reason == "retract":
            req.done = dataclasses.replace(c, finish_reason="abort")
            self._inbox.appendleft(req)
            self._wake.set()
        else:
            req.future.set_result(c)

    def deliver(self, req: Request, c: Completion | BaseException) -> None:
        """From the sampling thread: answer `req` as soon as its row is done (not at batch end)."""
        self._loop.call_soon_threadsafe(self._finish, req, c)

    def _take(self, room: int) -> list[Request]:
        """From the sampling thread: up to `room` waiting requests, unless paused or draining."""
        out: list[Request] = []
        while len(out) < room and not self._paused and not self._draining:
            try:
                r = self._inbox.popleft()
            except IndexError:
                break
            if r.future.done():  # its caller went away
                continue
            if r.aborted:
                self.stats["aborted"] += 1
                self.deliver(r, Completion([], [], "abort", self.version))
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
        batch = Batch(self)
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
                    self.deliver(row.req, e)
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
