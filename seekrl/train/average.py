"""Checkpoint averaging (`seekrl average`): one model folder whose every floating-point weight is
the weighted mean of that weight in several model folders of one architecture: the last
checkpoints of a run (`--last K`, the classic checkpoint average, LAWA / "model soup" of one
run), or any model folders that share a config.

    seekrl average runs/grpo --last 2 --out runs/grpo/avg_last2
    seekrl average runs/grpo/checkpoints/step_40 runs/grpo/checkpoints/step_48 --weights 1 3 --out DIR

Each argument is a model folder (config.json + *.safetensors), a checkpoint folder (its
`model/`), or, with `--last K`, a run folder (its last K complete checkpoints, oldest first) or
its `checkpoints/` folder. The folders must agree on config.json (but `_name_or_path` and
`transformers_version`), on their safetensors files' names, and on every tensor's name, shape and
dtype; integer and bool tensors (buffers) must be equal. A floating-point tensor is averaged in
fp32 and stored in its own dtype. The output folder holds the first folder's other files
(tokenizer, chat template, generation config), `model.safetensors` (or the same shards and index)
and `average.json` (the sources and weights), written into `<out>.tmp` and renamed, so a killed
command leaves no half folder under `--out`. Weights are read with safetensors only (nothing is
unpickled), one shard of every source at a time. A bad argument is one ConfigError line naming
the folder, file or tensor and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from seekrl.errors import ConfigError
from seekrl.models import check_model_folder
from seekrl.train.checkpoint import list_checkpoints, model_folder

__all__ = ["average_sources", "average_models"]

_IGNORED_CONFIG_KEYS = ("_name_or_path", "transformers_version")


def average_sources(paths: list[str | os.PathLike], last: int | None = None) -> list[Path]:
    """The model folders `seekrl average` reads: each path as a model folder or a checkpoint
    folder; with `last`, one run folder (or its checkpoints/ folder) and its last `last`
    complete checkpoints."""
    if last is not None:
        if last < 1:
            raise ConfigError(f"seekrl average: --last {last} must be at least 1")
        if len(paths) != 1:
            raise ConfigError(f"seekrl average: --last takes one run folder, got {len(paths)} paths; "
                              "give a run folder (runs/<name>) or drop --last and list the folders")
        run = Path(paths[0])
        root = run / "checkpoints" if (run / "checkpoints").is_dir() else run
        found = list_checkpoints(root)
        if len(found) < last:
            raise ConfigError(f"seekrl average: {root} holds {len(found)} complete checkpoint(s), fewer than --last {last}; "
                              "lower --last or train on (train.keep_last keeps that many)")
        return [_model_folder(p) for _, p in found[-last:]]
    if len(paths) < 2:
        raise ConfigError(f"seekrl average: needs at least two model folders, got {len(paths)}; "
                          "list them, or give a run folder with --last K")
    return [_model_folder(Path(p)) for p in paths]


def _model_folder(p: Path) -> Path:
    folder = model_folder(p)
    if (folder / "config.json").is_file():
        return folder
    raise ConfigError(f"seekrl average: '{p}' is neither a model folder (config.json) nor a checkpoint folder (model/config.json); "
                      "give runs/<name>/checkpoints/step_<N>, its model/, or a run folder with --last K")


def _config(folder: Path) -> dict:
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if k not in _IGNORED_CONFIG_KEYS}


def average_models(folders: list[Path], out: str | os.PathLike, weights: list[float] | None = None) -> dict:
    """Write the weighted average of `folders` (equal weights by default; normalised to sum 1)
    to the model folder `out`; returns what average.json records."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    import torch

    folders = [Path(f) for f in folders]
    if len(folders) < 2:
        raise ConfigError(f"seekrl average: needs at least two model folders, got {len(folders)}")
    if weights is None:
        weights = [1.0] * len(folders)
    if len(weights) != len(folders):
        raise ConfigError(f"seekrl average: {len(weights)} weight(s) for {len(folders)} folders; give one --weights value per folder")
    if any(not (w >= 0) for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"seekrl average: --weights {weights} must be >= 0 with a positive sum")
    total = float(sum(weights))
    weights = [float(w) / total for w in weights]
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"seekrl average: --out {out} exists and is not an empty folder; choose another folder or remove it")

    for f in folders:
        check_model_folder(f, key="seekrl average")
    first, config = folders[0], _config(folders[0])
    files = sorted(p.name for p in first.glob("*.safetensors"))
    for f in folders[1:]:
        other = _config(f)
        if other != config:
            key = next(k for k in sorted(set(config) | set(other)) if config.get(k) != other.get(k))
            raise ConfigError(f"seekrl average: {f / 'config.json'} differs from {first / 'config.json'} at \"{key}\" "
                              f"({other.get(key)!r} vs {config.get(key)!r}); average checkpoints of one model only")
        names = sorted(p.name for p in f.glob("*.safetensors"))
        if names != files:
            raise ConfigError(f"seekrl average: {f} holds the safetensors files {names}, {first} holds {files}; "
                              "the folders must be saved alike (the same sharding)")

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tensors_seen = 0
        for name in files:
            handles = [safe_open(str(f / name), framework="pt") for f in folders]
            keys = sorted(handles[0].keys())
            metadata = handles[0].metadata()
            for f, h in zip(folders[1:], handles[1:]):
                other = sorted(h.keys())
                if other != keys:
                    missing = sorted(set(keys) ^ set(other))
                    raise ConfigError(f"seekrl average: {f / name} and {first / name} hold different tensors (first: "
                                      f"'{missing[0]}'); average checkpoints of one model only")
            averaged = {}
            for key in keys:
                parts = [h.get_tensor(key) for h in handles]
                ref = parts[0]
                for f, t in zip(folders[1:], parts[1:]):
                    if t.shape != ref.shape or t.dtype != ref.dtype:
                        raise ConfigError(f"seekrl average: tensor '{key}' is {tuple(t.shape)} {t.dtype} in {f / name} but "
                                          f"{tuple(ref.shape)} {ref.dtype} in {first / name}; average checkpoints of one model only")
                if ref.is_floating_point():
                    acc = torch.zeros(ref.shape, dtype=torch.float32)
                    for w, t in zip(weights, parts):
                        acc.add_(t.to(torch.float32), alpha=w)
                    averaged[key] = acc.to(ref.dtype).contiguous()
                else:
                    for f, t in zip(folders[1:], parts[1:]):
                        if not torch.equal(t, ref):
                            raise ConfigError(f"seekrl average: the {ref.dtype} tensor '{key}' differs between {first / name} "
                                              f"and {f / name}; integer tensors cannot be averaged")
                    averaged[key] = ref.contiguous()
            tensors_seen += len(keys)
            save_file(averaged, str(tmp / name), metadata=metadata or {"format": "pt"})
            del averaged, handles
        for item in sorted(first.iterdir()):  # tokenizer, chat template, config, index: the first folder's
            if item.is_file() and item.suffix != ".safetensors":
                shutil.copy2(item, tmp / item.name)
        record = {"sources": [str(f) for f in folders], "weights": weights, "files": files, "tensors": tensors_seen}
        (tmp / "average.json").write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record
