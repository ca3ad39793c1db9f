"""A pre-allocated KV cache and a `torch.compile`d one-token decode for LocalEngine's running batch.

`LocalEngine(compile=...)` ("false" | "true" | "auto", from `rollout.compile`) picks how the running
batch of engines/sampling.py decodes:

- "false": the running batch's cache is a growing `transformers.DynamicCache` (`DynamicKV` in
  sampling.py), eager forward passes. Today's path.
- "true": the cache lives in pre-allocated buffers (`StaticKV`): per layer, keys and values of
  shape (rows_bucket, kv_heads, len_bucket, head_dim), wrapped in a stock `StaticCache` whose
  layers write the new token at column `cumulative_length`. The one-token forward is
  `torch.compile(dynamic=False)`d, one graph per (rows, length) bucket (`DecodeGraphs`). If
  torch.compile is unavailable or a compilation fails, one warning names the cause and the same
  static path runs eagerly (same tokens and log-probs).
- "auto" (the config's default): the static cache. On CPU it is never compiled: measured on 2
  CPU cores (bench/compiled_decode.py, 8 rows, 32-token prompts + 64 tokens, torch 2.13), the tiny
  Llama compiles its one graph in 21 s (cold inductor cache; 3.6 s warm) and then samples 8.5k
  instead of 4.8k tokens/s; SmolLM2-135M compiles in 51 s for 49.0 instead of 43.8 tokens/s
  (+12%): 21k sampled tokens to pay back one bucket, and a run meets several buckets (rows x
  lengths), so compiling would slow every short run. The static cache alone, eager, is faster
  than the growing one (no copy of the whole cache per step: 64 rows, 118-token prompts, 64 new
  tokens: 8.7k vs 6.7k tokens/s). On CUDA each bucket is compiled once it has served
  `AUTO_COMPILE_AFTER` decode steps eagerly: the break-even, so that a bucket pays for its
  compile only once it has shown it is used that much (the ski-rental rule: never worse than
  twice the better choice made in hindsight). Measured on one H100 (bench/compiled_decode.py
  --device cuda, SmolLM2-135M, 32 rows, 200-token prompts + 40 tokens, torch 2.11, cold inductor
  cache): one bucket compiles in 46.6 s, then a step takes 18.8 instead of 39.3 ms, so the compile
  pays back after ~2,270 steps of that bucket. The HotpotQA recipe's GRPO decodes ~80 steps a
  GRPO step over 9 buckets, the busiest ~16 (counted on CPU over 4 steps): with the earlier
  threshold of 256 its buckets reached it from GRPO step ~16 on and compiled one after the other,
  ~47 s each, and the stage stood still for minutes (RESULTS.md, the recipe on a GPU); with 2048
  a 20-step run compiles nothing and a long run its busiest buckets after ~130 steps.

How the static cache keeps the batch's semantics: rows are left-padded to a common length L, as in
the DynamicCache path, so every row writes its next token at the same column L; the attention mask
(left padding and unused columns off) goes to the model as a ready 4D mask (bool for sdpa, additive
for eager attention), so masked columns weigh exactly 0 and the logits equal the DynamicCache
path's up to float reduction order (~1e-7 a step; tokens equal, log-probs within 1e-5 in the tests). Rows join (`merge`: the shorter side is shifted right),
leave (`select`: rows gathered to the front, columns no row attends to cut off the left) and the
buffers move to another bucket when the rows or columns outgrow it (or shrink to half of it;
to a quarter when eager, which computes only the rows and columns in use).
Bucket rows past the batch's rows are fed the pad token, attend to every column and are never
sampled. Weight updates copy into the model's parameters in place, which the compiled graphs take
as inputs, so they see the new weights. Models whose cache is not plain full attention (sliding
windows) or whose attention is not sdpa / eager keep the DynamicCache path (one warning says so).

Buckets: rows round up to a power of two (at least `MIN_ROWS`); lengths to 128, 256, 512, 1024,
then a multiple of 1024. Run the tests: `python -m pytest tests/integration/test_compiled_decode.py -q`.
"""

from __future__ import annotations

import logging
import time

import torch

