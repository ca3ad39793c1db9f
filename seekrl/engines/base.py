"""The InferenceEngine protocol: what workflows call to sample, and what the trainer calls to sync.

Every engine (local transformers, remote servers, vLLM) honours the same contract:

Tokens in, tokens out
    `generate(prompt_ids, params)` takes the prompt as token ids and returns exactly the sampled
    token ids; text is decoded from ids by the caller, never re-tokenized. Concurrent calls may
    be batched together by the engine: callers just `await` (e.g. with `asyncio.gather`).

What is in `Completion.token_ids`
    All sampled tokens, in order. A completion that ends on EOS *includes* the EOS token (it was
    sampled, and the trainer trains on it; `finish_reason="stop"`). A completion that ends on a
    stop string includes the token that completed it, so the stop string is in the decoded text
    (Search-R1 parses `</search>`; `finish_reason="stop"`). A completion that ran out of
    `max_new_tokens` has exactly that many tokens (`finish_reason="length"`).

Log-prob semantics
    `logprobs[i] = log_softmax(logits_i / T)[token_i]`, computed in float32, where `logits_i` are
    the model's logits at the position that predicted token i and T is the request's
    temperature (T = 1 for greedy, temperature 0). It is the *unfiltered* temperature-scaled
    distribution: top-p / top-k only decide which token is drawn, not its log-prob. This is
    exactly what a trainer recomputes with `log_softmax(model(ids).logits / T)`, so with the same
    weights the importance ratio is 1 up to numerical noise.

Versions
    `version` is the policy version whose weights sample the next tokens. Every sampled token is
    stamped with the version of the weights that computed its logits: `Completion.version` is the
    first token's, `Completion.versions` lists one per token when a call spans a weight update
    (else None; `Completion.token_versions()` gives the list either way).
    `update_weights(source, version)` installs new weights (an `nn.Module` or a folder of
    *.safetensors) and sets `version`. It waits for the batch in flight, unless the engine is
    paused in place, when it swaps the weights under the parked batch.

Control
    `pause(mode)` holds new requests back until `resume()`: "hold" lets the batch in flight
    finish; "abort" ends every request in flight with its tokens so far (finish "abort");
    "retract" stops the batch in flight and requeues its requests with their tokens so far
    (after `resume()` they are prefilled again and continue); "in_place" parks the batch in
    flight between two steps. (RemoteEngine.pause holds new requests in the client; the servers
    are paused by its `update_weights`.) `generate(..., rid=...)` names a request (LocalEngine.abort(rid) ends it);
    cancelling the awaiting caller drops its request.

Exact log-probs
    `exact_logprobs` is True when the engine's log-probs equal what the trainer recomputes on the
    same weights (LocalEngine; seekrl's own fp32 servers started by the run): then the trainer may
    reuse them as the old log-probs (train.recompute_logprobs=auto). SGLang and vLLM compute in
    other kernels and precisions: their log-probs are recomputed.

Run state
    `metrics()` gives counters for the run's metrics (`engine/...`), `state_dict()` /
    `load_state_dict()` what a checkpoint keeps (the version, a local sampler's state), `close()`
    releases what the engine holds (the servers a run started).
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import torch

from seekrl.types import Completion, SamplingParams

__all__ = ["InferenceEngine", "text_decoder", "stop_window"]


@runtime_checkable
class InferenceEngine(Protocol):
    """Samples completions for token prompts and receives new policy weights. See module docstring."""

    version: int
    exact_logprobs: bool  # its log-probs equal the trainer's recomputation on the same weights (so they may be reused)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, rid: str | None = None) -> Completion: ...

    async def update_weights(self, source: torch.nn.Module | str | os.PathLike, version: int) -> None: ...

    def pause(self, mode: str = "hold") -> None: ...

    def resume(self) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def text_decoder(tokenizer):
    """ids -> text with special tokens kept, as engines decode to look for stop strings (the fast
    `backend_tokenizer` when the tokenizer has one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


def stop_window(stops) -> int:
    """How many of the last tokens to decode, after each new one, to find any of `stops`: the
    longest stop string's characters + 4 (a token is at least one character)."""
    return max((len(x) for x in stops if x), default=0) + 4
