"""Split a model over the trainer ranks (FSDP2), and gather it back for the engine and checkpoints.

`train.fsdp=full`: every decoder layer and then the root are `fully_shard`ed over a 1-D device
mesh, so each rank holds 1/N of the parameters, gradients and AdamW state; a layer's weights are
all-gathered for its forward and backward, and its gradients reduce-scattered after backward.
`hybrid`: the same over a 2-D mesh (replicate across nodes, shard within a node), for clusters
whose inter-node links are slower than the intra-node ones. `none`: every rank holds the whole
model and `sync_gradients` all-reduces the gradients (also what LoRA uses over several ranks).

Gradient reduction averages over the ranks; each rank's loss is its share of the global loss
(train/policy.py weights every micro-batch by its tokens over the *global* count), so the
trainer multiplies its loss by `grad_scale(ranks)` = N and the average is the exact sum.

On CUDA, `train.mixed_precision=auto|bf16` keeps fp32 master weights and optimizer state and
computes in bf16 with fp32 gradient reductions (FSDP2's MixedPrecisionPolicy); CPU runs fp32.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from seekrl.parallel.ranks import Ranks

__all__ = ["shard_model", "broadcast_parameters", "grad_scale", "sync_gradients", "full_state_dict", "is_sharded",
           "load_full_state_dict", "copy_into"]


def broadcast_parameters(model: torch.nn.Module, ranks: Ranks) -> None:
    """Every rank starts from rank 0's weights (a seeded init is the same on every rank; a
    tokenizer trained per rank might not be, and this makes it irrelevant for the weights)."""
    if not ranks.distributed:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(t.data, 0)


def _layer_lists(model: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """The stacks of transformer blocks (model.layers, transformer.h, ...): the units FSDP shards one by one."""
    return [m for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks")]


def shard_model(model: torch.nn.Module, ranks: Ranks, mixed_precision: str = "auto",
                forward_methods: dict[str, Callable] | None = None) -> torch.nn.Module:
    """FSDP2 `fully_shard` each block, then the root (module docstring); a no-op unless sharded.
    `forward_methods` (name -> function(model, ...)) become methods of the sharded model, registered
    as FSDP forward methods: the trainer scores with them rather than `model.forward`."""
    broadcast_parameters(model, ranks)
    if not ranks.sharded:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    bf16 = mixed_precision == "bf16" or (mixed_precision == "auto" and ranks.device.type == "cuda")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for layers in _layer_lists(model):
        for block in layers:
            fully_shard(block, mesh=ranks.mesh, mp_policy=mp)
    fully_shard(model, mesh=ranks.mesh, mp_policy=mp)
    if forward_methods and hasattr(model, "get_output_embeddings"):
        # The trainer scores completions with the decoder and the LM head at the completion
        # positions only (train/batching.py FORWARD_METHODS), not with model.forward: FSDP must
        # gather the root's weights (embeddings, final norm, head) around those methods too.
        from torch.distributed.fsdp import register_fsdp_forward_method

        for name, fn in forward_methods.items():
            setattr(model, name, types.MethodType(fn, model))
            register_fsdp_forward_method(model, name)
    return model


def grad_scale(ranks: Ranks) -> float:
    """What each rank's loss is multiplied by so that the averaged gradient is the summed one."""
    return float(ranks.world) if ranks.distributed else 1.0


def sync_gradients(model: torch.nn.Module, ranks: Ranks) -> None:
    """train.fsdp=none over several ranks: average the gradients (FSDP does this itself)."""
    if not ranks.distributed or ranks.sharded:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= ranks.world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def full_state_dict(model: torch.nn.Module, ranks: Ranks) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (on CPU), {} on the others. A collective when sharded."""
    if ranks.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach() for k, v in model.state_dict().items()} if ranks.is_main else {}


def is_sharded(model: torch.nn.Module) -> bool:
    """The model's parameters are FSDP2 DTensors (split over ranks)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def load_full_state_dict(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Put full weights (the same dict on every rank) into `model`, sharded or not. A key may be
    missing only when its tensor is tied to one that is present (lm_head with tied embeddings)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        result = set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        result = model.load_state_dict(weights, strict=False)
    current = model.state_dict(keep_vars=True)
    tied = {id(current[k]) for k in weights if k in current}
    missing = [k for k in result.missing_keys if id(current[k]) not in tied]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"weights do not match {type(model).__name__}: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")


def copy_into(target: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Rank 0: the gathered weights into the engine's full copy (in place: it samples from it)."""
    load_full_state_dict(target, weights)