__all__ = ["COMPILE_MODES", "MIN_ROWS", "AUTO_COMPILE_AFTER", "rows_bucket", "len_bucket", "decode_graphs", "DecodeGraphs",
           "StaticKV"]

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "true", "false")
MIN_ROWS = 4
SHRINK_EAGER = 4  # eager buffers shrink once the batch fits in a quarter of them (StaticKV._fit)
AUTO_COMPILE_AFTER = 2048  # decode steps a bucket serves eagerly before "auto" compiles it (CUDA only; the break-even)


def rows_bucket(n: int) -> int:
    """Rows of the buffers for `n` rows: a power of two, at least MIN_ROWS."""
    return max(MIN_ROWS, 1 << max(0, n - 1).bit_length())


def len_bucket(n: int) -> int:
    """Columns of the buffers for `n` columns: 128, 256, 512, 1024, then a multiple of 1024."""
    if n <= 1024:
        return max(128, 1 << max(0, n - 1).bit_length())
    return -(-n // 1024) * 1024


def decode_graphs(model: torch.nn.Module, mode: str | bool, device: torch.device) -> DecodeGraphs | None:
    """What LocalEngine(compile=mode) decodes with on `device`: None (the DynamicCache path) or the
    static cache's DecodeGraphs, compiling or not (see the module docstring)."""
    mode = ("true" if mode else "false") if isinstance(mode, bool) else str(mode).lower()
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "false":
        return None
    if mode == "auto" and torch.device(device).type != "cuda":  # the static cache without compiling (docstring)
        return DecodeGraphs(model, False)
    return DecodeGraphs(model, True, compile_after=AUTO_COMPILE_AFTER if mode == "auto" else 0)


class DecodeGraphs:
    """The one-token decode forward over a `StaticKV`, compiled per (rows, length) bucket (or
    eager). Lives on the engine, so its graphs outlive a batch."""

    def __init__(self, model: torch.nn.Module, compile: bool, *, compile_after: int = 0):
        self.model = model
        self.compile = compile
        self.compile_after = compile_after  # eager decode steps per bucket before it is compiled
        self.warned = False
        self.steps: dict[tuple[int, int], int] = {}  # decode steps served per bucket
        self.compiled: dict[tuple[int, int], float] = {}  # bucket -> seconds its first compiled call took
        self.attn = getattr(model.config, "_attn_implementation", None)
        self._compiled_fn = None
        if compile:
            why = _compile_unavailable()
            if why:
                self._give_up(why)
            else:
                from torch import _dynamo

                cfg = _dynamo.config
                for key in ("recompile_limit", "cache_size_limit"):  # one graph per bucket, not "too many recompiles"
                    if hasattr(cfg, key):
                        setattr(cfg, key, max(getattr(cfg, key), 64))
                self._compiled_fn = torch.compile(self._forward, dynamic=False)

    def supports(self, cache) -> bool:
        """Whether a prefill's DynamicCache can move into static buffers (plain full-attention
        layers, sdpa or eager attention)."""
        from transformers.cache_utils import DynamicLayer

        if self.attn in ("sdpa", "eager") and all(type(layer) is DynamicLayer for layer in cache.layers):
            return True
        if not self.warned:
            self.warned = True
            kinds = sorted({type(layer).__name__ for layer in cache.layers})
            log.warning("rollout.compile: this model (attention %s, cache layers %s) keeps the DynamicCache decode; "
                        "the static cache needs sdpa or eager attention without sliding windows", self.attn, ", ".join(kinds))
        return False

    def _forward(self, ids_R1, mask_R11C, pos_R1, cache):
        out = self.model(input_ids=ids_R1, attention_mask=mask_R11C, position_ids=pos_R1, past_key_values=cache,
                         use_cache=True)
        return out.logits[:, -1, :]

    def __call__(self, ids_R1, mask_R11C, pos_R1, cache, reset) -> torch.Tensor:
        """Logits (R, V) of the next token; `reset()` puts the cache's write column back (a failed
        compiled call is run again eagerly)."""
        key = (ids_R1.shape[0], mask_R11C.shape[-1])
        n = self.steps.get(key, 0)
        self.steps[key] = n + 1
        if self._compiled_fn is None or n < self.compile_after:
            return self._forward(ids_R1, mask_R11C, pos_R1, cache)
        t0 = time.perf_counter()
        try:
            out = self._compiled_fn(ids_R1, mask_R11C, pos_R1, cache)
        except Exception as e:  # noqa: BLE001 - any compiler failure: warn once, decode eagerly
            self._give_up(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300])
            reset()
            return self._forward(ids_R1, mask_R11C, pos_R1, cache)
        if key not in self.compiled:
            self.compiled[key] = time.perf_counter() - t0
        return out

    def _give_up(self, why: str) -> None:
        self._compiled_fn = None
        if not self.warned:
            self.warned = True
            log.warning("rollout.compile: torch.compile is not used (%s); decoding eagerly over the static KV cache", why)


