"""One micro-batch: its tensors (right-padded, shared-prefix or packed), and the forward pass that
scores its completion tokens.

Layout. Every per-token tensor of the trainer is in *completion layout* `(B, C)`: row b holds
its completion tokens (sampled and inserted) at columns `0 .. len(completion)-1`, padded with
zeros (train/batch.py `TokenBatch`). The model runs on the right-padded `prompt + completion`
sequence; the LM head is applied only at the positions that predict completion tokens (hidden
state at `P_b - 1 + c`), so prompt tokens never pay for a vocabulary-sized projection, and of
those only at the positions asked for (`where_BC`: the update asks for the trained tokens, so
tool output costs no projection either).

Shared prefixes. The G samples of a task share their prompt. With `share_prefix` the prompt of
each distinct prompt runs once (left-padded, `(U, Lp)`), its KV cache is expanded to the rows
that share it, and only the completions run on top of it (`(B, C)`); gradients flow back through
the expanded cache into the one prompt pass. With G = 8 and prompts as long as the completions
this halves the tokens of the forward and backward. The result equals the full pass to float
rounding (tested); it is off under gradient checkpointing, where transformers drops the cache.

Lifted prefixes. A row whose completion starts with untrained tokens (loss mask 0) that another
row of the micro-batch starts with too (the branches of an episode, rollout.answer_branches: the
episode's history, copied into each branch and masked there) runs that shared history as part of
its prefix (`lifted_prefixes`): the branches' history runs once, in the prefix pass, instead of
once per branch, and their completion part is only what each branch sampled. Nothing trains or
reads the log-probs of those tokens, so the scoring functions give 0 there (`token_mask_BC` is 0
at the lifted columns); every other column equals the full pass to float rounding (tested).

Packed. With `pack`, the decoder runs on the varlen-packed form of either layout when that
saves rows (train/packing.py).

Temperatures. Log-probs are taken at the sampling temperature; rows sampled at their own
(rollout.branch_temperature: `TokenBatch.temperature_B`, carried as `MicroBatch.temperature_B`)
are scored at theirs, every other row at the scorer's (`row_temperatures`).

Scoring. `completion_logprobs` gives the log-probs (and entropies) of the completion tokens at
`where_BC`; `trained_hidden` gives the hidden states and targets there, for heads of other
losses (SFT's cross-entropy). The LM head runs through `head_logprob_entropy`
(algo/head_logprob.py) when the float32 logits would be large, chunk by chunk; both paths are
equal to float rounding. Under FSDP2 the scoring functions are registered as forward methods of
the sharded model (`FORWARD_METHODS`, parallel/fsdp.py), and `completion_logprobs` /
`completion_logits` call them so that the root's weights are gathered around them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seekrl.algo.head_logprob import head_logprob_entropy, worth_chunking
from seekrl.algo.losses import entropy_from_logits
from seekrl.models import unwrap_peft
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.compute import trainer_autocast
from seekrl.train.packing import PackedFull, PackedPrefix, bucket_length, pack_full, pack_prefix, packed_hidden, saves_rows

__all__ = ["MicroBatch", "make_micro_batch", "lifted_prefixes", "row_temperatures", "completion_hidden", "trained_hidden", "completion_logits", "completion_logprobs",
           "score_logits", "score_logprobs", "token_logprobs", "can_share_prefix", "FORWARD_METHODS"]


@dataclass
class MicroBatch:
    """The tensors of rows `index` of a TokenBatch, on the trainer's device."""

    index: list[int]  # rows of the update's TokenBatch
    input_ids_BL: torch.Tensor  # prompt + completion, right-padded
    attention_mask_BL: torch.Tensor
    gather_idx_BC: torch.Tensor  # hidden-state position predicting completion token c
    target_ids_BC: torch.Tensor  # completion tokens
    token_mask_BC: torch.Tensor  # 1 where a completion token exists (sampled or inserted)
    loss_mask_BC: torch.Tensor  # 1 where the token was sampled by the policy (float)
    # shared-prefix layout (None: one full right-padded pass over input_ids_BL)
    prompt_ids_UP: torch.Tensor | None = None  # distinct prompts, left-padded
    prompt_mask_UP: torch.Tensor | None = None
    row_prompt_B: torch.Tensor | None = None  # which distinct prompt each row continues
    prompt_len_B: torch.Tensor | None = None
    packed: PackedFull | PackedPrefix | None = None  # varlen-packed layout (train/packing.py); replaces the above
    temperature_B: torch.Tensor | None = None  # rows sampled at their own temperature (NaN: the scorer's); None: none
    # lifted prefixes (module docstring; None: none): the completion columns each row's prefix took,
    # and the tokens the prefix layout runs after the prefix (what is left of each completion)
    lift_B: torch.Tensor | None = None
    suffix_ids_BS: torch.Tensor | None = None
    suffix_mask_BS: torch.Tensor | None = None
    dummy: bool = False  # run only to keep the ranks' collectives in step (train/plan.py): loss × 0
    buckets: int = 0  # train.length_buckets: the shared-prefix layout's completion pass is padded to `bucket_length` too

    @property
    def width(self) -> int:
        """C of this micro-batch: its longest completion (at least 1)."""
        return self.target_ids_BC.shape[1]

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask_BC.sum().item())


