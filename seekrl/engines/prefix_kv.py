"""LocalEngine's KV cache across the turns of an episode (`rollout.reuse_kv_tokens`).

A multi-turn episode asks the engine once per turn, each time with the whole history: the last
prompt, the tokens it sampled, the tool's output. Without this store every turn prefills that
history again. With it, a request that ends (stop or length) leaves the keys and values of its
prompt and of all but its last sampled token (the last was never fed through the model) here,
keyed by those token ids. A later request whose prompt starts with such a key takes the entry
and prefills only what follows it (engines/sampling.py `Batch.add`); its logits equal a full
prefill's to float rounding, so it samples the same tokens (tested against a full re-prefill).

Each entry serves as many later requests as finished requests left it: the samples of a group
often sample the same turn (a low-entropy policy writes the same query), and each of their next
turns reuses the one stored copy (one copy of the keys and values, counted once against the
budget). Requests with the same prompt that join a batch together feed their new tokens once.

First turns share no finished request, but prompts written from one template share its text
(the instruction before the question: ~140 of a HotpotQA prompt's ~160 tokens). When a prompt
misses and shares at least `SHARED_MIN_TOKENS` leading tokens with the previous prompt that
missed, the engine prefills that common part once and pins it here (`pin`): a pinned entry serves
every later prompt that starts with it without being used up (`take`), until the weights change
or the budget pushes it out (a hit moves it to the back of the queue).

The store holds at most `max_tokens` tokens (oldest entries dropped first) and is emptied
whenever the engine's weights change (`LocalEngine.update_weights`): keys and values computed by
other weights are not what a prefill would give. Requests that were aborted or retracted leave
nothing behind.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

__all__ = ["PrefixKV", "PrefixEntry", "SHARED_MIN_TOKENS"]

SHARED_MIN_TOKENS = 32  # a common start shorter than this is not worth a forward pass of its own


@dataclass
class PrefixEntry:
    """The keys and values of `length` tokens, one `(keys, values)` pair per layer, each
    `(kv_heads, length, head_dim)`."""

    length: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    uses: int = 1  # finished requests that left these tokens: later requests it can still serve
    pinned: bool = False  # a template's shared start (`PrefixKV.pin`): serves any number of requests


class PrefixKV:
    """Finished requests' keys and values, looked up by the longest stored prefix of a new prompt."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"PrefixKV needs max_tokens >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.tokens = 0
        self._entries: collections.OrderedDict[tuple[int, ...], PrefixEntry] = collections.OrderedDict()
        self._lengths: collections.Counter[int] = collections.Counter()  # stored key lengths, for the lookup
        self.stats = {"stored": 0, "hits": 0, "misses": 0, "reused_tokens": 0, "dropped": 0, "pinned": 0}
        self._last_miss: list[int] | None = None  # the previous prompt that found no stored prefix

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ids: list[int], layers) -> None:
        """Keep the keys and values of `ids` (at least one token, at most max_tokens); `layers` is
        the `(keys, values)` pairs or a function that returns them (called only for a new key; None:
        nothing is stored).
        The same ids again add one use to the stored entry."""
        key = tuple(ids)
        if not key or len(key) > self.max_tokens:
            return
        if key in self._entries:
            self._entries[key].uses += 1
            self.stats["stored"] += 1
            return
        layers = layers() if callable(layers) else layers
        if layers is None:  # (a cache that cannot be stored: sliding-window layers keep only their window)
            return
        while self.tokens + len(key) > self.max_tokens:
            self._drop(next(iter(self._entries)))
            self.stats["dropped"] += 1
        self._entries[key] = PrefixEntry(len(key), layers)
        self._lengths[len(key)] += 1
        self.tokens += len(key)
        self.stats["stored"] += 1

    def take(self, prompt: list[int], requests: int = 1, prefill=None) -> PrefixEntry | None:
        """The entry of the longest stored key that is a proper prefix of `prompt`, for `requests`
        requests with that prompt (their uses are spent; an entry with none left is removed), else
        the first tokens of a stored key that extends `prompt` (`_extending`), or None. `prefill(ids)`, when given, returns the keys and values of `ids`: a prompt that finds
        nothing but shares its start with the previous prompt that did not (`shared_start`) pins
        that start and takes it."""
        entry = self._longest(prompt, requests)
        if entry is None and prefill is not None:
            n = self.shared_start(prompt)
            if n:
                self.pin(prompt[:n], lambda: prefill(prompt[:n]))
                entry = self._longest(prompt, requests)
        if entry is None:
            self.stats["misses"] += requests
        return entry

    def _longest(self, prompt: list[int], requests: int) -> PrefixEntry | None:
        for n in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            key = tuple(prompt[:n])
            if key in self._entries:
                entry = self._entries[key]
                if entry.pinned:
                    self._entries.move_to_end(key)
                else:
                    entry.uses -= requests
                    if entry.uses <= 0:
                        self._drop(key)
                self.stats["hits"] += requests
                self.stats["reused_tokens"] += n * requests
                return entry
        return self._extending(prompt, requests)

    def _extending(self, prompt: list[int], requests: int) -> PrefixEntry | None:
        """A stored key that starts with the whole of `prompt` serves its first len(prompt) - 1
        tokens (a view; the last prompt token is fed, for its logits): a later turn sampled again
        from a context that a finished request continued (rollout.answer_branches). Its uses are
        not spent: the entry still serves the continuation of its own request."""
        n = len(prompt) - 1
        if n < 1:
            return None
        head = tuple(prompt)
        for key, entry in self._entries.items():
            if len(key) >= len(prompt) and key[: len(prompt)] == head:
                self.stats["hits"] += requests
                self.stats["reused_tokens"] += n * requests
                return PrefixEntry(n, entry.layers, uses=0, pinned=True)
        return None

    def shared_start(self, prompt: list[int], min_tokens: int = SHARED_MIN_TOKENS) -> int:
        """For a prompt that `take` missed: how many leading tokens it shares with the previous
        prompt that missed (at least `min_tokens`, and fewer than its own length), else 0. It
        becomes the previous miss."""
        last, self._last_miss = self._last_miss, list(prompt)
        if last is None:
            return 0
        n = 0
        for a, b in zip(last, prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1, self.max_tokens)
        return n if n >= min_tokens else 0

    def pin(self, ids: list[int], layers) -> None:
        """Keep `ids`' keys and values for any number of requests (a template's shared start)."""
        self.put(ids, layers)
        key = tuple(ids)
        if key in self._entries:
            self._entries[key].pinned = True
            self.stats["pinned"] += 1

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0
        self._last_miss = None

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]
        self.tokens -= len(key)