def _compile_unavailable() -> str | None:
    """Why torch.compile cannot run here, or None."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        from torch import _dynamo

        if not _dynamo.is_dynamo_supported():
            return "torch.compile does not support this Python"
    except Exception as e:  # noqa: BLE001
        return f"torch._dynamo does not import: {e}"
    return None


class StaticKV:
    """The running batch's KV cache in pre-allocated (rows_bucket, kv_heads, len_bucket, head_dim)
    buffers, its attention mask, and the decode forward over them (see the module docstring).

    Rows 0..n-1 are the batch's rows in cache order; columns 0..L-1 hold their (left-padded)
    tokens; the next decode writes column L."""

    def __init__(self, graphs: DecodeGraphs, pad_id: int):
        self.g, self.pad_id = graphs, pad_id
        self.n = self.L = self.R = self.C = 0
        self.cache = None  # a StaticCache over the buffers
        self.mask_RC: torch.Tensor | None = None  # bool: row attends to column; bucket rows past n attend to all

    # -- buffers
    def _alloc(self, R: int, C: int, like) -> None:
        """Move to buffers of R rows x C columns, keeping rows [0, n) and columns [0, L)."""
        from transformers import StaticCache

        cfg = self.g.model.config
        cache = StaticCache(config=cfg, max_cache_len=C)
        old = self.cache.layers if self.cache is not None else [None] * len(like)
        n, L = self.n, self.L
        for layer, src, o in zip(cache.layers, like, old):
            _, H, _, Dk = src.keys.shape
            Dv = src.values.shape[-1]
            layer.keys = src.keys.new_zeros(R, H, C, Dk)
            layer.values = src.values.new_zeros(R, H, C, Dv)
            if o is not None and n and L:
                layer.keys[:n, :, :L] = o.keys[:n, :, :L]
                layer.values[:n, :, :L] = o.values[:n, :, :L]
            layer.dtype, layer.device = layer.keys.dtype, layer.keys.device
            layer.batch_size, layer.num_heads, layer.k_head_dim, layer.v_head_dim = R, H, Dk, Dv
            layer.cumulative_length = torch.zeros((), dtype=torch.long, device=layer.device)
            layer.is_initialized = True
        mask = torch.ones(R, C, dtype=torch.bool, device=like[0].keys.device)
        mask[:n] = False
        if self.mask_RC is not None and n and L:
            mask[:n, :L] = self.mask_RC[:n, :L]
        self.cache, self.mask_RC, self.R, self.C = cache, mask, R, C

    def _fit(self, rows: int, cols: int, like) -> None:
        """Buckets for `rows` rows and `cols` columns (+1 for the next token): grow when they do not
        fit; shrink when they would fit in half the buffers (compiled: the bucket is the graph's
        shape) or in 1/SHRINK_EAGER of them (eager: only the rows and columns in use are computed,
        so a smaller buffer saves memory only, and a batch whose rows come and go would otherwise
        reallocate and zero-fill its buffers at every join)."""
        R, C = rows_bucket(rows), len_bucket(cols + 1)
        k = 2 if self.g.compile else SHRINK_EAGER
        if R > self.R or C > self.C or R * k <= self.R or C * k <= self.C:
            self._alloc(R, C, like)

    # -- the batch's operations
    def merge(self, cache, mask_nL: torch.Tensor) -> None:
        """Append the rows of a prefill's DynamicCache (mask (m, Ln), left-padded) after the
        running ones; the shorter side is shifted right (left-padded) to the longer one's length."""
        new = cache.layers
        m, Ln = mask_nL.shape
        n, L = self.n, self.L
        L2 = max(L, Ln)
        self._fit(n + m, L2, new)
        layers = self.cache.layers
        if L2 > L and n:  # the running rows get (L2 - L) more columns of left padding
            d = L2 - L
            for layer in layers:
                layer.keys[:n, :, d:L2] = layer.keys[:n, :, :L].clone()
                layer.values[:n, :, d:L2] = layer.values[:n, :, :L].clone()
            self.mask_RC[:n, d:L2] = self.mask_RC[:n, :L].clone()
            self.mask_RC[:n, :d] = False
        for layer, src in zip(layers, new):
            layer.keys[n : n + m, :, L2 - Ln : L2] = src.keys
            layer.values[n : n + m, :, L2 - Ln : L2] = src.values
        self.mask_RC[n : n + m] = False
        self.mask_RC[n : n + m, L2 - Ln : L2] = mask_nL.bool()
        self.n, self.L = n + m, L2

    def select(self, keep_t: torch.Tensor) -> None:
        """Keep the rows `keep_t` (cache order, ascending) and drop the left columns none of them
        attends to. Rows before the first dropped one stay in place unless columns are dropped."""
        k, L = len(keep_t), self.L
        mask_kL = self.mask_RC[keep_t, :L]
        first = int(mask_kL.any(dim=0).nonzero()[0])
        i0 = 0  # the first row that moves: every row when columns are cut, else the first whose index changes
        if not first:
            moved = (keep_t != torch.arange(k, device=keep_t.device)).nonzero()
            i0 = int(moved[0]) if len(moved) else k
        if i0 < k:
            src = keep_t[i0:]
            for layer in self.cache.layers:  # the gather copies before the write: overlapping rows are safe
                layer.keys[i0:k, :, : L - first] = layer.keys[src, :, first:L]
                layer.values[i0:k, :, : L - first] = layer.values[src, :, first:L]
        self.mask_RC[:k, : L - first] = mask_kL[:, first:]
        self.mask_RC[:k, L - first :] = False
        self.mask_RC[k:] = True
        self.n, self.L = k, L - first
        self._fit(k, self.L, self.cache.layers)

    def row(self, j: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row j's keys and values at the columns it attends to, per layer `(kv_heads, n, head_dim)` (copies)."""
        cols = self.mask_RC[j, : self.L]
        return [(layer.keys[j, :, : self.L][:, cols].clone(), layer.values[j, :, : self.L][:, cols].clone())
                for layer in self.cache.layers]

    def forward(self, tok_b: torch.Tensor, pos_b1: torch.Tensor) -> torch.Tensor:
        """One forward of every row's last token (written at column L): the next logits (n, V)."""
        n, L = self.n, self.L
        if L + 1 > self.C:
            self._fit(n, L, self.cache.layers)
        self.mask_RC[:n, L] = True
        ids_R1 = torch.full((self.R, 1), self.pad_id, dtype=torch.long, device=tok_b.device)
        ids_R1[:n, 0] = tok_b
        pos_R1 = torch.zeros((self.R, 1), dtype=torch.long, device=tok_b.device)
        pos_R1[:n] = pos_b1
        mask = self.mask_RC[:, None, None, :]
        if self.g.attn == "eager":
            dtype = self.cache.layers[0].keys.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)

        def reset():
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(L)

        reset()
        if self.g.compile:  # a compiled graph wants the bucket's fixed shapes
            logits_RV = self.g(ids_R1, mask, pos_R1, self.cache, reset)
        else:  # eager: only the n rows and L + 1 columns in use (views of the buffers, written in place)
            logits_RV = self._eager_exact(ids_R1[:n], mask[:n, ..., : L + 1], pos_R1[:n], reset)
        self.L = L + 1
        return logits_RV[:n]

    def _eager_exact(self, ids, mask, pos, reset) -> torch.Tensor:
        n, cols = ids.shape[0], mask.shape[-1]
        layers = self.cache.layers
        full = [(layer.keys, layer.values) for layer in layers]
        try:
            for layer in layers:
                layer.keys, layer.values = layer.keys[:n, :, :cols], layer.values[:n, :, :cols]
            return self.g(ids, mask, pos, self.cache, reset)
        finally:
            for layer, (k, v) in zip(layers, full):
                layer.keys, layer.values = k, v