def lifted_prefixes(batch: TokenBatch, index: list[int]) -> list[int]:
    """For each row of `index`, how many leading completion tokens join its prefix (module
    docstring): its leading untrained tokens (all but the last token of an untrained completion)
    when another row of `index` has the same prompt and starts with the same ones; else 0."""
    lead_B = (batch.loss_mask_BC[index].cumsum(1) == 0).sum(1).tolist() if index else []
    lead = [min(int(n), max(0, len(batch.completion_ids[i]) - 1)) for i, n in zip(index, lead_B)]
    keys = [tuple(batch.prompt_ids[i]) + tuple(batch.completion_ids[i][:n]) if n else None for i, n in zip(index, lead)]
    count: dict[tuple, int] = {}
    for k in keys:
        if k is not None:
            count[k] = count.get(k, 0) + 1
    return [n if k is not None and count[k] > 1 else 0 for n, k in zip(lead, keys)]


def make_micro_batch(batch: TokenBatch, index: list[int], pad_id: int, device, share_prefix: bool = False,
                     always_prefix: bool = False, pack: bool = False, buckets: int = 0) -> MicroBatch:
    """The tensors of rows `index`; with `share_prefix`, the shared-prefix layout when some rows
    share a prompt or a lifted prefix (`always_prefix`: even when none do, so that every
    micro-batch runs the decoder twice, as FSDP ranks must all do the same passes: train/plan.py);
    with `pack`, the decoder runs on the varlen-packed form of that layout (train/packing.py) instead.
    `buckets` > 0 rounds the lengths the decoder runs on up by `bucket_length` (train.length_buckets;
    the padding is masked)."""
    full_prompts = [batch.prompt_ids[i] for i in index]
    comps = [batch.completion_ids[i] for i in index]
    L = bucket_length(max(len(p) + len(c) for p, c in zip(full_prompts, comps)), buckets)
    C = max(1, max(len(c) for c in comps))
    B = len(index)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros(B, L, dtype=torch.long)
    gather = torch.zeros(B, C, dtype=torch.long)
    targets = torch.zeros(B, C, dtype=torch.long)
    token_mask = torch.zeros(B, C)
    for b, (p, c) in enumerate(zip(full_prompts, comps)):
        P, n = len(p), len(c)
        input_ids[b, : P + n] = torch.as_tensor(p + c)
        attn[b, : P + n] = 1
        if n:
            gather[b, :n] = torch.arange(P - 1, P - 1 + n)
            targets[b, :n] = torch.as_tensor(c)
            token_mask[b, :n] = 1
    loss_mask = batch.loss_mask_BC[index, :C].clone()
    own_t = batch.temperature_B[index] if batch.temperature_B is not None else None
    prefix: dict = {"temperature_B": own_t.to(device)} if own_t is not None and not own_t.isnan().all() else {}
    lift = lifted_prefixes(batch, index) if share_prefix else [0] * B
    prompts = [p + c[:f] if f else p for p, c, f in zip(full_prompts, comps, lift)]
    suffixes = [c[f:] if f else c for c, f in zip(comps, lift)]
    if share_prefix:
        distinct: dict[tuple, int] = {}
        row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        if (len(distinct) < B or always_prefix) and all(len(p) > 0 for p in prompts):
            P = bucket_length(max(len(k) for k in distinct), buckets)
            prompt_ids = torch.full((len(distinct), P), pad_id, dtype=torch.long)
            prompt_mask = torch.zeros(len(distinct), P, dtype=torch.long)
            for key, u in distinct.items():  # left-padded: every prompt ends at column P - 1
                prompt_ids[u, P - len(key) :] = torch.as_tensor(key)
                prompt_mask[u, P - len(key) :] = 1
            prefix.update(
                prompt_ids_UP=prompt_ids.to(device), prompt_mask_UP=prompt_mask.to(device),
                row_prompt_B=torch.as_tensor(row_prompt).to(device),
                prompt_len_B=torch.as_tensor([len(p) for p in prompts]).to(device),
            )
            if any(lift):
                S = max(1, max(len(c) for c in suffixes))
                for b, f in enumerate(lift):
                    token_mask[b, :f] = 0  # lifted: not scored (module docstring)
                prefix.update(lift_B=torch.as_tensor(lift).to(device),
                              suffix_ids_BS=pad_completion(suffixes, S, torch.long).to(device),
                              suffix_mask_BS=pad_completion([[1] * len(c) for c in suffixes], S, torch.long).to(device))
    shared = "prompt_ids_UP" in prefix
    if not shared:  # the full pass: nothing lifted
        prompts, suffixes = full_prompts, comps
    lengths = [len(c) for c in suffixes] if shared else [len(p) + len(c) for p, c in zip(prompts, comps)]
    if pack and saves_rows(lengths):
        packed = pack_prefix(prompts, suffixes, pad_id, buckets) if shared else pack_full(prompts, comps, pad_id, buckets)
        prefix = {"packed": packed.to(device), **{k: prefix[k] for k in ("lift_B", "temperature_B") if k in prefix}}
    return MicroBatch(
        **prefix,
        buckets=buckets,
        index=list(index),
        input_ids_BL=input_ids.to(device),
        attention_mask_BL=attn.to(device),
        gather_idx_BC=gather.to(device),
        target_ids_BC=targets.to(device),
        token_mask_BC=token_mask.to(device),
        loss_mask_BC=loss_mask.to(device),
    )


