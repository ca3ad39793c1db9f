"""Interruptible generation: a weight update cuts the turns in flight, and they continue under the
new weights from the tokens they already sampled.

    engine = InterruptibleEngine(inner, decode=text_decoder(tokenizer))   # engines/base.py
    c = await engine.generate(prompt_ids, params)          # what workflows call, as on any engine
    await engine.update_weights(model, version)            # pause("abort") -> load -> resume

`update_weights` pauses the inner engine with "abort": every request in flight comes back at once
with the tokens it has sampled (finish "abort", each token stamped with its version). `generate`
sees that the abort came from an update, waits until the new weights are in, and resubmits the
turn as prompt + tokens so far, with `max_new_tokens` less those tokens and `seed_offset` more,
so a seeded request draws the same uniforms as if it had never been cut (engines/sampling.py).
The caller gets one Completion: the tokens of every part, their log-probs, and per-token
versions that may span two or more policy versions. Works with any InferenceEngine (local or
remote); with LocalEngine the continued turn samples exactly the tokens and log-probs (to float
noise) of an uncut one under the same weights (tests/integration/test_async_rollout.py).

A stop string may span the cut ("</sea" before it, "rch>" after): the continued request cannot
see it, so the joined completion is checked across the cut and ends at the token that completes
it, as the uncut request would have. An abort that did not come from an update (the engine shut
down, a caller's abort) is returned as it is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import torch

from seekrl.engines.base import InferenceEngine, stop_window
from seekrl.types import Completion, SamplingParams

__all__ = ["InterruptibleEngine"]


class InterruptibleEngine:
    """Wraps an InferenceEngine: weight updates interrupt turns in flight, which then continue."""

    def __init__(self, engine: InferenceEngine, decode=None):
        self.engine = engine
        self.decode = decode  # ids -> text (without skipping specials), for stop strings that span a cut
        self.interrupted = 0  # turns cut by a weight update (and continued), over the run
        self._epoch = 0  # weight updates started
        self._updating = False
        self._ready: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
            self._ready.set()
        return self._ready

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, rid: str | None = None) -> Completion:
        tokens: list[int] = []
        logps: list[float] = []
        vers: list[int] = []
        ready = self._event()
        while True:
            await ready.wait()
            epoch = self._epoch
            p = params
            if tokens:
                p = dataclasses.replace(params, max_new_tokens=params.max_new_tokens - len(tokens),
                                        seed_offset=params.seed_offset + len(tokens))
            c = await self.engine.generate(list(prompt_ids) + tokens, p, rid=rid)
            new, new_lp, new_v = list(c.token_ids), list(c.logprobs), c.token_versions()
            reason = c.finish_reason
            if tokens and params.stop and self.decode is not None:
                cut = _stop_across(self.decode, tokens, new, params.stop)
                if cut is not None:
                    new, new_lp, new_v, reason = new[:cut], new_lp[:cut], new_v[:cut], "stop"
            tokens += new
            logps += new_lp
            vers += new_v
            if reason == "abort" and (self._updating or self._epoch != epoch):
                self.interrupted += 1
                if len(tokens) >= params.max_new_tokens:
                    reason = "length"
                else:
                    continue
            version = vers[0] if vers else c.version
            same = all(v == version for v in vers)
            return Completion(tokens, logps, reason, version, None if same else vers)

    async def update_weights(self, source: torch.nn.Module | str | os.PathLike, version: int) -> None:
        """Cut the turns in flight (pause "abort"), install the weights, and let the turns continue."""
        ready = self._event()
        self._epoch += 1
        self._updating = True
        ready.clear()
        self.engine.pause("abort")
        try:
            await self.engine.update_weights(source, version)
        finally:
            self.engine.resume()
            self._updating = False
            ready.set()

    # the rest of the InferenceEngine protocol is the wrapped engine's
    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def exact_logprobs(self) -> bool:
        return self.engine.exact_logprobs

    def pause(self, mode: str = "hold") -> None:
        self.engine.pause(mode)

    def resume(self) -> None:
        self.engine.resume()

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics()

    def state_dict(self) -> dict:
        return self.engine.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.engine.load_state_dict(state)

    def close(self) -> None:
        self.engine.close()


def _stop_across(decode, before: list[int], new: list[int], stops) -> int | None:
    """How many of `new` to keep when a stop string starts in `before` and ends in `new` (None: none
    does). Only the first tokens after the cut can complete one; as the engine does, each check
    decodes the last `stop_window(stops)` tokens."""
    stops = tuple(s for s in stops if s)
    if not stops:
        return None
    window = stop_window(stops)
    for j in range(min(len(new), window)):
        text = decode((before + new[: j + 1])[-window:])
        if any(s in text for s in stops):
            return j + 1
    return None
