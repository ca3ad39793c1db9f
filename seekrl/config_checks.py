"""Cross-field checks of a loaded `Config` (`validate`, run last by `config.load_config`): every
one fails before any model loads, with a one-line `ConfigError` that names the key and the fix."""

from __future__ import annotations

import re
from pathlib import Path

from seekrl.config import ALGOS, LOSS_AGGS, Config, ConfigError, ModelConfig, _did_you_mean

__all__ = ["validate", "server_kind"]


def _choice(key: str, value: str, options) -> None:
    if value not in options:
        # the options are listed already: only a close match adds something
        raise ConfigError(f"{key}: '{value}' is not one of {', '.join(options)}{_did_you_mean(value, options, list_known=False)}")


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _check_model_path(m: ModelConfig) -> None:
    """model.path must name something loadable: checked here, before any weights are read."""
    if m.path in ("tiny", "smollm2"):
        return
    p = Path(m.path)
    if m.gguf_file is not None:
        if not (p / m.gguf_file).is_file():
            raise ConfigError(f"model.gguf_file: '{p / m.gguf_file}' does not exist")
    elif m.path.endswith(".gguf"):
        if not p.is_file():
            raise ConfigError(f"model.path: GGUF file '{m.path}' does not exist")
    elif p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"model.path: folder '{m.path}' has no config.json; point it at a model folder (e.g. a checkpoint's model/)")
    elif not HUB_ID.match(m.path) or m.path.startswith((".", "/")):
        raise ConfigError(
            f"model.path: '{m.path}' is not a model folder, a .gguf file, 'tiny', 'smollm2' or a hub id (org/name)"
        )


def _check_tools(cfg: Config) -> None:
    tl, r, m = cfg.tools, cfg.rollout, cfg.model
    if tl.format is None:
        return
    _choice("tools.format", tl.format, ("search_r1", "dr_tulu", "hermes"))
    if not tl.retriever and not tl.mcp:
        raise ConfigError("tools.retriever and tools.mcp are both empty; give an index folder or server URL, or MCP servers")
    if tl.retriever and not tl.retriever.startswith(("http://", "https://")) and not (Path(tl.retriever) / "meta.json").is_file():
        raise ConfigError(f"tools.retriever: '{tl.retriever}' is not an index folder (no meta.json); build one with seekrl index build")
    if tl.topk < 1 or r.max_turns < 0 or r.max_obs_tokens < 1:
        raise ConfigError("tools.topk and rollout.max_obs_tokens must be at least 1, rollout.max_turns at least 0")
    if r.max_prompt_tokens + r.max_total_tokens > m.max_context:
        raise ConfigError(
            f"rollout.max_prompt_tokens + rollout.max_total_tokens = {r.max_prompt_tokens + r.max_total_tokens} "
            f"exceeds model.max_context ({m.max_context}); lower one or raise model.max_context"
        )