def _decoder(model):
    base = unwrap_peft(model)
    # peft wraps the inner modules in place, so calling the decoder still applies LoRA.
    return base.get_decoder() if hasattr(base, "get_decoder") else base.model


def completion_hidden(model, mb: MicroBatch) -> torch.Tensor:
    """Hidden states `(B, C, H)` at the positions that predict each completion token (float32:
    under `train.mixed_precision=bf16` the decoder runs in bf16 and the head in float32)."""
    with trainer_autocast(model):
        hidden_BCH = _completion_hidden(_decoder(model), mb)
        if mb.lift_B is not None:
            hidden_BCH = _unlift(hidden_BCH, mb.lift_B, mb.width)
    return hidden_BCH.float()


def _unlift(hidden_BSH: torch.Tensor, lift_B: torch.Tensor, C: int) -> torch.Tensor:
    """Hidden states of what is left of each completion after its lifted prefix `(B, S, H)` -> the
    completion layout `(B, C, H)`: column s of row b goes to column lift_b + s; the lifted columns
    are zero (never scored: module docstring)."""
    B, S, H = hidden_BSH.shape
    col_BS = lift_B[:, None] + torch.arange(S, device=hidden_BSH.device)[None]
    keep_BS = col_BS < C
    rows_BS = torch.arange(B, device=hidden_BSH.device)[:, None].expand(B, S)
    out_BCH = hidden_BSH.new_zeros(B, C, H)
    return out_BCH.index_put((rows_BS[keep_BS], col_BS[keep_BS]), hidden_BSH[keep_BS])


