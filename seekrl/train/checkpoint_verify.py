"""Is a checkpoint folder intact for a load? Checked before anything is loaded (train/checkpoint.py).

`verify_checkpoint` reads no tensor data: it checks that every file the load would read exists
and parses (state.json an object with an integer "step" when resuming; every JSON file; every
safetensors header, and the file as long as the header says; the tensors a tree's JSON names;
a sharded optimizer's DCP index and shard files, checkpoint_dcp.py). A problem raises
CheckpointError with the folder and one reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from seekrl.errors import CheckpointError
from seekrl.models import is_peft, unwrap_module
from seekrl.train.checkpoint_dcp import check_dcp
from seekrl.train.checkpoint_tree import tensor_refs

__all__ = ["verify_checkpoint"]


def _json_file(folder: Path, rel: str) -> Any:
    try:
        return json.loads((folder / rel).read_text())
    except FileNotFoundError:
        raise CheckpointError("", f"{rel} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError("", f"{rel} is not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _check_tree(folder: Path, name: str, keys: dict[str, set[str]]) -> None:
    refs = tensor_refs(_json_file(folder, f"{name}.json"))
    if not refs:
        return
    st = f"{name}.safetensors"
    if st not in keys:
        raise CheckpointError("", f"{st} is missing ({name}.json refers to {len(refs)} tensors)")
    missing = sorted(refs - keys[st])
    if missing:
        raise CheckpointError("", f"{st} lacks {len(missing)} tensors that {name}.json names (e.g. {missing[0]})")


def _verified_state(
    folder: Path, *, model: torch.nn.Module | None, optimizer: bool, scheduler: bool, critic: bool,
    critic_optimizer: bool, restore_rng: bool, kind: str | None, require_step: bool,
) -> Any:
    """The checkpoint's state (state.json) if `folder` is intact for this load; raises
    CheckpointError with only `reason` set otherwise."""
    if not folder.exists():
        raise CheckpointError("", "does not exist")
    if not folder.is_dir():
        raise CheckpointError("", "is not a folder")
    if not (folder / "state.json").is_file():
        raise CheckpointError("", "has no state.json (an incomplete save)")
    state = _json_file(folder, "state.json")
    step = state.get("step") if isinstance(state, dict) else None
    if require_step and (isinstance(step, bool) or not isinstance(step, int)):
        raise CheckpointError("", "state.json has no integer 'step'")
    saved_kind = str(state.get("kind", "rl")) if isinstance(state, dict) else "?"
    if kind is not None and saved_kind != kind:
        command = {"rl": "seekrl train", "sft": "seekrl sft"}
        raise CheckpointError("", f"is a checkpoint of {command.get(saved_kind, saved_kind)}, not of {command.get(kind, kind)}; "
                                  f"to start from its weights, set model.path={folder / 'model'}")
    # every file that parses must parse: JSON anywhere in the folder, safetensors headers
    keys: dict[str, set[str]] = {}
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if f.suffix == ".json" and rel != "state.json":
            _json_file(folder, rel)
        elif f.suffix == ".safetensors":
            try:
                with safe_open(str(f), "pt") as st:
                    keys[rel] = set(st.keys())
            except Exception as e:  # SafetensorError (a bare Exception subclass), OSError
                raise CheckpointError("", f"{rel} is truncated or not safetensors ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if model is not None:
        if is_peft(unwrap_module(model)):
            if "adapter/adapter_model.safetensors" not in keys:
                raise CheckpointError("", "adapter/adapter_model.safetensors is missing (the model is a peft model)")
        elif not any(k.startswith("model/") and k.count("/") == 1 for k in keys):
            raise CheckpointError("", "model/ has no .safetensors weights")
        index = folder / "model" / "model.safetensors.index.json"
        if index.is_file():
            index_json = _json_file(folder, "model/model.safetensors.index.json")
            weight_map = index_json.get("weight_map") if isinstance(index_json, dict) else None
            absent = sorted({f"model/{v}" for v in weight_map.values()} - set(keys)) if isinstance(weight_map, dict) else []
            if absent:
                raise CheckpointError("", f"{absent[0]} is missing (model.safetensors.index.json names it)")
    for wanted, name in ((optimizer, "optimizer"), (scheduler, "scheduler"), (critic_optimizer, "critic_optimizer")):
        if wanted and (folder / f"{name}_dcp").is_dir():
            check_dcp(folder, name)
        elif wanted:
            if not (folder / f"{name}.json").is_file():
                raise CheckpointError("", f"{name}.json is missing (it was saved without a {name.replace('_', ' ')})")
            _check_tree(folder, name, keys)
    if critic and "critic.safetensors" not in keys:
        raise CheckpointError("", "critic.safetensors is missing (it was saved without a critic)")
    if restore_rng:
        if "torch_cpu" not in keys.get("rng.safetensors", set()):
            raise CheckpointError("", "rng.safetensors is missing or has no torch_cpu state")
        rng = _json_file(folder, "rng.json")
        if not isinstance(rng, dict) or not {"python", "numpy"} <= set(rng):
            raise CheckpointError("", "rng.json lacks the python or numpy state")
    return state


def verify_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    critic: torch.nn.Module | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
    kind: str | None = None,
    require_step: bool = False,
) -> Any:
    """Check, without loading anything, that `load_checkpoint(path, ...)` with the same arguments
    finds every file it reads, intact (module docstring); return the state (state.json).

    `kind` (e.g. "rl", "sft") must match state.json's "kind" (absent: "rl"); `require_step`:
    the state must be an object with an integer "step" (what resuming needs). Raises
    CheckpointError("checkpoint <path>: <reason>") otherwise.
    """
    folder = Path(path)
    try:
        return _verified_state(
            folder, model=model, optimizer=optimizer is not None, scheduler=scheduler is not None,
            critic=critic is not None, critic_optimizer=critic_optimizer is not None, restore_rng=restore_rng, kind=kind,
            require_step=require_step,
        )
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {folder}: {e.reason}", e.reason) from None
