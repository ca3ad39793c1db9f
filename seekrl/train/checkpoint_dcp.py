"""A sharded optimizer state in a checkpoint (trainer ranks, FSDP2): torch.distributed.checkpoint (DCP), read safely.

`save_sharded_optimizer` (a collective) writes `<name>_dcp/` in a checkpoint folder: every rank
its shard of the AdamW tensors, keyed "state.<parameter name>.<field>", and rank 0 the rest
(param_groups.json). `load_sharded_optimizer` reads it into an optimizer over any number of
ranks, or one process (DCP reshards to the reader's layout). `load_full_optimizer_sharded` puts a
one-process optimizer state (keyed by parameter index) into a sharded one (1 → N ranks).

DCP writes its index `.metadata` with pickle. It is read here by `_MetadataUnpickler`, which
admits only DCP's metadata classes, torch.Size, dtypes, the layout lookup and paths, and
refuses anything else with CheckpointError; DCP itself reads the tensor files with
torch.load(weights_only=True), and the state saved holds only tensors (no pickled objects).
"""

from __future__ import annotations

import pickle
import sys
import warnings
from pathlib import Path

import torch

from seekrl.errors import CheckpointError
from seekrl.train.checkpoint_tree import load_tree, save_tree

__all__ = ["save_sharded_optimizer", "load_sharded_optimizer", "load_full_optimizer_sharded", "check_dcp", "read_dcp_metadata"]


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only what DCP's `.metadata` holds: its dataclasses and enums, torch.Size, dtypes, paths."""

    def find_class(self, module: str, name: str):
        import pathlib

        if module.startswith("torch.distributed.checkpoint"):
            obj = getattr(sys.modules.get(module) or __import__(module, fromlist=[name]), name, None)
            if isinstance(obj, type):
                return obj
        elif module == "torch.serialization" and name == "_get_layout":  # a layout by its name (torch.strided)
            from torch.serialization import _get_layout

            return _get_layout
        elif module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        elif module == "pathlib" and name in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
            return getattr(pathlib, name)
        elif module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        elif module == "builtins" and name in ("set", "frozenset", "slice", "tuple", "list", "dict"):
            return getattr(__import__("builtins"), name)
        raise CheckpointError("", f"optimizer_dcp/.metadata names {module}.{name}, which a DCP index never holds (refusing to load it)")


def read_dcp_metadata(folder: Path):
    """The `.metadata` index of a DCP folder, read by the restricted unpickler."""
    with open(folder / ".metadata", "rb") as f:
        return _MetadataUnpickler(f).load()


def _dcp_reader(folder: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeDCPReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_dcp_metadata(folder)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _SafeDCPReader(str(folder))


def _optimizer_tensors(osd: dict) -> dict[str, torch.Tensor]:
    return {f"state.{fqn}.{k}": v for fqn, st in osd["state"].items() for k, v in st.items() if isinstance(v, torch.Tensor)}


def save_sharded_optimizer(folder: Path, name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, main: bool) -> None:
    """`folder/<name>_dcp/`: every rank writes its shard of the optimizer state (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer)
    extra = {fqn: {k: v for k, v in st.items() if not isinstance(v, torch.Tensor)} for fqn, st in osd["state"].items()}
    dcp.save(_optimizer_tensors(osd), storage_writer=FileSystemWriter(str(folder / f"{name}_dcp")))
    if main:
        save_tree(folder / f"{name}_dcp", "param_groups", {"param_groups": osd["param_groups"], "extra": extra})


def load_sharded_optimizer(folder: Path, name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load `folder/<name>_dcp/` into `optimizer`, whatever number of ranks wrote it or reads it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    src = folder / f"{name}_dcp"
    osd = get_optimizer_state_dict(model, optimizer)  # the state's layout on this run's ranks
    tensors = _optimizer_tensors(osd)
    with warnings.catch_warnings():  # one process reading a sharded save is intended (N ranks -> 1)
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        dcp.load(tensors, storage_reader=_dcp_reader(src))
    saved = load_tree(src, "param_groups")
    state = {fqn: {**saved["extra"].get(fqn, {}), **{k: tensors[f"state.{fqn}.{k}"] for k in st if f"state.{fqn}.{k}" in tensors}}
             for fqn, st in osd["state"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": saved["param_groups"]})


def load_full_optimizer_sharded(tree: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A one-process checkpoint's optimizer (keyed by parameter index) into an optimizer over
    sharded parameters: indices → parameter names, then every rank takes its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state = {names[int(i)]: st for i, st in tree["state"].items()}
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in tree["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))


def check_dcp(folder: Path, name: str) -> None:
    src = folder / f"{name}_dcp"
    if not (src / ".metadata").is_file():
        raise CheckpointError("", f"{name}_dcp/.metadata is missing (an incomplete sharded save)")
    try:
        metadata = read_dcp_metadata(src)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError("", f"{name}_dcp/.metadata is truncated or damaged ({type(e).__name__})") from None
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        f = src / str(info.relative_path)
        if not f.is_file() or f.stat().st_size < info.offset + info.length:
            raise CheckpointError("", f"{name}_dcp/{info.relative_path} is missing or truncated")
    if not (src / "param_groups.json").is_file():
        raise CheckpointError("", f"{name}_dcp/param_groups.json is missing")
