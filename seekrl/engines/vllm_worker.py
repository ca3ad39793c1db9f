"""A vLLM worker extension that loads a folder of *.safetensors into the served model.

RemoteEngine's vLLM adapter (adapters.py) starts `vllm serve` with
`--worker-extension-cls seekrl.engines.vllm_worker.SeekrlWorkerExtension`. vLLM 0.33 then adds
this class to its Worker's bases (vllm/v1/worker/worker_base.py, `init_worker`; a name the
Worker already has is an error, so the class holds one method and the helpers are functions),
and every worker runs the method on a collective RPC. Over HTTP (dev mode):

    POST /collective_rpc {"method": "load_weights_from_folder", "args": ["/run/engine/weights/v3"]}
    -> {"results": ["291", ...]}          # one per worker: the tensors it read (str() of the int)

Each worker reads every tensor of the folder (tensor-parallel sharding is done by the model's
weight loaders) with safetensors' `safe_open`, one tensor at a time: no pickle, and at most one
tensor in memory beyond the model. Inside vLLM the tensors go through the Worker's
`reload_weights(weights_iterator=..., is_checkpoint_format=True)` (vllm/v1/worker/gpu_worker.py
-> model_executor/model_loader/reload/inplace.py: a layer-wise reload that re-runs the
post-load processing of quantised layers, then resets LoRA / encoder / multimodal caches).
Without it (an older vLLM, or a test double) they go to `model_runner.model.load_weights`.

After each load the worker gives glibc's free pages back (`seekrl.memory.release`, malloc_trim).
A vLLM CPU worker grows with sampling, not with reloads: with every new batch shape oneDNN caches
a primitive (the adapter caps that cache, adapters.py), and glibc keeps what was freed. A GRPO run
reloads once a step, between one step's sampling and the next, so the trim runs once a step.
Measured on a SmolLM2 worker, 16 rounds of 64 completions and a reload: 1.45 GiB flat, against
1.56 -> 2.85 GiB with neither (bench/vllm_worker_memory.py; BENCHMARKS.md, "vLLM worker memory").
SEEKRL_MALLOC_TRIM=0 leaves the trim out.

Nothing from vLLM is imported here, so this module imports (and its tests run) on a CPU machine
without vLLM: `python -m pytest tests/unit/test_engine_adapters.py -q`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from seekrl.memory import release

__all__ = ["SeekrlWorkerExtension", "safetensors_files", "TensorStream"]


def safetensors_files(folder: str) -> list[Path]:
    """The *.safetensors files of `folder`, sorted by name; FileNotFoundError when there are none."""
    paths = sorted(Path(folder).glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    return paths


class TensorStream:
    """(name, tensor) pairs of some safetensors files, read one tensor at a time; `count` says how many were read."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.count = 0

    def __iter__(self) -> Iterator[tuple[str, object]]:
        from safetensors import safe_open

        for path in self.paths:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    self.count += 1
                    yield name, f.get_tensor(name)


def _served_model(model_runner):
    """The model a vLLM model runner serves (unwrapped from CUDA-graph wrappers when it can say)."""
    get_model = getattr(model_runner, "get_model", None)
    return get_model() if callable(get_model) else model_runner.model


class SeekrlWorkerExtension:
    """Mixed into vLLM's Worker by `--worker-extension-cls`: methods callable by collective_rpc."""

    def load_weights_from_folder(self, folder: str) -> int:
        """Load every tensor of the *.safetensors files in `folder` into the served model; return how many."""
        stream = TensorStream(safetensors_files(folder))
        reload_weights = getattr(self, "reload_weights", None)  # vLLM's Worker method (set_current_vllm_config inside)
        if callable(reload_weights):
            reload_weights(weights_iterator=iter(stream), is_checkpoint_format=True)
        else:
            _served_model(self.model_runner).load_weights(weights=iter(stream))
        if stream.count == 0:
            raise ValueError(f"the *.safetensors files in {folder} hold no tensor")
        release()  # the sampling since the last reload left glibc's heap full of free pages: give them back
        return stream.count
