"""The engine a run samples with, from its `engine:` config section.

    engine = make_engine(cfg.engine, model, tokenizer, run_dir, settings)   # LocalEngine or RemoteEngine
    ...
    engine.close()                                                          # stops the servers the run started

- `engine.kind=local`: a LocalEngine on the trainer's own model (shared weights: a weight sync
  only moves the version), or on a copy of it (`copy_weights`: the async rollout with
  `max_staleness > 0` samples while the trainer steps; or `settings.dtype`, engine.dtype, is not
  the policy's: the copy is in that dtype and its log-probs are not exact), and each weight sync
  overwrites the copy.
  `settings.compile` picks its decode: DynamicCache, or a static KV cache with a torch.compile'd
  step (static_decode.py).
- `engine.urls`: a RemoteEngine on servers that already run.
- `engine.servers=N`: the policy's initial weights (and tokenizer) are written to
  `<run>/engine/weights/v0`, N servers are started on them on free loopback ports (seekrl's own
  `seekrl serve engine`, or SGLang / vLLM per `engine.server_kind`), their logs go to
  `<run>/engine/server_<i>.log`, and the RemoteEngine stops them on `close()`.

`server_command(engine, model_dir, port, token, settings)` is how one such server is started;
`seekrl launch` (cluster/ray_launch.py) starts the servers it places on other nodes with it too.
"""

from __future__ import annotations

import copy
import os

import torch
from dataclasses import dataclass
from pathlib import Path

from seekrl.engines.base import InferenceEngine
from seekrl.engines.config import EngineConfig, server_kind
from seekrl.engines.launch import ENGINE_TOKEN_ENV, ServerCommand, ServerGroup, free_port, seekrl_server_command
from seekrl.engines.local import LocalEngine
from seekrl.errors import ConfigError

__all__ = ["SamplerSettings", "make_engine", "engine_token", "server_command", "default_server_python", "VLLM_VENV",
           "check_control_exposure", "is_loopback"]


@dataclass(frozen=True)
class SamplerSettings:
    """How an engine of seekrl's own (in-process, or `seekrl serve engine`) loads and samples:
    from model.dtype / model.device, rollout.engine_batch_size, rollout.compile, rollout.reuse_kv_tokens and train.seed."""

    dtype: str = "float32"
    device: str = "auto"
    max_batch_size: int = 64
    seed: int = 0
    compile: str = "auto"
    reuse_kv_tokens: int = 0


def engine_token(e: EngineConfig) -> str | None:
    """engine.token, or the variable engine.token_env names (which must then be set)."""
    if e.token_env:
        token = os.environ.get(e.token_env)
        if not token:
            raise ConfigError(f"engine.token_env: the environment variable {e.token_env} is not set; export it or drop the key")
        return token
    return e.token


def make_engine(e: EngineConfig, model, tokenizer, run_dir: str | os.PathLike, settings: SamplerSettings, *,
                copy_weights: bool = False) -> InferenceEngine:
    """The run's InferenceEngine (see the module docstring)."""
    if e.kind == "local":
        dtype = _DTYPES[settings.dtype]
        own = next(model.parameters()).dtype != dtype  # engine.dtype other than the policy's: a copy in it, synced at each publish
        if copy_weights or own:  # (copy_weights: it samples while the trainer steps)
            model = copy.deepcopy(model).requires_grad_(False).to(dtype)
        return LocalEngine(model, tokenizer, max_batch_size=settings.max_batch_size, seed=settings.seed, compile=settings.compile,
                           reuse_kv_tokens=settings.reuse_kv_tokens, exact_logprobs=not own)
    from seekrl.engines.adapters import get_api
    from seekrl.engines.remote import RemoteEngine
    from seekrl.engines.weights import write_weights

    token = engine_token(e)
    weights_dir = Path(run_dir) / "engine" / "weights"
    common = dict(api=e.api, token=token, timeout_s=e.timeout_s, weight_sync_timeout_s=e.weight_sync_timeout_s,
                  max_concurrent=e.max_concurrent,
                  weights_dir=weights_dir, keep_weights=e.keep_weights)
    if e.urls:
        return RemoteEngine(e.urls, **common)
    api = get_api(e.api)
    initial = write_weights(model, weights_dir, 0, tokenizer=tokenizer, untie_embeddings=e.api == "vllm")
    commands = []
    for i in range(e.servers):
        gpus = ",".join(str(i * e.gpus_per_server + k) for k in range(e.gpus_per_server)) if e.gpus_per_server else None
        commands.append(server_command(e, initial, free_port(), token, settings, gpus=gpus))
    group = ServerGroup.start(commands, Path(run_dir) / "engine", health_path=api.health.path,
                              timeout_s=e.startup_timeout_s, token=token)
    exact = server_kind(e) == "seekrl" and settings.dtype == "float32"  # same code, same fp32 weights: the trainer's log-probs
    return RemoteEngine(group.urls, **common, exact_logprobs=exact, on_close=group.stop)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

