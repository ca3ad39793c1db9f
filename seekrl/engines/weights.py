"""Policy weights as folders an inference server loads: written atomically, versioned, pruned.

    folder = write_weights(model, run_dir / "engine" / "weights", version=7)   # .../v7
    prune_weights(run_dir / "engine" / "weights", keep=2)

A folder is a Hugging Face model folder (config.json + *.safetensors, from `save_pretrained`), so
seekrl's engine server, SGLang (`/update_weights_from_disk`) and vLLM (through seekrl's worker
extension) all read it. It is written under a temporary name in the same parent folder and renamed
into place when complete, so a server never sees a half-written folder. A LoRA model (peft) is
written with its adapters merged into the base weights, computed out of place (W + ΔW for the
copy; the training model is not touched, so its frozen base weights never drift by rounding), so
the servers need no adapter support.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

__all__ = ["write_weights", "prune_weights", "weight_folders", "exportable"]

_VERSION = re.compile(r"^v(\d+)$")


@torch.no_grad()
def exportable(model: torch.nn.Module) -> tuple[torch.nn.Module, dict | None]:
    """`(model_to_save, state_dict or None)`: the plain transformers model and, for a peft
    model, its state under the base model's names with each active adapter's delta added."""
    base = getattr(model, "get_base_model", None)
    if base is None:
        return model, None
    inner = base()
    state = {}
    for k, v in inner.state_dict().items():
        if "lora_" in k:
            continue
        state[k.replace(".base_layer.", ".")] = v
    for name, module in inner.named_modules():
        if not (hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")):
            continue
        key = f"{name}.weight"
        for adapter in getattr(module, "active_adapters", []):
            if adapter in getattr(module, "lora_A", {}):
                state[key] = state[key] + module.get_delta_weight(adapter).to(state[key].dtype)
    return inner, state


def write_weights(model: torch.nn.Module, root: str | os.PathLike, version: int, tokenizer=None) -> Path:
    """Write `model`'s weights to `root/v<version>` atomically; return that folder. An existing
    folder of that version is replaced (a resumed run re-exports the step it resumes from)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{int(version)}"
    tmp = Path(tempfile.mkdtemp(prefix=f".v{int(version)}-", dir=root))
    try:
        inner, state = exportable(model)
        with _quiet():
            inner.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


@contextlib.contextmanager
def _quiet():
    """No "Writing model shards" progress bar on every step of a run."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def weight_folders(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete `v<N>` folders under `root`, oldest first (temporary ones are not listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m[1]), p) for p in root.iterdir() if p.is_dir() and (m := _VERSION.match(p.name))]
    return sorted(found)


def prune_weights(root: str | os.PathLike, keep: int, protect: Path | None = None) -> None:
    """Remove all but the newest `keep` version folders (never `protect`) and stale temporaries."""
    root = Path(root)
    folders = weight_folders(root)
    for _, p in folders[: max(0, len(folders) - keep)]:
        if protect is None or p.resolve() != Path(protect).resolve():
            shutil.rmtree(p, ignore_errors=True)
    if root.is_dir():
        for p in root.glob(".v*-*"):
            shutil.rmtree(p, ignore_errors=True)