def _check_engine(cfg: Config) -> None:
    """engine.*: urls or servers imply remote; remote needs one of them; nccl needs CUDA and SGLang / vLLM."""
    e, r = cfg.engine, cfg.rollout
    _choice("engine.kind", e.kind, ("local", "remote"))
    _choice("engine.api", e.api, ("sglang", "vllm"))
    _choice("engine.server_kind", e.server_kind, ("auto", "seekrl", "sglang", "vllm"))
    _choice("engine.weight_sync", e.weight_sync, ("disk", "nccl"))
    if e.servers < 0 or e.gpus_per_server < 0:
        raise ConfigError(f"engine.servers and engine.gpus_per_server must be >= 0, got {e.servers} and {e.gpus_per_server}")
    if e.urls and e.servers:
        raise ConfigError("engine.urls and engine.servers are both set; give servers that run (urls) or a number to start (servers)")
    bad = [u for u in e.urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ConfigError(f"engine.urls: '{bad[0]}' is not an http(s) URL (e.g. http://127.0.0.1:30000)")
    if e.urls or e.servers:
        e.kind = "remote"
    if e.kind == "remote" and not (e.urls or e.servers):
        raise ConfigError("engine.kind=remote needs engine.urls (servers that run) or engine.servers=N (servers to start)")
    if e.timeout_s <= 0 or e.startup_timeout_s <= 0 or e.max_concurrent < 1 or e.keep_weights < 1:
        raise ConfigError("engine.timeout_s and engine.startup_timeout_s must be > 0, engine.max_concurrent and engine.keep_weights >= 1")
    kind = server_kind(cfg)
    if e.api == "vllm" and kind in ("seekrl", "sglang") or e.api == "sglang" and kind == "vllm":
        raise ConfigError(f"engine.server_kind={kind} does not speak engine.api={e.api}; use api "
                          f"{'vllm' if kind == 'vllm' else 'sglang'} or server_kind auto")
    if e.weight_sync == "nccl":
        raise ConfigError("engine.weight_sync=nccl is not available yet (the SGLang / vLLM request builders exist, the trainer-side "
                          "broadcast does not); use engine.weight_sync=disk")
    if e.kind == "remote" and e.api == "vllm" and (r.top_p < 1 or r.top_k > 0):
        raise ConfigError("engine.api=vllm returns log-probs after top-p / top-k filtering, which the trainer cannot "
                          "reproduce; set rollout.top_p=1 and rollout.top_k=0 (or use engine.api=sglang)")
    if e.server_python and not Path(e.server_python).is_file():
        raise ConfigError(f"engine.server_python: '{e.server_python}' is not a file; give the python of the servers' environment")
    if e.token and e.token_env:
        raise ConfigError("engine.token and engine.token_env are both set; keep one (token_env keeps the secret out of the saved config)")


def server_kind(cfg: Config) -> str:
    """What `engine.servers` starts: engine.server_kind, with auto resolved from engine.api."""
    e = cfg.engine
    if e.server_kind != "auto":
        return e.server_kind
    return "vllm" if e.api == "vllm" else "seekrl"


def validate(cfg: Config) -> None:
    """Cross-field checks that must fail before any model loads."""
    m, r, a, t = cfg.model, cfg.rollout, cfg.algo, cfg.train
    _choice("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    _choice("model.device", m.device, ("auto", "cpu", "cuda"))
    _choice("algo.name", a.name, ALGOS)
    _choice("algo.loss_agg", a.loss_agg, LOSS_AGGS)
    _choice("algo.kl_estimator", a.kl_estimator, ("k1", "k2", "k3"))
    _choice("algo.kl_in", a.kl_in, ("loss", "reward"))
    _choice("train.schedule", t.schedule, ("constant", "cosine"))
    _choice("train.recompute_logprobs", t.recompute_logprobs, ("auto", "always", "never"))
    from seekrl.data.synthetic import STYLES

    _choice("demo.world_style", cfg.demo.world_style, STYLES)
    positive = {
        "rollout.group_size": r.group_size, "rollout.batch_size": r.batch_size,
        "rollout.max_new_tokens": r.max_new_tokens, "rollout.max_prompt_tokens": r.max_prompt_tokens,
        "rollout.engine_batch_size": r.engine_batch_size, "train.ppo_epochs": t.ppo_epochs,
        "train.minibatches": t.minibatches, "train.micro_batch_tokens": t.micro_batch_tokens,
        "model.max_context": m.max_context, "eval.n": cfg.eval.n,
    }
    for key, v in positive.items():
        if v < 1:
            raise ConfigError(f"{key}: must be at least 1, got {v}")
    if t.steps < 0:
        raise ConfigError(f"train.steps: must be >= 0, got {t.steps}")
    if r.batch_size % r.group_size:
        raise ConfigError(
            f"rollout.batch_size ({r.batch_size}) must be a multiple of rollout.group_size ({r.group_size}); "
            f"try rollout.batch_size={max(1, r.batch_size // r.group_size) * r.group_size}"
        )
    if r.group_size < 2 and a.name in ("grpo", "dr_grpo", "rloo"):
        raise ConfigError(f"rollout.group_size: {a.name} needs at least 2 samples per task for its group baseline")
    if (r.batch_size) % t.minibatches:
        raise ConfigError(f"train.minibatches ({t.minibatches}) must divide rollout.batch_size ({r.batch_size})")
    if r.max_prompt_tokens + r.max_new_tokens > m.max_context:
        raise ConfigError(
            f"rollout.max_prompt_tokens + rollout.max_new_tokens = {r.max_prompt_tokens + r.max_new_tokens} "
            f"exceeds model.max_context ({m.max_context}); lower one or raise model.max_context"
        )
    if not 0 <= a.clip_low < 1:
        raise ConfigError(f"algo.clip_low: must be in [0, 1), got {a.clip_low}")
    if a.clip_high < 0:
        raise ConfigError(f"algo.clip_high: must be >= 0, got {a.clip_high}")
    if a.dual_clip is not None and a.dual_clip <= 1:
        raise ConfigError(f"algo.dual_clip: must be > 1 (3.0 is usual), got {a.dual_clip}")
    if a.kl_coef < 0:
        raise ConfigError(f"algo.kl_coef: must be >= 0, got {a.kl_coef}")
    if not (0 <= a.gamma <= 1 and 0 <= a.lam <= 1):
        raise ConfigError("algo.gamma and algo.lam must be in [0, 1]")
    if r.temperature < 0:
        raise ConfigError(f"rollout.temperature: must be >= 0, got {r.temperature}")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p: must be in (0, 1], got {r.top_p}")
    _check_tools(cfg)
    _check_engine(cfg)
    g = cfg.generate
    if g.n < 1 or g.concurrency < 1 or g.retries < 0:
        raise ConfigError("generate.n and generate.concurrency must be at least 1, generate.retries at least 0")
    for key in ("teacher_skip_search", "teacher_stop_early", "teacher_weak_query", "teacher_give_up"):
        if not 0.0 <= getattr(g, key) <= 1.0:
            raise ConfigError(f"generate.{key}: must be a probability in [0, 1], got {getattr(g, key)}")
    if g.endpoint != "teacher" and not g.endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"generate.endpoint: '{g.endpoint}' is neither 'teacher' nor an http(s) base URL (http://127.0.0.1:8002/v1)")
    w = cfg.reward.weights
    if w is not None and len(w) != len(cfg.reward.functions):
        raise ConfigError(
            f"reward.weights has {len(w)} values for {len(cfg.reward.functions)} reward.functions; give one weight per function"
        )
    if not cfg.reward.functions:
        raise ConfigError("reward.functions is empty; name at least one (e.g. reward.functions=[math])")
    if t.keep_last < 1:
        raise ConfigError(f"train.keep_last: must be at least 1, got {t.keep_last}")
    _check_model_path(m)
    if m.lora_r < 0:
        raise ConfigError(f"model.lora_r: must be >= 0, got {m.lora_r}")
    if m.tiny_heads < 1 or m.tiny_hidden % m.tiny_heads:
        raise ConfigError(f"model.tiny_heads: must divide model.tiny_hidden ({m.tiny_hidden}), got {m.tiny_heads}")
    if m.tiny_intermediate < 0:
        raise ConfigError(f"model.tiny_intermediate: must be >= 0 (0 = 4 x tiny_hidden), got {m.tiny_intermediate}")
