"""Varlen packing: the sequences of a micro-batch packed into rows, no padding between them.

The padded layout (batching.py) runs `B` rows of the longest sequence's length; a GRPO batch's
completions vary from a few tokens to `max_new_tokens`, so much of that is padding that the
decoder computes and throws away. Packed, the sequences are laid end to end in `R` rows of
`capacity` tokens (first-fit decreasing; the capacity is the longest sequence, so a row's
attention costs no more than one padded row's), position ids restart at each sequence, and a
4-D mask confines attention to each sequence (causal within it). The hidden state predicting
completion token c of sequence b is then gathered from its packed position, into the same
completion layout `(B, C, H)` as the padded path: everything after the decoder is unchanged.
A micro-batch is packed only when that saves rows (`saves_rows`: at least 10% fewer); sequences of
about one length (SFT text rows, say) keep the padded layout, which computes the same tokens
without building block masks.

Shared prefixes, packed. The distinct prompts are packed the same way and run once; their keys
and values (after rotary embedding, as the cache stores them) are flattened to one sequence of
all prompt tokens. The completions are packed into rows; each completion row gets, as its KV
cache, the prompt tokens of the prompts its completions continue (gathered: a differentiable
index, so gradients flow back into the one prompt pass), and a mask lets each completion token
see its own prompt's tokens and its own completion's earlier tokens. Completion token 0 is
predicted by the prompt's last hidden state.

Padding positions (the end of a row) attend only to themselves, so no softmax row is empty (an
empty row gives NaN, and NaN keys poison the real queries' weighted sums even at weight 0).

The masks are boolean for SDPA (True: attend) and additive floats for eager attention; other
attention implementations (flash-attention kernels take packed sequences through their own
varlen API, not a mask) keep the padded layout: `can_pack(model)`. Equal to the padded path
within float rounding (tests/integration/test_trainer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["bucket_length", "pack_first_fit", "saves_rows", "pack_sequences", "Packed", "PackedFull", "PackedPrefix", "pack_full", "pack_prefix", "packed_hidden",
           "attention_mask_for", "can_pack"]

MASK_IMPLEMENTATIONS = ("sdpa", "eager")


def bucket_length(n: int, per_doubling: int) -> int:
    """`n` rounded up to one of `per_doubling` lengths per doubling: a multiple of the largest power
    of two at most `n / per_doubling` (so at most 1/per_doubling more); `n` itself when
    `per_doubling` is 0 or `n` is at most `per_doubling`. The lengths a run's micro-batches take
    then come from a bounded set (train.length_buckets)."""
    if per_doubling <= 0 or n <= per_doubling:
        return n
    step = 1 << ((n // per_doubling).bit_length() - 1)
    return -(-n // step) * step


def can_pack(model) -> bool:
    """Packed attention needs a 4-D mask, which SDPA and eager attention take (module docstring)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl in MASK_IMPLEMENTATIONS


def pack_first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices grouped into rows of at most `capacity` tokens (first-fit decreasing)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def saves_rows(lengths: list[int], min_saving: float = 0.1) -> bool:
    """Whether packing these sequences (rows as long as the longest) needs at least `min_saving`
    fewer rows than padding them does. When it does not (sequences of about one length), the
    padded layout computes the same tokens without building block masks, so it is kept."""
    if len(lengths) < 2:
        return False
    return len(pack_first_fit(lengths, max(lengths))) <= (1.0 - min_saving) * len(lengths)


@dataclass
class Packed:
    """Sequences packed into rows: ids, positions, a 4-D mask (True: attend) and, for each
    sequence, the flat offset (row × capacity + column) of its first token."""

    ids_RL: torch.Tensor
    pos_RL: torch.Tensor
    mask_R1LL: torch.Tensor
    start: list[int]

    def to(self, device) -> Packed:
        return Packed(self.ids_RL.to(device), self.pos_RL.to(device), self.mask_R1LL.to(device), self.start)


