"""Save and resume training: safetensors for tensors, JSON for everything else, nothing pickled.

A checkpoint is a folder `ckpt_root/step_<N>/`:

    model/                      save_pretrained output (+ tokenizer): loads with
                                AutoModelForCausalLM.from_pretrained; for a peft model it holds
                                the *merged* weights, so it is a standalone model
    adapter/                    peft models only: the adapter (what resume loads)
    optimizer.safetensors/.json optimizer.state_dict(): tensors under keys like
                                "state.<param_idx>.exp_avg", the rest (param_groups, ...) as JSON
    optimizer_dcp/              instead, when the optimizer state is sharded over trainer ranks
                                (FSDP2): torch.distributed.checkpoint files of the tensors, each
                                rank its shard, keyed "state.<param_name>.exp_avg"; param_groups.json
                                the rest. Loads on any number of ranks (DCP reshards), or one.
    scheduler.json              lr scheduler state_dict() (plain fields; functions are code)
    critic.safetensors          value model / value head state_dict()
    critic_optimizer.*          its optimizer, as above
    rng.safetensors, rng.json   torch CPU/CUDA generator states; python and numpy states
    state.json                  the caller's loop state (step, data iterator, KL controller, ...)

Nothing is unpickled here (no torch.load); the one pickle in a checkpoint, the `.metadata`
index DCP writes into an optimizer_dcp/ folder, is read by checkpoint_dcp.py with an unpickler that
admits only DCP's metadata classes, torch sizes, dtypes and layouts, and DCP reads its tensor
files with `torch.load(weights_only=True)`; so loading a checkpoint cannot run code. One process writes the
folder (rank 0 under torch distributed); with a sharded optimizer every rank writes its shard
into it (`save_ranks_checkpoint`: rank 0 writes the model from its full copy, the critic gathered,
the scheduler, RNG and loop state; every rank its shard into `optimizer_dcp/` before rank 0 writes
state.json, which marks the folder complete; with train.fsdp=none rank 0 writes the one-process
layout). Loading reshards: a checkpoint of N ranks resumes on M ranks or on one.

Crash safety. A checkpoint is written into `step_<N>.tmp/` (state.json last) and renamed into
place when complete; then the pointer `ckpt_root/latest` (one line: the folder name, e.g.
`step_12`) is replaced atomically (temp file, fsync, os.replace); only then are old checkpoints
pruned (`keep_last`; never the one the pointer names) and stale `.tmp` / `.old` folders removed.
So a process killed at any moment leaves the previous checkpoint and a pointer to it.
Checkpoints can still be damaged after the fact (a full disk, a crash of the machine before the
page cache reached the disk, a partial copy): `verify_checkpoint` (checkpoint_verify.py) checks, before anything is
loaded, that every file a load reads exists and parses (state.json is a JSON object with an
integer "step"; every JSON file parses; every safetensors file's header is valid and the file
is as long as the header says, which catches truncation; the tensors optimizer.json names are in
optimizer.safetensors). `resume_checkpoint` (train.resume) uses the pointer's checkpoint when it
is intact, else the newest intact `step_<N>`, warning one line for each one it skips.
Safetensors files carry no checksum: flipped bits inside tensor data are not detected.

    path = save_checkpoint("runs/x/ckpt", step, model=policy, optimizer=opt, scheduler=sched,
                           state={"step": step, "data": loader.state_dict()}, keep_last=2)
    ...
    if (found := resume_checkpoint("auto", "runs/x/ckpt", model=policy, optimizer=opt, scheduler=sched)):
        path, state = found   # loaded: policy, opt and sched hold the checkpoint's values
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from seekrl.errors import CheckpointError
from seekrl.models import is_peft, unwrap_module
from seekrl.parallel.fsdp import full_state_dict, is_sharded, load_full_state_dict
from seekrl.parallel.ranks import Ranks
from seekrl.train.checkpoint_dcp import load_full_optimizer_sharded, load_sharded_optimizer, save_sharded_optimizer
from seekrl.train.checkpoint_tree import load_tree, save_tree
from seekrl.train.checkpoint_verify import verify_checkpoint

__all__ = ["save_checkpoint", "save_ranks_checkpoint", "load_checkpoint", "resume_checkpoint", "find_checkpoint",
           "latest_checkpoint", "list_checkpoints", "load_optimizer", "model_folder", "LATEST"]

_STEP_DIR = re.compile(r"^step_(\d+)$")
LATEST = "latest"  # ckpt_root/latest: the name of the newest complete checkpoint folder
# --------------------------------------------------------------------------- models
def model_folder(path: str | os.PathLike) -> Path:
    """`path`, or its model/ folder when `path` is a checkpoint folder (runs/NAME/checkpoints/step_N):
    the folder a checkpoint's weights load from (`_save_model` writes them there)."""
    p = Path(path)
    if p.is_dir() and not (p / "config.json").is_file() and (p / "model" / "config.json").is_file():
        return p / "model"
    return p