def _completion_hidden(decoder, mb: MicroBatch) -> torch.Tensor:
    if mb.packed is not None:
        return packed_hidden(decoder, mb.packed)
    if mb.prompt_ids_UP is not None:
        return _shared_prefix_hidden(decoder, mb)
    out = decoder(input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL, use_cache=False)
    hidden_BLH = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    H = hidden_BLH.shape[-1]
    return hidden_BLH.gather(1, mb.gather_idx_BC.unsqueeze(-1).expand(-1, -1, H))


def _shared_prefix_hidden(decoder, mb: MicroBatch) -> torch.Tensor:
    """Prompt pass once per distinct prompt, cache expanded to the rows, then the completions."""
    from transformers import DynamicCache

    prompt_pos_UP = (mb.prompt_mask_UP.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = decoder(
        input_ids=mb.prompt_ids_UP, attention_mask=mb.prompt_mask_UP, position_ids=prompt_pos_UP,
        past_key_values=cache, use_cache=True,
    )
    last_UH = out.last_hidden_state[:, -1]  # predicts completion token 0
    cache = out.past_key_values
    cache.reorder_cache(mb.row_prompt_B)  # index_select: differentiable, gradients sum per prompt
    ids_BC = mb.suffix_ids_BS if mb.suffix_ids_BS is not None else mb.target_ids_BC
    mask_BC = mb.suffix_mask_BS if mb.suffix_mask_BS is not None else mb.token_mask_BC.long()
    width = ids_BC.shape[1]
    if (extra := bucket_length(width, mb.buckets) - width) > 0:  # padded at the end, masked: nothing real attends to it
        ids_BC, mask_BC = torch.nn.functional.pad(ids_BC, (0, extra)), torch.nn.functional.pad(mask_BC, (0, extra))
    pos_BC = mb.prompt_len_B[:, None] + torch.arange(ids_BC.shape[1], device=ids_BC.device)[None]
    mask_BL = torch.cat([mb.prompt_mask_UP[mb.row_prompt_B], mask_BC], dim=1)
    out = decoder(input_ids=ids_BC, attention_mask=mask_BL, position_ids=pos_BC, past_key_values=cache, use_cache=True)
    return torch.cat([last_UH[mb.row_prompt_B].unsqueeze(1), out.last_hidden_state[:, : width - 1]], dim=1)


def can_share_prefix(model) -> bool:
    """The shared-prefix pass needs the KV cache, which gradient checkpointing turns off."""
    base = unwrap_peft(model)
    if hasattr(base, "is_activation_checkpointing"):  # transformers 5: the old name warns that it is deprecated
        return not base.is_activation_checkpointing
    return not getattr(base, "is_gradient_checkpointing", False)


def trained_hidden(model, mb: MicroBatch, where_BC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(hidden_NH, target_N, where_BC)`: the hidden states predicting the completion tokens at
    `where_BC` (default: every completion token), row by row, their target ids, and the boolean
    mask they were taken at."""
    hidden_BCH = completion_hidden(model, mb)
    where_BC = (mb.token_mask_BC if where_BC is None else where_BC) > 0
    return hidden_BCH[where_BC], mb.target_ids_BC[where_BC], where_BC


def row_temperatures(mb: MicroBatch | TokenBatch, temperature: float) -> torch.Tensor | None:
    """Each row's scoring temperature `(B,)` when some row of `mb` (a micro-batch, or a whole batch:
    the remote teacher's) was sampled at its own (`temperature_B`; the others at `temperature`),
    <= 0 read as 1; None when none was."""
    if mb.temperature_B is None:
        return None
    t_B = torch.where(mb.temperature_B.isnan(), torch.full_like(mb.temperature_B, temperature), mb.temperature_B)
    return torch.where(t_B > 0, t_B, torch.ones_like(t_B)).float()


def score_logits(model, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits `(B, C, V)` (float32) for the completion tokens only (no FSDP dispatch)."""
    hidden_BCH = completion_hidden(model, mb)
    head = unwrap_peft(model).get_output_embeddings()
    logits_BCV = head(hidden_BCH).float()
    t_B = row_temperatures(mb, temperature)
    if t_B is not None:
        return logits_BCV / t_B[:, None, None]
    t = temperature if temperature > 0 else 1.0
    return logits_BCV / t if t != 1.0 else logits_BCV


def score_logprobs(model, mb: MicroBatch, temperature: float, *, entropy: bool = False,
                   where_BC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` without the FSDP dispatch (what is registered as the forward method)."""
    head = unwrap_peft(model).get_output_embeddings()
    hidden_NH, target_N, where_BC = trained_hidden(model, mb, where_BC)
    vocab = head.weight.shape[0] if hasattr(head, "weight") else 0
    t_B = row_temperatures(mb, temperature)
    t = t_B[:, None].expand(where_BC.shape)[where_BC] if t_B is not None else (temperature if temperature > 0 else 1.0)
    if isinstance(head, torch.nn.Linear) and worth_chunking(len(target_N), vocab):
        logp_N, ent_N = head_logprob_entropy(hidden_NH, head.weight, head.bias, target_N, t, entropy=entropy)
    else:  # small logits (or a wrapped head): whole, as plain autograd computes them
        z_NV = head(hidden_NH).float()
        z_NV = z_NV / t[:, None] if t_B is not None else (z_NV / t if t != 1.0 else z_NV)
        logp_N = token_logprobs(z_NV, target_N)
        ent_N = entropy_from_logits(z_NV) if entropy else None
    zeros_BC = torch.zeros(where_BC.shape, dtype=torch.float32, device=hidden_NH.device)
    logp_BC = zeros_BC.masked_scatter(where_BC, logp_N)
    return logp_BC, zeros_BC.masked_scatter(where_BC, ent_N) if ent_N is not None else None


FORWARD_METHODS = {"seekrl_completion_logits": score_logits, "seekrl_completion_logprobs": score_logprobs}


def completion_logits(model, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits `(B, C, V)` (float32) for the completion tokens only."""
    scores = getattr(model, "seekrl_completion_logits", None)  # FSDP2: the same, registered as a forward method
    if scores is not None:
        return scores(mb, temperature)
    return score_logits(model, mb, temperature)


def completion_logprobs(model, mb: MicroBatch, temperature: float, *, entropy: bool = False,
                        where_BC: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs `(B, C)` of the completion tokens (and their entropies, or None), float32, scored
    at the positions `where_BC` (default: every completion token) and 0 elsewhere (module docstring)."""
    scores = getattr(model, "seekrl_completion_logprobs", None)  # FSDP2: the same, registered as a forward method
    if scores is not None:
        return scores(mb, temperature, entropy=entropy, where_BC=where_BC)
    return score_logprobs(model, mb, temperature, entropy=entropy, where_BC=where_BC)


def token_logprobs(logits_BCV: torch.Tensor, target_ids_BC: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax."""
    picked_BC = logits_BCV.gather(-1, target_ids_BC.unsqueeze(-1)).squeeze(-1)
    return picked_BC - torch.logsumexp(logits_BCV, dim=-1)