def pack_sequences(seqs: list[list[int]], pad_id: int, buckets: int = 0) -> Packed:
    """`seqs` packed into rows as long as the longest (rounded up by `bucket_length`)."""
    capacity = bucket_length(max(1, max(len(s) for s in seqs)), buckets)
    rows = pack_first_fit([len(s) for s in seqs], capacity)
    R = len(rows)
    ids = torch.full((R, capacity), pad_id, dtype=torch.long)
    pos = torch.zeros(R, capacity, dtype=torch.long)
    seg = torch.full((R, capacity), -1, dtype=torch.long)  # which sequence a column holds; -1: padding
    start = [0] * len(seqs)
    for r, members in enumerate(rows):
        col = 0
        for i in members:
            n = len(seqs[i])
            ids[r, col : col + n] = torch.as_tensor(seqs[i])
            pos[r, col : col + n] = torch.arange(n)
            seg[r, col : col + n] = i
            start[i] = r * capacity + col
            col += n
    causal = torch.ones(capacity, capacity, dtype=torch.bool).tril()
    same = seg[:, :, None] == seg[:, None, :]
    mask = same & causal & (seg[:, :, None] >= 0)
    mask |= torch.eye(capacity, dtype=torch.bool)[None] & (seg[:, :, None] < 0)  # padding sees itself
    return Packed(ids, pos, mask[:, None], start)


@dataclass
class PackedFull:
    """One decoder pass over packed `prompt + completion` sequences."""

    seqs: Packed
    gather_BC: torch.Tensor  # flat packed position predicting completion token c of row b

    def to(self, device) -> PackedFull:
        return PackedFull(self.seqs.to(device), self.gather_BC.to(device))


