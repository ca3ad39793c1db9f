"""The sampling thread's machinery behind LocalEngine (engines/local.py): the running batch.

`Batch` holds the rows being sampled, their KV cache, next positions and the logits of their next
token. The cache is a `DynamicKV` (a growing `transformers.DynamicCache` and its attention mask,
left padding 0) or, with `LocalEngine(compile="true"|"auto")`, a `StaticKV` (pre-allocated buffers
and a `torch.compile`d decode, engines/static_decode.py); both offer `merge` (rows of a prefill
join: the shorter side is left-padded), `select` (finished rows leave; left columns no row
attends to are cut off) and `forward` (one token per row). Rows are added by a prefill (each
distinct prompt once, its cache expanded to the rows that share it; always eager, DynamicCache)
and merged into the running cache (continuous batching). `_RowSampler` draws one token per row
(temperature / top-k / top-p per row, an inverse-CDF draw from the engine's generator or the row's
own seeded one) and returns its log-prob under log_softmax(logits / T).
Everything here runs on LocalEngine's sampling thread; rows are answered through the engine's
`deliver` (thread-safe) as soon as they end.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

import torch

from seekrl.engines.base import stop_window
from seekrl.engines.prefix_kv import PrefixEntry, PrefixKV
from seekrl.engines.static_decode import StaticKV
from seekrl.types import Completion, SamplingParams

__all__ = ["Request", "BatchHost", "Batch", "DynamicKV", "joined"]


@dataclasses.dataclass(eq=False)
class Request:
    """One generate call, as the sampling thread sees it."""

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


class BatchHost(Protocol):
    """What the running batch needs from its engine (LocalEngine): the model and its settings, the
    engine's counters and generator, and how to answer a request."""

    model: torch.nn.Module
    device: torch.device
    pad_id: int
    eos_ids: set[int]
    generator: torch.Generator
    stats: dict
    compact_fraction: float
    decode_graphs: object  # static_decode.DecodeGraphs or None (the growing DynamicCache)
    prefix_kv: PrefixKV | None  # finished requests' keys and values for their next turn (engines/prefix_kv.py), or None
    retracting: bool  # set by pause("retract"): the batch in flight ends at its next step

    def decode_text(self, ids: list[int]) -> str: ...

    def deliver(self, req: Request, c: Completion | BaseException) -> None: ...


@dataclasses.dataclass(eq=False)
class _Row:
    """One request in the running batch: what it has sampled so far, and how it ends."""

    req: Request
    i: int  # its index in the batch's `params` (the row sampler and seeded generators key on it)
    params: SamplingParams
    enders: set[int]  # token ids that end it (EOS unless ignore_eos, stop_token_ids)
    stops: tuple[str, ...]
    window: int  # tokens decoded to look for a stop string
    prefix: list[int]  # tail of the tokens sampled before a retract (a stop string may span the cut)
    prompt: list[int]  # what was prefilled for it (its prompt, plus the tokens before a retract)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logps: list[float] = dataclasses.field(default_factory=list)
    vers: list[int] = dataclasses.field(default_factory=list)
    reason: str | None = None
    fwd: int = 0  # version of the weights whose forward pass gave the row's current logits


