"""`train.mixed_precision=bf16` in one process: the trainer runs the policy's decoder under
autocast while its weights, gradients, optimizer state and log-probs stay float32. build.py marks
the model it trains (`set_autocast`); train/batching.py enters `trainer_autocast` around the
decoder. (Under FSDP2, parallel/fsdp.py's own mixed precision does this instead.)"""

from __future__ import annotations

import contextlib

import torch

from seekrl.models import unwrap_peft

__all__ = ["set_autocast", "trainer_autocast"]


def set_autocast(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """`train.mixed_precision=bf16` in one process: the trainer runs the decoder of `model` under
    `torch.autocast(dtype)` (`trainer_autocast`); the weights, gradients and AdamW state stay
    float32 and the LM head's log-probs are taken in float32. None: plain float32."""
    unwrap_peft(model).seekrl_autocast = dtype


def trainer_autocast(model: torch.nn.Module):
    """The autocast context `set_autocast` chose for `model` (a null context when none)."""
    dtype = getattr(unwrap_peft(model), "seekrl_autocast", None)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)