def pack_full(prompts: list[list[int]], completions: list[list[int]], pad_id: int, buckets: int = 0) -> PackedFull:
    seqs = pack_sequences([p + c for p, c in zip(prompts, completions)], pad_id, buckets)
    C = max(1, max(len(c) for c in completions))
    gather = torch.zeros(len(prompts), C, dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        if c:
            gather[b, : len(c)] = seqs.start[b] + len(p) - 1 + torch.arange(len(c))
    return PackedFull(seqs, gather)


@dataclass
class PackedPrefix:
    """The distinct prompts packed and run once; the completions packed on top of them."""

    prompts: Packed
    completions: Packed  # token 0 .. n-2 of each completion (the last one predicts nothing)
    prefix_idx_RK: torch.Tensor  # for each completion row: flat packed prompt positions it may see
    comp_mask_R1LK: torch.Tensor  # completion queries × (gathered prompt keys + completion keys)
    gather_BC: torch.Tensor  # into cat(prompt hidden flat, completion hidden flat)

    def to(self, device) -> PackedPrefix:
        return PackedPrefix(self.prompts.to(device), self.completions.to(device), self.prefix_idx_RK.to(device),
                            self.comp_mask_R1LK.to(device), self.gather_BC.to(device))


def pack_prefix(prompts: list[list[int]], completions: list[list[int]], pad_id: int, buckets: int = 0) -> PackedPrefix:
    distinct: dict[tuple, int] = {}
    row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    uniq = [list(k) for k in distinct]
    P = pack_sequences(uniq, pad_id, buckets)
    # completion token c >= 1 is predicted by the hidden state of token c - 1: run tokens 0 .. n-2
    heads = [c[:-1] if len(c) > 1 else [] for c in completions]
    feed = [h if h else [pad_id] for h in heads]  # an empty one still takes a column (never read)
    Cp = pack_sequences(feed, pad_id, buckets)
    R, L = Cp.ids_RL.shape
    seg = torch.full((R, L), -1, dtype=torch.long)
    for b, h in enumerate(feed):
        r, col = divmod(Cp.start[b], L)
        Cp.pos_RL[r, col : col + len(h)] = len(prompts[b]) + torch.arange(len(h))
        seg[r, col : col + len(h)] = b
    # each completion row's prefix: the prompts of its members, each once, in order of first use
    row_prompts: list[list[int]] = [[] for _ in range(R)]
    for b in range(len(prompts)):
        r = Cp.start[b] // L
        if row_prompt[b] not in row_prompts[r]:
            row_prompts[r].append(row_prompt[b])
    K = max(sum(len(uniq[u]) for u in us) for us in row_prompts)
    prefix_idx = torch.zeros(R, K, dtype=torch.long)
    key_prompt = torch.full((R, K), -1, dtype=torch.long)  # which distinct prompt a gathered key belongs to
    for r, us in enumerate(row_prompts):
        k = 0
        for u in us:
            n = len(uniq[u])
            prefix_idx[r, k : k + n] = P.start[u] + torch.arange(n)
            key_prompt[r, k : k + n] = u
            k += n
    q_prompt = torch.full((R, L), -2, dtype=torch.long)
    for b in range(len(prompts)):
        r, col = divmod(Cp.start[b], L)
        q_prompt[r, col : col + len(feed[b])] = row_prompt[b]
    sees_prompt = q_prompt[:, :, None] == key_prompt[:, None, :]  # (R, L, K)
    comp_mask = torch.cat([sees_prompt & (seg[:, :, None] >= 0), Cp.mask_R1LL[:, 0]], dim=-1)
    C = max(1, max(len(c) for c in completions))
    n_prompt_flat = P.ids_RL.numel()
    gather = torch.zeros(len(prompts), C, dtype=torch.long)
    for b, c in enumerate(completions):
        if not c:
            continue
        gather[b, 0] = P.start[row_prompt[b]] + len(uniq[row_prompt[b]]) - 1
        if len(c) > 1:
            gather[b, 1 : len(c)] = n_prompt_flat + Cp.start[b] + torch.arange(len(c) - 1)
    return PackedPrefix(P, Cp, prefix_idx, comp_mask[:, None], gather)


def attention_mask_for(decoder, mask_bool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4-D mask in the form the attention implementation adds or selects with."""
    if getattr(decoder.config, "_attn_implementation", "sdpa") == "eager":
        return torch.zeros(mask_bool.shape, dtype=dtype, device=mask_bool.device).masked_fill(~mask_bool, torch.finfo(dtype).min)
    return mask_bool


def packed_hidden(decoder, packed: PackedFull | PackedPrefix) -> torch.Tensor:
    """Hidden states `(B, C, H)` at the positions predicting each completion token."""
    dtype = next(decoder.parameters()).dtype
    if isinstance(packed, PackedFull):
        s = packed.seqs
        out = decoder(input_ids=s.ids_RL, attention_mask=attention_mask_for(decoder, s.mask_R1LL, dtype), position_ids=s.pos_RL,
                      use_cache=False)
        flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        return flat[packed.gather_BC]
    from transformers import DynamicCache

    p, c = packed.prompts, packed.completions
    out = decoder(input_ids=p.ids_RL, attention_mask=attention_mask_for(decoder, p.mask_R1LL, dtype), position_ids=p.pos_RL,
                  past_key_values=DynamicCache(), use_cache=True)
    prompt_flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    cache = DynamicCache()
    for i, layer in enumerate(out.past_key_values.layers):
        # (Rp, heads, Lp, d) -> (heads, Rp * Lp, d) -> each completion row's prompt keys (R, heads, K, d)
        keys = layer.keys.transpose(0, 1).reshape(layer.keys.shape[1], -1, layer.keys.shape[-1])
        values = layer.values.transpose(0, 1).reshape(layer.values.shape[1], -1, layer.values.shape[-1])
        cache.update(keys[:, packed.prefix_idx_RK].transpose(0, 1), values[:, packed.prefix_idx_RK].transpose(0, 1), i)
    out = decoder(input_ids=c.ids_RL, attention_mask=attention_mask_for(decoder, packed.comp_mask_R1LK, dtype), position_ids=c.pos_RL,
                  past_key_values=cache, use_cache=True)
    comp_flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    return torch.cat([prompt_flat, comp_flat])[packed.gather_BC]