def _save_model(model: torch.nn.Module, tokenizer: Any, folder: Path) -> None:
    model = unwrap_module(model)
    model_dir = folder / "model"
    if is_peft(model):
        model.save_pretrained(str(folder / "adapter"), safe_serialization=True)
        merged = copy.deepcopy(model).merge_and_unload()  # a copy: the live model keeps its adapter
        merged.save_pretrained(str(model_dir))
        del merged
    elif hasattr(model, "save_pretrained"):
        model.save_pretrained(str(model_dir))  # transformers 5 always writes safetensors
    else:  # a plain nn.Module: one safetensors file (shared tensors stored once)
        model_dir.mkdir(parents=True)
        save_model(model, str(model_dir / "model.safetensors"))
    if not list(model_dir.glob("*.safetensors")):
        raise RuntimeError(f"checkpoint: {type(model).__name__}.save_pretrained wrote no .safetensors file in {model_dir}")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(model_dir))


def _load_model(model: torch.nn.Module, folder: Path) -> None:
    model = unwrap_module(model)
    if is_peft(model):
        from peft import set_peft_model_state_dict

        adapter_file = folder / "adapter" / "adapter_model.safetensors"
        if not adapter_file.exists():
            raise FileNotFoundError(f"checkpoint: the model is a peft model but {adapter_file} does not exist")
        result = set_peft_model_state_dict(model, load_file(str(adapter_file)), adapter_name=model.active_adapter)
        if result.unexpected_keys:
            raise RuntimeError(f"checkpoint: adapter weights do not match the model: unexpected {result.unexpected_keys[:5]}")
        return
    files = sorted((folder / "model").glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint: no .safetensors weights in {folder / 'model'}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    if _is_sharded(model):  # FSDP2 over several ranks: every rank reads the full weights and keeps its shard
        load_full_state_dict(model, weights)
        return
    result = model.load_state_dict(weights, strict=False)
    # A missing key is fine only if it is tied to (shares storage with) a key that was loaded,
    # e.g. lm_head.weight with tie_word_embeddings: save_pretrained stores tied weights once.
    current = model.state_dict(keep_vars=True)
    loaded_ptrs = {current[k].data_ptr() for k in weights if k in current}
    untied_missing = [k for k in result.missing_keys if current[k].data_ptr() not in loaded_ptrs]
    if untied_missing or result.unexpected_keys:
        raise RuntimeError(
            f"checkpoint: weights in {folder / 'model'} do not match {type(model).__name__}: "
            f"missing {untied_missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )


# --------------------------------------------------------------------------- optimizer, either layout
def _is_sharded(model: torch.nn.Module | None) -> bool:
    return model is not None and is_sharded(model)


def load_optimizer(folder: Path, name: str, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer state in either layout (full `<name>.json` or sharded `<name>_dcp/`) into
    `optimizer`, sharded over ranks or not: N ranks → M ranks."""
    if (folder / f"{name}_dcp").is_dir():
        if model is None:
            raise CheckpointError("", f"{name}_dcp/ is keyed by parameter name: pass the model with the optimizer")
        load_sharded_optimizer(folder, name, model, optimizer)
    elif _is_sharded(model):
        load_full_optimizer_sharded(load_tree(folder, name), model, optimizer)
    else:
        optimizer.load_state_dict(load_tree(folder, name))


def _load_critic(critic: torch.nn.Module, folder: Path) -> None:
    if _is_sharded(critic):
        load_full_state_dict(critic, load_file(str(folder / "critic.safetensors")))
    else:
        load_model(unwrap_module(critic), str(folder / "critic.safetensors"), strict=True)


# --------------------------------------------------------------------------- RNG
def _save_rng(folder: Path) -> None:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    save_file(tensors, str(folder / "rng.safetensors"))
    version, py_state, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    rng = {
        "python": [version, list(py_state), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    (folder / "rng.json").write_text(json.dumps(rng))


def _load_rng(folder: Path) -> None:
    tensors = load_file(str(folder / "rng.safetensors"))
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():  # a resume on fewer GPUs restores the ones it has
        for i in range(torch.cuda.device_count()):
            if f"cuda.{i}" in tensors:
                torch.cuda.set_rng_state(tensors[f"cuda.{i}"], device=i)
    rng = json.loads((folder / "rng.json").read_text())
    version, py_state, gauss = rng["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# --------------------------------------------------------------------------- public API
def list_checkpoints(ckpt_root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `ckpt_root` as (step, path), oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir() and (child / "state.json").exists():
            found.append((int(m.group(1)), child))
    return sorted(found)


def _read_latest(root: Path) -> str | None:
    """The folder name `root/latest` holds (a valid `step_<N>` name), or None."""
    try:
        name = (root / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if _STEP_DIR.match(name) else None


def _write_latest(root: Path, name: str) -> None:
    """Point `root/latest` at `name` atomically: a reader sees the old pointer or the new one."""
    tmp = root / f"{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)


def latest_checkpoint(ckpt_root: str | os.PathLike) -> Path | None:
    """The checkpoint `ckpt_root/latest` names when it is complete (has state.json), else the
    complete checkpoint with the highest step, or None (`.tmp` and partial folders ignored).
    Complete is not intact: `verify_checkpoint` (or `resume_checkpoint`) checks the files."""
    root = Path(ckpt_root)
    name = _read_latest(root)
    if name is not None and (root / name / "state.json").is_file():
        return root / name
    found = list_checkpoints(ckpt_root)
    return found[-1][1] if found else None


def _warn(message: str) -> None:
    print(f"seekrl: warning: {message}", file=sys.stderr, flush=True)


def find_checkpoint(resume: str, ckpt_root: str | os.PathLike, *, warn=_warn, **load_args) -> Path | None:
    """The checkpoint `train.resume` names, verified for `load_checkpoint(path, **load_args)`.

    "never": None. A path: that folder if intact, else CheckpointError. "auto": the folder
    `ckpt_root/latest` names if intact, else the newest intact `step_<N>`; each one skipped is
    reported by `warn` in one line ("skipping checkpoint <path>: <reason>"); None when there is
    no `step_<N>` folder (a fresh run); CheckpointError when none is intact.
    """
    if resume == "never":
        return None
    if resume != "auto":
        try:
            verify_checkpoint(resume, require_step=True, **load_args)
        except CheckpointError as e:
            if e.reason.startswith("is a checkpoint of"):
                raise CheckpointError(f"train.resume: '{resume}' {e.reason}", e.reason) from None
            what = e.reason if e.reason.startswith(("does not", "is not")) else f"is not an intact checkpoint: {e.reason}"
            raise CheckpointError(
                f"train.resume: '{resume}' {what}; give a checkpoint folder (runs/<name>/checkpoints/step_<N>), auto or never",
                e.reason,
            ) from None
        return Path(resume)
    root = Path(ckpt_root)
    numbered = []  # every step_<N> folder, complete or not: a damaged one is reported, not silently passed over
    for child in root.iterdir() if root.is_dir() else ():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir():
            numbered.append((int(m.group(1)), child))
    folders = [p for _, p in sorted(numbered, reverse=True)]
    pointed = _read_latest(root)
    if pointed is not None:
        if (root / pointed) in folders:
            folders.remove(root / pointed)
            folders.insert(0, root / pointed)
        else:
            warn(f"{root / LATEST} names {pointed}, which does not exist; using the newest intact checkpoint")
    if not folders:
        return None
    for path in folders:
        try:
            verify_checkpoint(path, require_step=True, **load_args)
            return path
        except CheckpointError as e:
            if e.reason.startswith("is a checkpoint of"):  # every folder of the run is of that kind
                raise CheckpointError(f"train.resume=auto: {path} {e.reason}", e.reason) from None
            warn(f"skipping checkpoint {path}: {e.reason}")
    raise CheckpointError(
        f"train.resume=auto: none of the {len(folders)} checkpoints in {root} is intact (warnings above); "
        f"move them away to start over, or set train.resume to a checkpoint folder", "no intact checkpoint",
    )


def resume_checkpoint(resume: str, ckpt_root: str | os.PathLike, *, warn=_warn, **load_args) -> tuple[Path, dict] | None:
    """Find the checkpoint `train.resume` names (`find_checkpoint`) and load it into what
    `load_args` holds (model=..., optimizer=..., as `load_checkpoint` takes them, plus `kind`);
    return (path, state), or None for a fresh run.

    Weights that do not fit the model (another architecture or size) raise CheckpointError
    with the first line of the underlying error.
    """
    path = find_checkpoint(resume, ckpt_root, warn=warn, **load_args)
    if path is None:
        return None
    try:
        state = load_checkpoint(path, **load_args)
    except (RuntimeError, KeyError) as e:  # load_state_dict: size mismatch / missing or unexpected keys
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"train.resume: {path} does not fit this run ({first}); resume with the config it was saved with, "
            f"or train a new log.name", first,
        ) from None
    return path, state


def save_checkpoint(
    ckpt_root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    critic: torch.nn.Module | dict[str, torch.Tensor] | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    state: dict,
    keep_last: int | None = None,
    before_state=None,
) -> Path:
    """Write `ckpt_root/step_<step>/` atomically, point `ckpt_root/latest` at it, and return its
    path (see the module docstring).

    `state` must be JSON-serializable. `keep_last=K` then deletes complete checkpoints until K
    are left: this one and the newest K-1 others (by step number); None keeps all. `critic` may
    be its gathered weights (a dict). `before_state(tmp)` runs before state.json marks the folder
    complete: the trainer ranks write their optimizer shards there (`save_ranks_checkpoint`).
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    try:
        state_text = json.dumps(state, indent=2)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint state must be JSON-serializable: {e}") from None
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step_{int(step)}", root / f"step_{int(step)}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a save that was killed
    tmp.mkdir()

    _save_model(model, tokenizer, tmp)
    if optimizer is not None:
        save_tree(tmp, "optimizer", optimizer.state_dict())
    if scheduler is not None:
        save_tree(tmp, "scheduler", scheduler.state_dict(), strict=False)
    if isinstance(critic, dict):
        save_file({k: v.contiguous() for k, v in critic.items()}, str(tmp / "critic.safetensors"))
    elif critic is not None:
        save_model(unwrap_module(critic), str(tmp / "critic.safetensors"))
    if critic_optimizer is not None:
        save_tree(tmp, "critic_optimizer", critic_optimizer.state_dict())
    _save_rng(tmp)
    if before_state is not None:
        before_state(tmp)
    (tmp / "state.json").write_text(state_text)  # written last: marks the folder complete

    if final.exists():  # saving the same step again (e.g. after a resume): swap it out
        old = root / f"step_{int(step)}.old"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _write_latest(root, final.name)  # last: the pointer only ever names a complete checkpoint

    if keep_last is not None:  # never the one just written (the pointer's), even if older than others
        others = [path for _, path in list_checkpoints(root) if path != final]
        for path in others[: max(0, len(others) - (keep_last - 1))]:
            doomed = path.with_name(path.name + ".old")  # out of sight first: a kill mid-delete leaves no half checkpoint
            if doomed.exists():
                shutil.rmtree(doomed)
            os.rename(path, doomed)
            shutil.rmtree(doomed)
    for stale in root.glob("step_*"):  # left by killed saves: partial .tmp, swapped-out or half-deleted .old
        if stale.is_dir() and stale.suffix in (".tmp", ".old"):
            shutil.rmtree(stale, ignore_errors=True)
    return final


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    critic: torch.nn.Module | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
    kind: str | None = None,
) -> dict:
    """Restore what is passed, in place, from the checkpoint folder `path`; return its state dict.

    Model weights are copied into the existing model (for a peft model, the adapter weights).
    Load the optimizer after constructing the scheduler: the saved param_groups (current lr)
    replace what the fresh scheduler set. The files are verified first (`verify_checkpoint`,
    with `kind`): a damaged checkpoint raises CheckpointError before anything is changed.
    """
    folder = Path(path)
    state = verify_checkpoint(
        folder, model=model, optimizer=optimizer, scheduler=scheduler, critic=critic,
        critic_optimizer=critic_optimizer, restore_rng=restore_rng, kind=kind,
    )
    if model is not None:
        _load_model(model, folder)
    if optimizer is not None:
        load_optimizer(folder, "optimizer", model, optimizer)
    if scheduler is not None:
        scheduler.load_state_dict(load_tree(folder, "scheduler"))
    if critic is not None:
        _load_critic(critic, folder)
    if critic_optimizer is not None:
        load_optimizer(folder, "critic_optimizer", critic, critic_optimizer)
    if restore_rng:
        _load_rng(folder)
    return state


# --------------------------------------------------------------------------- several trainer ranks
def save_ranks_checkpoint(ranks: Ranks, ckpt_root: Path, step: int, *, model, full_model, tokenizer, optimizer, scheduler,
                          critic=None, critic_optimizer=None, state: dict, keep_last: int | None) -> Path | None:
    """Every rank calls this; returns the folder on rank 0 (None on the others)."""
    if not ranks.sharded:
        path = None
        if ranks.is_main:
            path = save_checkpoint(ckpt_root, step, model=full_model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                                   critic=critic, critic_optimizer=critic_optimizer, state=state, keep_last=keep_last)
        ranks.barrier()
        return path
    critic_weights = full_state_dict(critic, ranks) if critic is not None else None

    def write_shards(tmp: Path) -> None:
        save_sharded_optimizer(tmp, "optimizer", model, optimizer, ranks.is_main)
        if critic is not None:
            save_sharded_optimizer(tmp, "critic_optimizer", critic, critic_optimizer, ranks.is_main)

    def rank0_shards(tmp: Path) -> None:  # inside save_checkpoint, before state.json: the others join here
        ranks.broadcast_json(str(tmp))
        write_shards(tmp)

    path = None
    if ranks.is_main:
        path = save_checkpoint(ckpt_root, step, model=full_model, tokenizer=tokenizer, scheduler=scheduler, critic=critic_weights,
                               state=state, keep_last=keep_last, before_state=rank0_shards)
    else:
        write_shards(Path(ranks.broadcast_json(None)))
    ranks.barrier()  # no rank goes on before the checkpoint is complete
    return path