class Batch:
    """The sampling thread's running batch: rows in KV-cache order, their cache (`kv`: DynamicKV
    or StaticKV), next positions and the logits of their next token.

    Rows are added by a prefill (each distinct prompt once, its cache expanded to the rows that
    share it) and merged into the running cache by left-padding the shorter of the two caches;
    finished rows are dropped from the cache (`compact`), and columns that no row attends to any
    more are cut off the left, so a long-lived batch does not grow without bound."""

    def __init__(self, engine: BatchHost):
        self.e, self.dev = engine, engine.device
        self.rows: list[_Row] = []  # in cache order; finished rows ride along until compacted
        self.all_rows: list[_Row] = []
        self.params: list[SamplingParams] = []
        self.gens: dict[int, torch.Generator] = {}
        self.kv: DynamicKV | StaticKV | None = None
        self.pos_b1 = self.logits_bV = self.tok_b = None
        self.sampler: _RowSampler | None = None
        self.done = 0  # finished rows still in the cache
        self.can_join = True  # left-padding merges need plain DynamicLayer caches (no sliding windows)

    def active(self) -> int:
        return len(self.rows) - self.done

    # -- adding rows
    def add(self, reqs: list[Request], version: int) -> None:
        if not reqs:
            return
        e, dev = self.e, self.dev
        fresh: list[tuple[_Row, list[int]]] = []
        same: dict[tuple[int, ...], list[tuple[_Row, list[int]]]] = {}  # rows by prompt
        for r in reqs:
            prompt, p = r.remaining()
            i = len(self.params)
            self.params.append(p)
            stops = tuple(x for x in p.stop if x)
            row = _Row(r, i, p, set(p.stop_token_ids) | (set() if p.ignore_eos else e.eos_ids), stops,
                       stop_window(stops), list(r.done.token_ids[-64:]) if r.done else [], prompt)
            if p.seed is not None and p.temperature > 0:
                g = torch.Generator(device=dev)
                g.manual_seed(int(p.seed))
                if r.gen_state is not None:  # a retracted request goes on drawing where it stopped
                    g.set_state(r.gen_state)
                else:  # a continued turn (seed_offset tokens sampled before it was cut): skip their draws
                    for _ in range(int(p.seed_offset)):
                        torch.rand((), generator=g, dtype=torch.float64, device=dev)
                self.gens[i] = g
            row.fwd = version
            same.setdefault(tuple(prompt), []).append((row, prompt))
        # rows with the same prompt take a stored prefix together and feed their new tokens once
        reused: list[tuple[list[_Row], list[int], PrefixEntry]] = []
        for group in same.values():
            prompt = group[0][1]
            # (a template's start that the previous missing prompt shares is prefilled once and pinned)
            entry = e.prefix_kv.take(prompt, len(group), prefill=self._prefill_start) if e.prefix_kv is not None else None
            if entry is not None:
                reused.append(([row for row, _ in group], prompt, entry))
            else:
                fresh.extend(group)
        self.all_rows.extend([row for row, _ in fresh] + [row for rows, _, _ in reused for row in rows])
        e.stats["requests"] += len(reqs)
        if fresh:
            self._prefill(fresh)
        # rows with similar rests go together: a chunk's rows re-feed at most half its longest rest
        reused.sort(key=lambda x: len(x[1]) - x[2].length, reverse=True)
        while reused:
            longest = len(reused[0][1]) - reused[0][2].length
            n = next((j for j, (_, p, entry) in enumerate(reused) if 2 * (len(p) - entry.length) < longest), len(reused))
            self._continue(reused[:n])
            reused = reused[n:]
        self.sampler = _RowSampler(self.params, [r.i for r in self.rows], dev)
        e.stats["max_rows"] = max(e.stats["max_rows"], self.active())

    def _prefill(self, fresh: list[tuple[_Row, list[int]]]) -> None:
        """Prefill the prompts of `fresh` rows (each distinct prompt once) and merge them in."""
        e, dev = self.e, self.dev
        prompts = [p for _, p in fresh]
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
        self._merge_rows(cache, out.logits[:, -1, :], mask_uL, row_u, [len(p) for p in prompts])
        self.rows.extend(row for row, _ in fresh)

    def _prefill_start(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The keys and values of `ids` alone (one row), per layer `(kv_heads, n, head_dim)`: a
        shared start to pin (engines/prefix_kv.py); None for a model with sliding-window layers."""
        from transformers import DynamicCache

        e = self.e
        cache = DynamicCache(config=e.model.config)
        e.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.dev), past_key_values=cache, use_cache=True,
                logits_to_keep=1)
        e.stats["forward_steps"] += 1
        e.stats["prefill_tokens"] += len(ids)
        if not _plain_layers(cache):
            return None
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]

    def _continue(self, reused: list[tuple[list[_Row], list[int], PrefixEntry]]) -> None:
        """Rows whose prompt starts with a stored prefix (engines/prefix_kv.py), the rows that share
        a prompt together: the stored keys and values, then a forward of only the rest, once per
        prompt, its cache expanded to the rows that share it. All prompts feed the same S tokens, S
        the longest rest; a shorter rest feeds the last stored tokens again, so no padding sits
        between the stored part (left-padded to a common length) and the new tokens."""
        e, dev = self.e, self.dev
        S = max(len(p) - entry.length for _, p, entry in reused)
        kept = [len(p) - S for _, p, _ in reused]  # stored tokens each prompt keeps (the rest it feeds again)
        if min(kept) < 0:  # a prompt shorter than the longest rest: prefill it whole
            self._prefill([(row, p) for (rows, p, _), k in zip(reused, kept) if k < 0 for row in rows])
            reused = [x for x, k in zip(reused, kept) if k >= 0]
            if not reused:
                return
            S = max(len(p) - entry.length for _, p, entry in reused)
            kept = [len(p) - S for _, p, _ in reused]
        C = max(kept)
        from transformers import DynamicCache

        cache = DynamicCache(config=e.model.config)
        if C > 0:
            pad = torch.nn.functional.pad
            for li in range(len(reused[0][2].layers)):
                keys = torch.stack([pad(entry.layers[li][0][:, :k], (0, 0, C - k, 0)) for (_, _, entry), k in zip(reused, kept)])
                values = torch.stack([pad(entry.layers[li][1][:, :k], (0, 0, C - k, 0)) for (_, _, entry), k in zip(reused, kept)])
                cache.update(keys.to(dev), values.to(dev), li)
        input_ids = torch.tensor([p[k:] for (_, p, _), k in zip(reused, kept)], dtype=torch.long, device=dev)
        mask_uL = torch.tensor([[0] * (C - k) + [1] * (k + S) for k in kept], dtype=torch.long, device=dev)
        pos_uS = torch.tensor(kept, dtype=torch.long, device=dev)[:, None] + torch.arange(S, device=dev)[None]
        out = e.model(input_ids=input_ids, attention_mask=mask_uL, position_ids=pos_uS, past_key_values=cache, use_cache=True,
                      logits_to_keep=1)
        e.stats["forward_steps"] += 1
        e.stats["prefill_tokens"] += S * len(reused)
        e.stats["reused_tokens"] = e.stats.get("reused_tokens", 0) + sum(k * len(rows) for (rows, _, _), k in zip(reused, kept))
        row_u = [u for u, (rows, _, _) in enumerate(reused) for _ in rows]
        self._merge_rows(out.past_key_values, out.logits[:, -1, :], mask_uL, row_u, [len(reused[u][1]) for u in row_u])
        self.rows.extend(row for rows, _, _ in reused for row in rows)

    def _merge_rows(self, cache, logits_uV, mask_uL, row_u: list[int], lens: list[int]) -> None:
        """Merge a forward over distinct prompts in: row j of the new rows is distinct prompt
        row_u[j] (the cache, logits and mask expanded where prompts are shared), next position lens[j]."""
        dev = self.dev
        if len(row_u) > len(mask_uL):
            row_u_t = torch.tensor(row_u, dtype=torch.long, device=dev)
            cache.reorder_cache(row_u_t)
            logits_uV, mask_uL = logits_uV[row_u_t], mask_uL[row_u_t]
        self._merge(cache, mask_uL, torch.tensor(lens, dtype=torch.long, device=dev)[:, None], logits_uV)

    def _merge(self, cache, mask_nL, pos_n1, logits_nV) -> None:
        if self.kv is None:
            graphs = self.e.decode_graphs
            if graphs is not None and graphs.supports(cache):
                self.kv = StaticKV(graphs, self.e.pad_id)
            else:
                self.kv = DynamicKV(self.e.model)
                self.can_join = self.kv.can_cut = _plain_layers(cache)
            self.kv.merge(cache, mask_nL)
            self.pos_b1, self.logits_bV = pos_n1, logits_nV
            return
        self.kv.merge(cache, mask_nL)
        self.pos_b1 = torch.cat([self.pos_b1, pos_n1])
        self.logits_bV = torch.cat([self.logits_bV, logits_nV])

    # -- one step
    def step(self) -> None:
        """Sample one token for every unfinished row from `logits_bV`; answer the rows that end."""
        e = self.e
        retract = e.retracting  # read once per step (set from the loop's thread)
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
                elif row.stops and any(x in e.decode_text((row.prefix + row.tokens)[-row.window :]) for x in row.stops):
                    row.reason = "stop"
                elif len(row.tokens) >= row.params.max_new_tokens:
                    row.reason = "length"
            if row.reason is not None:
                if e.prefix_kv is not None and row.reason in ("stop", "length") and len(row.tokens) > 1:
                    # its prompt and all but its last token went through the model: kept for its next turn
                    e.prefix_kv.put(row.prompt + row.tokens[:-1], lambda j=j: self.kv.row(j))
                self.done += 1
                e.stats["tokens"] += len(row.tokens)
                e.stats["aborted"] += row.reason == "abort"
                e.deliver(row.req, _completion(row.tokens, row.logps, row.reason, row.vers, row.fwd))

    def compact(self, force: bool = False) -> None:
        """Drop finished rows from the cache once enough are done (or before rows join), and the
        left columns no remaining row attends to."""
        if not self.done or not (force or self.done >= max(1.0, self.e.compact_fraction * len(self.rows))):
            return
        keep = [j for j, row in enumerate(self.rows) if row.reason is None]
        self.rows = [self.rows[j] for j in keep]
        self.done = 0
        if not keep:
            self.kv = self.pos_b1 = self.logits_bV = self.tok_b = None
            return
        keep_t = torch.tensor(keep, dtype=torch.long, device=self.dev)
        self.kv.select(keep_t)
        self.pos_b1, self.tok_b, self.logits_bV = self.pos_b1[keep_t], self.tok_b[keep_t], self.logits_bV[keep_t]
        self.sampler = _RowSampler(self.params, [r.i for r in self.rows], self.dev)

    def decode(self, version: int) -> None:
        """One forward pass of every row's last token: the logits of the next step."""
        self.logits_bV = self.kv.forward(self.tok_b, self.pos_b1)
        self.pos_b1 = self.pos_b1 + 1
        for row in self.rows:
            row.fwd = version
        self.e.stats["forward_steps"] += 1


class DynamicKV:
    """The running batch's KV cache as a growing `DynamicCache` and its attention mask (left
    padding 0), decoded eagerly: LocalEngine(compile="false")'s path (StaticKV is the other)."""

    def __init__(self, model):
        self.model = model
        self.cache = self.mask_bL = None
        self.can_cut = True  # left columns can be cut (plain DynamicLayer caches, no sliding windows)

    def merge(self, cache, mask_nL: torch.Tensor) -> None:
        """Append a prefill's rows; the shorter of the two caches is left-padded to the other."""
        if self.cache is None:
            self.cache, self.mask_bL = cache, mask_nL
            return
        L = max(self.mask_bL.shape[1], mask_nL.shape[1])
        pad = torch.nn.functional.pad
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([pad(old.keys, (0, 0, L - old.keys.shape[-2], 0)), pad(new.keys, (0, 0, L - new.keys.shape[-2], 0))])
            old.values = torch.cat([pad(old.values, (0, 0, L - old.values.shape[-2], 0)),
                                    pad(new.values, (0, 0, L - new.values.shape[-2], 0))])
        self.mask_bL = torch.cat([pad(self.mask_bL, (L - self.mask_bL.shape[1], 0)), pad(mask_nL, (L - mask_nL.shape[1], 0))])

    def row(self, j: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row j's keys and values at the columns it attends to, per layer `(kv_heads, n, head_dim)` (copies)."""
        cols = self.mask_bL[j].bool()
        return [(layer.keys[j][:, cols].clone(), layer.values[j][:, cols].clone()) for layer in self.cache.layers]

    def select(self, keep_t: torch.Tensor) -> None:
        """Keep the rows `keep_t` and cut the left columns none of them attends to."""
        self.cache.batch_select_indices(keep_t)
        self.mask_bL = self.mask_bL[keep_t]
        first = int(self.mask_bL.any(dim=0).nonzero()[0])  # columns left of it are padding for every row
        if first > 0 and self.can_cut:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask_bL = self.mask_bL[:, first:]

    def forward(self, tok_b: torch.Tensor, pos_b1: torch.Tensor) -> torch.Tensor:
        """One forward of every row's last token: the next logits (rows, V)."""
        self.mask_bL = torch.cat([self.mask_bL, self.mask_bL.new_ones(len(tok_b), 1)], dim=1)
        out = self.model(input_ids=tok_b[:, None], attention_mask=self.mask_bL, position_ids=pos_b1,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1, :]


def _plain_layers(cache) -> bool:
    """Whether every layer of a prefill's cache is a plain DynamicLayer (left-padding merges and
    left cuts need it: no sliding windows)."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def joined(before: Completion | None, after: Completion) -> Completion:
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
