"""The `engine:` config section: where tokens are sampled (in the trainer, or on inference servers
over HTTP), which servers, and how new weights reach them. engines/setup.py reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range

__all__ = ["EngineConfig", "EngineDtype", "server_kind"]

_SECONDS = "a finite number > 0 (seconds)"
EngineDtype = Literal["auto", "float32", "bfloat16", "bf16_if_native"]
"""engine.dtype's choices (and demo.grpo_dtype's)."""


@dataclass
class EngineConfig:
    kind: Literal["local", "remote"] = "local"
    """Where tokens are sampled: local (in the training process, LocalEngine) | remote (inference servers over HTTP: engine.urls or engine.servers)."""
    dtype: EngineDtype = "auto"
    """The weights tokens are sampled with: auto (model.dtype: the in-process engine shares the trainer's weights) | float32 | bfloat16 | bf16_if_native (bfloat16 where the device computes it natively: avx512_bf16, AMX or a bf16 GPU; model.dtype elsewhere). An in-process engine in a dtype other than model.dtype samples from a copy of the weights in it, overwritten at every weight sync (a CPU with avx512_bf16 prefills 2.2x as fast in bfloat16, BENCHMARKS.md); its log-probs are then not the trainer's, so old log-probs are recomputed and algo.mismatch=auto corrects the gap. Started servers load this dtype too."""
    api: Literal["sglang", "vllm"] = "sglang"
    """Wire protocol of the servers: sglang (SGLang's native /generate, spoken by `seekrl serve engine` and stock SGLang) | vllm (vLLM's OpenAI server with its RL dev endpoints)."""
    urls: list[str] = field(default_factory=list)
    """Servers that already run (http://host:port); setting it implies kind: remote. Weight folders are passed by path: the servers must see the run folder."""
    servers: int = 0
    """N > 0: start N servers on free loopback ports for this run (the kind engine.server_kind says), stop them when it ends; implies kind: remote."""
    server_kind: Literal["auto", "seekrl", "sglang", "vllm"] = "auto"
    """What engine.servers starts: auto (seekrl's own `seekrl serve engine` for api sglang, vLLM for api vllm) | seekrl | sglang | vllm (sets engine.api=vllm)."""
    server_args: list[str] = field(default_factory=list)
    """Extra command-line flags for each started server (e.g. [--gpu-memory-utilization, '0.5'])."""
    server_python: str | None = None
    """Python interpreter that starts SGLang / vLLM servers (they pin torch and transformers of their own, so they live in their own environment); none: for vLLM the `.venv-vllm/bin/python` that `make vllm` builds when it exists, else this one."""
    gpus_per_server: int = 0
    """GPUs given to each started server through CUDA_VISIBLE_DEVICES (server i gets GPUs i*n .. i*n+n-1); 0: no restriction."""
    weight_sync: Literal["disk", "nccl"] = "disk"
    """How new weights reach the servers: disk (an atomically written safetensors folder, then pause -> update_weights_from_disk -> continue) | nccl (GPU broadcast; SGLang / vLLM servers only)."""
    timeout_s: Annotated[float, Range(gt=0, text=_SECONDS)] = 300.0
    """Timeout of one request to a server, in seconds; a server past it counts as failed (weight loads: engine.weight_sync_timeout_s)."""
    weight_sync_timeout_s: Annotated[float, Range(gt=0, text=_SECONDS)] = 600.0
    """Timeout of each weight-sync call to a server (pause, load from disk, version, continue), in seconds; a server past it counts as failed. Loading a large model takes longer than one request."""
    startup_timeout_s: Annotated[float, Range(gt=0, text=_SECONDS)] = 600.0
    """How long started servers may take to answer /health, in seconds."""
    max_concurrent: int = 256
    """Requests in flight per server; more wait in the client."""
    token: str | None = None
    """Bearer token of the servers (prefer engine.token_env: configs are saved with the run)."""
    token_env: str | None = None
    """Environment variable holding the servers' bearer token (started servers get it too)."""
    keep_weights: int = 2
    """Weight folders kept in <run>/engine/weights (older ones are removed after each sync)."""
    allow_unauthenticated_control: bool = False
    """Let vLLM servers be started on an address other than loopback (`seekrl launch` binds node IPs). vLLM's control endpoints (/collective_rpc, /pause, /resume, /update_weight_version: dev mode) take no token, whatever --api-key says: anyone who reaches the port can pause sampling, load any folder as weights or run the worker methods /collective_rpc names. Set true only on a trusted network."""

    def check(self) -> None:
        """urls or servers imply remote (resolved before the checks); remote needs one of them."""
        if self.servers < 0 or self.gpus_per_server < 0:
            raise ConfigError(f"engine.servers and engine.gpus_per_server must be >= 0, got {self.servers} and {self.gpus_per_server}")
        if self.urls and self.servers:
            raise ConfigError("engine.urls and engine.servers are both set; give servers that run (urls) or a number to start (servers)")
        bad = [u for u in self.urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ConfigError(f"engine.urls: '{bad[0]}' is not an http(s) URL (e.g. http://127.0.0.1:30000)")
        if self.kind == "remote" and not (self.urls or self.servers):
            raise ConfigError("engine.kind=remote needs engine.urls (servers that run) or engine.servers=N (servers to start)")
        if self.max_concurrent < 1 or self.keep_weights < 1:
            raise ConfigError("engine.timeout_s and engine.startup_timeout_s must be > 0, engine.max_concurrent and engine.keep_weights >= 1")
        kind = server_kind(self)
        if self.api == "vllm" and kind in ("seekrl", "sglang") or self.api == "sglang" and kind == "vllm":
            raise ConfigError(f"engine.server_kind={kind} does not speak engine.api={self.api}; use api "
                              f"{'vllm' if kind == 'vllm' else 'sglang'} or server_kind auto")
        if self.weight_sync == "nccl":
            raise ConfigError("engine.weight_sync=nccl is not available yet (the SGLang / vLLM request builders exist, the trainer-side "
                              "broadcast does not); use engine.weight_sync=disk")
        if self.server_python and not Path(self.server_python).is_file():
            raise ConfigError(f"engine.server_python: '{self.server_python}' is not a file; give the python of the servers' environment")
        if self.token and self.token_env:
            raise ConfigError("engine.token and engine.token_env are both set; keep one (token_env keeps the secret out of the saved config)")


def server_kind(e: EngineConfig) -> str:
    """What `engine.servers` starts: engine.server_kind, with auto resolved from engine.api."""
    if e.server_kind != "auto":
        return e.server_kind
    return "vllm" if e.api == "vllm" else "seekrl"
