"""`train.mixed_precision=bf16` in one process: the trainer runs the policy's decoder under
autocast while its weights, gradients, optimizer state and log-probs stay float32. build.py marks
the model it trains (`set_autocast`); train/batching.py enters `trainer_autocast` around the
decoder. (Under FSDP2, parallel/fsdp.py's own mixed precision does this instead.)

bf16 pays only where the hardware computes it: a CPU with avx512_bf16 or AMX runs the SmolLM2
update about 1.7x faster under bf16 autocast, but a CPU with AVX2 only (no avx512) emulates it, 46x
slower than float32 for a 1024x576x1536 matmul (BENCHMARKS.md). `bf16_if_native` is bf16 where
the device has native bf16 (`seekrl.models.native_bf16`) and fp32 elsewhere (`trainer_precision`); an explicit
`bf16` on a device without it runs as asked, with a warning naming the fix.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings

import torch

from seekrl.models import native_bf16, unwrap_peft

__all__ = ["set_autocast", "trainer_autocast", "trainer_precision"]


@functools.cache
def trainer_precision(setting: str, device_type: str) -> str:
    """train.mixed_precision as the trainer runs it on `device_type`: `bf16_if_native` becomes bf16
    or fp32 (one line on stderr says which); `bf16` on a device without native bf16 stays bf16, with
    a warning; auto and fp32 are returned as they are."""
    native = native_bf16(device_type)
    if setting == "bf16_if_native":
        chosen = "bf16" if native else "fp32"
        why = "native bf16" if native else "no native bf16: avx512_bf16, AMX or a bf16 GPU"
        print(f"seekrl: train.mixed_precision=bf16_if_native: {chosen} on this {device_type} ({why})", file=sys.stderr)
        return chosen
    if setting == "bf16" and not native:
        warnings.warn(f"seekrl: train.mixed_precision=bf16 on a {device_type} without native bf16 (no avx512_bf16, AMX or "
                      "bf16 GPU): bf16 is emulated (46x slower than fp32 for a matmul on an AVX2-only CPU, BENCHMARKS.md); set train.mixed_precision=fp32 or "
                      "bf16_if_native", stacklevel=2)
    return setting


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
