"""Nested state (a state_dict, optimizer or scheduler state) on disk as JSON plus one safetensors file.

    save_tree(folder, "optimizer", opt.state_dict())    # optimizer.json (+ optimizer.safetensors)
    opt.load_state_dict(load_tree(folder, "optimizer"))

Tensors are moved into `<name>.safetensors` under their path in the tree and replaced in the JSON
by {"__tensor__": path}; tuples become {"__tuple__": [...]}, dicts with non-string keys
(optimizer state is keyed by parameter index) {"__items__": [[key, value], ...]}. Nothing is
pickled, so loading runs no code. The checkpoint folder's format (checkpoint.py), its
verification (checkpoint_verify.py) and the sharded optimizer state (checkpoint_dcp.py) use it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

__all__ = ["TENSOR", "TUPLE", "ITEMS", "flatten", "unflatten", "save_tree", "load_tree", "tensor_refs"]

TENSOR, TUPLE, ITEMS = "__tensor__", "__tuple__", "__items__"
_DROP = object()  # a value that cannot be stored (lossy mode only)


def flatten(obj: Any, path: str, tensors: dict[str, torch.Tensor], strict: bool) -> Any:
    """Turn a nested state_dict into JSON, moving every tensor into `tensors` under its path.

    Tensors become {"__tensor__": path}, tuples {"__tuple__": [...]}, dicts with non-string keys
    (optimizer state is keyed by parameter index) {"__items__": [[key, value], ...]}. Values of
    other types raise in strict mode and are dropped otherwise (scheduler lambdas' attributes;
    inside a list they become None).
    """
    if isinstance(obj, torch.Tensor):
        if path in tensors:
            raise ValueError(f"checkpoint: two tensors map to the key {path!r}")
        tensors[path] = obj.detach().cpu().contiguous()
        return {TENSOR: path}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (list, tuple)):
        items = [flatten(v, f"{path}.{i}" if path else str(i), tensors, strict) for i, v in enumerate(obj)]
        items = [None if v is _DROP else v for v in items]  # keep positions (lr_lambdas: None = skip)
        return {TUPLE: items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        plain = all(isinstance(k, str) for k in obj) and not ({TENSOR, TUPLE, ITEMS} & set(obj))
        pairs = []
        for key, value in obj.items():
            if not (key is None or isinstance(key, (bool, int, float, str))):
                raise TypeError(f"checkpoint: cannot store dict key {key!r} at {path or '<root>'}")
            enc = flatten(value, f"{path}.{key}" if path else str(key), tensors, strict)
            if enc is not _DROP:
                pairs.append((key, enc))
        return dict(pairs) if plain else {ITEMS: [list(p) for p in pairs]}
    if strict:
        raise TypeError(f"checkpoint: cannot store {type(obj).__name__} at {path or '<root>'} as JSON or a tensor")
    return _DROP


def unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `flatten`."""
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {TENSOR}:
            return tensors[obj[TENSOR]]
        if set(obj) == {TUPLE}:
            return tuple(unflatten(v, tensors) for v in obj[TUPLE])
        if set(obj) == {ITEMS}:
            return {key: unflatten(value, tensors) for key, value in obj[ITEMS]}
        return {key: unflatten(value, tensors) for key, value in obj.items()}
    return obj


def save_tree(folder: Path, name: str, tree: Any, strict: bool = True) -> None:
    """Write `tree` as folder/name.json (+ folder/name.safetensors when it holds tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = flatten(tree, "", tensors, strict)
    if tensors:
        save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(encoded))


def load_tree(folder: Path, name: str) -> Any:
    json_path, st_path = folder / f"{name}.json", folder / f"{name}.safetensors"
    if not json_path.exists():
        raise FileNotFoundError(f"checkpoint {folder} has no {name} state ({json_path.name}); it was saved without one")
    tensors = load_file(str(st_path)) if st_path.exists() else {}
    return unflatten(json.loads(json_path.read_text()), tensors)


def tensor_refs(obj: Any, out: set[str] | None = None) -> set[str]:
    """The tensor paths a flattened tree's JSON refers to."""
    out = set() if out is None else out
    if isinstance(obj, list):
        for v in obj:
            tensor_refs(v, out)
    elif isinstance(obj, dict):
        if set(obj) == {TENSOR}:
            out.add(str(obj[TENSOR]))
        else:
            for v in obj.values():
                tensor_refs(v, out)
    return out
