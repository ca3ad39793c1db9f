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
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

__all__ = ["write_weights", "prune_weights", "weight_folders", "exportable", "untie_lm_head"]

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


def write_weights(model: torch.nn.Module, root: str | os.PathLike, version: int, tokenizer=None, *,
                  untie_embeddings: bool = False) -> Path:
    """Write `model`'s weights to `root/v<version>` atomically; return that folder. An existing
    folder of that version is replaced (a resumed run re-exports the step it resumes from).
    `untie_embeddings`: a model that ties its LM head to its input embedding is written untied
    (`untie_lm_head`), for vLLM (see there)."""
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
        if untie_embeddings:
            untie_lm_head(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def untie_lm_head(folder: str | os.PathLike) -> bool:
    """Give a saved model whose config ties the LM head to the input embedding an explicit
    `lm_head.weight` (a copy, in a file of its own listed in the safetensors index; a one-file model
    becomes two shards and an index, so that transformers loads the head too) and
    `tie_word_embeddings: false`; True when it changed the folder. vLLM 0.32's weight reload
    (`reload_weights`, layer by layer) skips a tied LM head ("ParallelLMHead: Failed to load
    weights"), so a served tied model would keep its first head after every sync: half-updated
    weights (found against a real server, tests/integration/test_vllm.py). Untied, the head is
    loaded like any other layer. The numbers are the same: both copies are equal."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if not text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)):
        return False
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    files = [folder / f for f in sorted(set(index["weight_map"].values()))] if index else sorted(folder.glob("*.safetensors"))
    embed = None
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            name = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)
            if name is not None:
                embed, head = f.get_tensor(name), name[: -len("model.embed_tokens.weight")] + "lm_head.weight"
                break
    if embed is None:
        return False
    head_file = "lm_head.safetensors"
    if index is None:  # one file: two shards and an index (transformers reads a model.safetensors alone, if there is one)
        (body,) = files
        body = body.rename(folder / "model-00001-of-00002.safetensors")
        head_file = "model-00002-of-00002.safetensors"
        with safe_open(str(body), framework="pt", device="cpu") as f:
            index = {"metadata": {}, "weight_map": {k: body.name for k in f.keys()}}
    save_file({head: embed.clone()}, str(folder / head_file), metadata={"format": "pt"})
    index["weight_map"][head] = head_file
    index_path.write_text(json.dumps(index, indent=2))
    config["tie_word_embeddings"] = False
    if text is not config:
        text["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2))
    return True


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