VLLM_VENV = ".venv-vllm"  # what `make vllm` builds: vLLM's CPU build, which pins its own torch and transformers


def default_server_python() -> str | None:
    """The interpreter of `make vllm`'s environment (`.venv-vllm/bin/python` in the working
    directory or the checkout seekrl runs from), when it exists; else None (this interpreter)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        python = root / VLLM_VENV / "bin" / "python"
        if python.is_file():
            return str(python)
    return None


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is loopback only: localhost, 127.0.0.0/8, ::1."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_control_exposure(e: EngineConfig, host: str) -> None:
    """vLLM's control endpoints (/collective_rpc, /pause, /resume, /update_weight_version) take no
    token even with --api-key: a vLLM server on an address other than loopback is refused unless
    engine.allow_unauthenticated_control is set (ConfigError, one line)."""
    if server_kind(e) == "vllm" and not is_loopback(host) and not e.allow_unauthenticated_control:
        raise ConfigError(f"a vLLM server would listen on {host}, and vLLM's control endpoints (/collective_rpc, /pause, "
                          "/update_weight_version) take no token; set engine.allow_unauthenticated_control=true on a trusted "
                          "network, or serve on loopback")


CHUNKED_PREFILL_FLAGS = ("--enable-chunked-prefill", "--no-enable-chunked-prefill")
# VLLM_CPU_PREFILL: vLLM 0.32's model runner rewinds the generator of a seeded request whose
# sampled token it discards (a prompt prefilled in chunks, over several steps) with
# `Generator.set_offset`, which a CPU generator refuses ("CPU Generator does not use offset"): the
# engine core dies and every request in flight gets HTTP 500. seekrl seeds every request, and the
# recipe's 64 episodes at once overflow one step's token budget, so on a CPU seekrl starts vLLM
# with whole-prompt prefill (`--no-enable-chunked-prefill`) unless engine.server_args says otherwise.


def _on_cpu(device: str) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device.startswith("cpu")


def server_command(e: EngineConfig, model_dir: str | os.PathLike, port: int, token: str | None, settings: SamplerSettings, *,
                   host: str = "127.0.0.1", gpus: str | None = None) -> ServerCommand:
    """How to start one server of `server_kind(e)` on `model_dir` at host:port: `seekrl serve
    engine` (the token in its environment) or SGLang / vLLM (with `--api-key`, in
    engine.server_python's environment when set). `gpus` becomes its CUDA_VISIBLE_DEVICES; None
    leaves the inherited one (a Ray actor's GPUs under `seekrl launch`). make_engine and
    `seekrl launch` start their servers from this."""
    from seekrl.engines.adapters import get_api

    kind = server_kind(e)
    check_control_exposure(e, host)
    if kind == "seekrl":
        argv, env = seekrl_server_command(str(model_dir), port, host=host, dtype=settings.dtype, device=settings.device,
                                          max_batch_size=settings.max_batch_size, seed=settings.seed, extra_args=e.server_args)
        if token:
            env = {**env, ENGINE_TOKEN_ENV: token}
    else:
        args = list(e.server_args)
        if kind == "vllm" and not any(a == "--dtype" or a.startswith("--dtype=") for a in args):
            args += ["--dtype", settings.dtype]  # model.dtype, as the trainer's (vLLM's own default may differ)
        if kind == "vllm" and _on_cpu(settings.device) and not any(a.split("=", 1)[0] in CHUNKED_PREFILL_FLAGS for a in args):
            args += ["--no-enable-chunked-prefill"]  # the CPU build dies on a seeded request's partial prefill (VLLM_CPU_PREFILL)
        argv, env = get_api(kind).server_command(str(model_dir), host, port, args)
        python = e.server_python or (default_server_python() if kind == "vllm" else None)
        if python:  # the servers' own environment; it still imports seekrl's vLLM worker extension
            argv = [python, *argv[1:]]
            root = str(Path(__file__).resolve().parents[2])
            env = {**env, "PYTHONPATH": os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)}
        if token:
            argv = [*argv, "--api-key", token]
    if gpus is not None:
        env = {**env, "CUDA_VISIBLE_DEVICES": gpus}
    return ServerCommand(argv, env, f"http://{host}:{port}")
