"""The engine a run samples with, from its `engine:` config section.

    engine = make_engine(cfg, model, tokenizer, run_dir)    # LocalEngine or RemoteEngine
    ...
    engine.close()                                          # stops the servers the run started

- `engine.kind=local`: a LocalEngine on the trainer's own model (shared weights: a weight sync
  only moves the version); with `rollout.mode=async` and `max_staleness > 0` on a copy of it,
  which each weight sync overwrites (the engine samples while the trainer steps). `rollout.compile`
  picks its decode: DynamicCache, or a static KV cache with a torch.compile'd step (static_decode.py).
- `engine.urls`: a RemoteEngine on servers that already run.
- `engine.servers=N`: the policy's initial weights (and tokenizer) are written to
  `<run>/engine/weights/v0`, N servers are started on them on free loopback ports (seekrl's own
  `seekrl serve engine`, or SGLang / vLLM per `engine.server_kind`), their logs go to
  `<run>/engine/server_<i>.log`, and the RemoteEngine stops them on `close()`.

`server_command(cfg, model_dir, port, token)` is how one such server is started; `seekrl launch`
(cluster/ray_launch.py) starts the servers it places on other nodes with it too.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from seekrl.config import Config, ConfigError
from seekrl.config_checks import server_kind
from seekrl.engines.local import LocalEngine

__all__ = ["make_engine", "engine_token", "server_command"]


def engine_token(cfg: Config) -> str | None:
    """engine.token, or the variable engine.token_env names (which must then be set)."""
    e = cfg.engine
    if e.token_env:
        token = os.environ.get(e.token_env)
        if not token:
            raise ConfigError(f"engine.token_env: the environment variable {e.token_env} is not set; export it or drop the key")
        return token
    return e.token


def make_engine(cfg: Config, model, tokenizer, run_dir: str | os.PathLike):
    """The run's InferenceEngine (see the module docstring)."""
    e, r = cfg.engine, cfg.rollout
    if e.kind == "local":
        if r.mode == "async" and r.max_staleness > 0:  # it samples while the trainer steps: a copy, synced at each publish
            # (with max_staleness 0 nothing is sampled during an update, so the weights stay shared)
            model = copy.deepcopy(model).requires_grad_(False)
        return LocalEngine(model, tokenizer, max_batch_size=r.engine_batch_size, seed=cfg.train.seed, compile=r.compile)
    from seekrl.engines.adapters import get_api
    from seekrl.engines.launch import ServerGroup, free_port
    from seekrl.engines.remote import RemoteEngine
    from seekrl.engines.weights import write_weights

    token = engine_token(cfg)
    weights_dir = Path(run_dir) / "engine" / "weights"
    common = dict(api=e.api, token=token, timeout_s=e.timeout_s, max_concurrent=e.max_concurrent,
                  weights_dir=weights_dir, keep_weights=e.keep_weights)
    if e.urls:
        return RemoteEngine(e.urls, **common)
    api = get_api(e.api)
    initial = write_weights(model, weights_dir, 0, tokenizer=tokenizer)
    commands = []
    for i in range(e.servers):
        gpus = ",".join(str(i * e.gpus_per_server + k) for k in range(e.gpus_per_server)) if e.gpus_per_server else None
        commands.append(server_command(cfg, initial, free_port(), token, gpus=gpus))
    group = ServerGroup.start(commands, Path(run_dir) / "engine", health_path=api.health.path,
                              timeout_s=e.startup_timeout_s, token=token)
    exact = server_kind(cfg) == "seekrl" and cfg.model.dtype == "float32"  # same code, same fp32 weights: the trainer's log-probs
    return RemoteEngine(group.urls, **common, exact_logprobs=exact, on_close=group.stop)


def server_command(cfg: Config, model_dir: str | os.PathLike, port: int, token: str | None, *,
                   host: str = "127.0.0.1", gpus: str | None = None):
    """How to start one server of `server_kind(cfg)` on `model_dir` at host:port, as a ServerCommand:
    `seekrl serve engine` (the token in its environment) or SGLang / vLLM (with `--api-key`, in
    engine.server_python's environment when set). `gpus` becomes its CUDA_VISIBLE_DEVICES; None
    leaves the inherited one (a Ray actor's GPUs under `seekrl launch`). make_engine and
    `seekrl launch` start their servers from this."""
    from seekrl.engines.adapters import get_api
    from seekrl.engines.launch import ServerCommand, seekrl_server_command

    e, kind = cfg.engine, server_kind(cfg)
    if kind == "seekrl":
        argv, env = seekrl_server_command(str(model_dir), port, host=host, dtype=cfg.model.dtype, device=cfg.model.device,
                                          max_batch_size=cfg.rollout.engine_batch_size, seed=cfg.train.seed,
                                          extra_args=e.server_args)
        if token:
            from seekrl.servers.engine import TOKEN_ENV

            env = {**env, TOKEN_ENV: token}
    else:
        argv, env = get_api(kind).server_command(str(model_dir), host, port, list(e.server_args))
        if e.server_python:  # the servers' own environment; it still imports seekrl's vLLM worker extension
            argv = [e.server_python, *argv[1:]]
            root = str(Path(__file__).resolve().parents[2])
            env = {**env, "PYTHONPATH": os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)}
        if token:
            argv = [*argv, "--api-key", token]
    if gpus is not None:
        env = {**env, "CUDA_VISIBLE_DEVICES": gpus}
    return ServerCommand(argv, env, f"http://{host}:{port}")
