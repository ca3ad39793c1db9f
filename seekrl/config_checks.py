"""Cross-field checks of a loaded `Config` (`validate`, run last by `config.load_config`): every
one fails before any model loads, with a one-line `ConfigError` that names the key and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

from seekrl.config import ALGOS, LOSS_AGGS, Config, ConfigError, ModelConfig, _did_you_mean

__all__ = ["validate", "server_kind", "check_model_folder"]


def _choice(key: str, value: str, options) -> None:
    if value not in options:
        # the options are listed already: only a close match adds something
        raise ConfigError(f"{key}: '{value}' is not one of {', '.join(options)}{_did_you_mean(value, options, list_known=False)}")


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DATA_SLICE = re.compile(r"^(?P<spec>.+)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")  # as train/setup.py's _SLICE
TINY_ROWS = 512  # rows of a sliced tiny:<kind> source (train/setup.py load_split)


def _check_data_specs(cfg: Config) -> None:
    """data.train / data.eval: every comma-separated source's trailing [start:stop] holds integers and
    can select rows (an empty slice is refused here when it is empty whatever the source holds, else
    when the data loads); tiny:<kind> names a kind that exists."""
    from seekrl.data.tiny import KINDS

    if not cfg.data.train.strip():
        raise ConfigError("data.train is empty; name a data set (e.g. data.train=gsm8k or data.train=tiny:copy)")
    for key, spec in (("data.train", cfg.data.train), ("data.eval", cfg.data.eval or "")):
        for part in (x.strip() for x in spec.split(",")):
            try:
                if not part or Path(part).exists():
                    continue
            except OSError as e:  # a name too long for the file system
                raise ConfigError(f"{key}: '{part[:80]}...' is not a usable file name ({e.strerror})") from None
            source = part
            if part.endswith("]") and "[" in part:
                m = DATA_SLICE.match(part)
                source = part[: part.rindex("[")]
                if m is None:
                    raise ConfigError(f"{key}: '{part}' ends in a slice that is not [start:stop] with integers "
                                      f"(e.g. {source}[0:200] or {source}[200:])")
                start, stop = (int(m[k]) if m[k] else None for k in ("start", "stop"))
                lo = start or 0
                tiny = source.startswith("tiny:")
                empty = (not range(TINY_ROWS)[start:stop]) if tiny else (
                    stop is not None and (lo >= 0) == (stop >= 0) and stop <= lo)
                if empty:
                    has = f"{source} has {TINY_ROWS} rows" if tiny else "empty whatever the source holds"
                    hint = f"{source}[{stop}:{start}]" if start is not None and stop is not None and start > stop else f"{source}[0:200]"
                    raise ConfigError(f"{key}: '{part}' selects no rows ({has}); rows start..stop-1 are taken, e.g. {hint}")
            if source.startswith("tiny:") and source[5:].partition(":")[0] not in KINDS:
                kind = source[5:].partition(":")[0]
                raise ConfigError(f"{key}: unknown tiny task '{kind}' in '{part}'; choose one of "
                                  f"{', '.join('tiny:' + k for k in KINDS)}{_did_you_mean(kind, KINDS, 'tiny:', list_known=False)}")


def _safetensors_problem(f: Path) -> str | None:
    """What is wrong with a .safetensors file, read from its header only (None: it is whole).

    The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor to
    its `data_offsets` [begin, end) in the data that follows; the file ends where the last tensor does."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"is {size} bytes, too short for a safetensors file (it starts with an 8-byte header length)"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return f"is truncated or not a safetensors file: its header length says {n} bytes, the file has {size}"
        if n > 100_000_000:
            return f"has a header of {n} bytes, over safetensors' limit of 100 MB"
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "has a header that is not valid JSON"
    if not isinstance(header, dict):
        return "has a header that is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int and x >= 0 for x in offsets)):
            return f"has a malformed header entry for tensor '{name}'"
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        return f"is truncated: {size} bytes, its header needs {expected}"
    if size > expected:
        return f"has {size - expected} bytes past the end of its last tensor"
    return None


def check_model_folder(folder: str | Path, key: str = "model.path") -> None:
    """A model folder loads only if its config.json is a JSON object naming a `model_type`, the shards
    its model.safetensors.index.json lists exist, and every *.safetensors file is whole (read from the
    headers, no weights loaded). Raises a one-line ConfigError naming the file and the fix."""
    p = Path(folder)
    config = p / "config.json"
    if not config.is_file():
        raise ConfigError(f"{key}: folder '{folder}' has no config.json; point it at a model folder (e.g. a checkpoint's model/)")
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}: {config} is not valid UTF-8 (byte {e.start}); restore it from the model's source") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: {config} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          "restore it from the model's source or save the model again") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise ConfigError(f"{key}: {config} has no \"model_type\" (e.g. \"llama\", \"qwen2\"), so transformers cannot "
                          "tell which model it describes; restore it from the model's source or save the model again")
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8")).get("weight_map")
        except (UnicodeDecodeError, ValueError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConfigError(f"{key}: {index} is not a JSON object with a \"weight_map\" of tensor -> file; restore it")
        missing = sorted(v for v in set(weight_map.values()) if not (p / v).is_file())
        if missing:
            raise ConfigError(f"{key}: {index} lists {len(missing)} shard(s) that are missing, first '{missing[0]}'; copy the whole folder")
    for f in sorted(p.glob("*.safetensors")):
        problem = _safetensors_problem(f)
        if problem:
            raise ConfigError(f"{key}: {f} {problem}; the file is damaged (an interrupted copy or save?): copy or save it again")


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
        check_model_folder(m.path)
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
    if tl.passage_words < 0:
        raise ConfigError(f"tools.passage_words must be 0 (whole passages) or a positive word count, got {tl.passage_words}")
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


def _check_floats(cfg: Config) -> None:
    """Every float key is a finite number (nan compares false with everything, so a range check
    alone lets it through, and inf passes `>= 0`), and the keys below are in their range. Keys
    whose range `validate` checks itself (algo.clip_low, algo.gamma, rollout.top_p, ...) only get
    the finiteness check here."""
    import math
    import typing

    from seekrl.config import SECTIONS

    a, t, g, d = cfg.algo, cfg.train, cfg.generate, cfg.demo
    lr = "a finite number >= 0 (e.g. 1e-6 for a real model, 1e-3 for the tiny one; 0 freezes it)"
    positive = "a finite number > 0 (seconds)"
    ranges = [  # (key, value, allowed, in range)
        ("train.lr", t.lr, lr, lambda v: v >= 0),
        ("train.critic_lr", t.critic_lr, lr, lambda v: v >= 0),
        ("demo.pretrain_lr", d.pretrain_lr, lr, lambda v: v >= 0),
        ("demo.sft_lr", d.sft_lr, lr, lambda v: v >= 0),
        ("train.weight_decay", t.weight_decay, "a finite number >= 0 (e.g. 0.0 or 0.01)", lambda v: v >= 0),
        ("train.min_lr_ratio", t.min_lr_ratio, "in [0, 1] (the cosine floor as a fraction of train.lr)", lambda v: 0 <= v <= 1),
        ("train.max_grad_norm", t.max_grad_norm, "a finite number > 0 (e.g. 1.0; 1e6 clips nothing)", lambda v: v > 0),
        ("model.lora_dropout", cfg.model.lora_dropout, "in [0, 1) (e.g. 0.05)", lambda v: 0 <= v < 1),
        ("algo.clip_high", a.clip_high, "a finite number >= 0 (0.2, or 0.28 for DAPO's clip-higher)", lambda v: v >= 0),
        ("algo.kl_coef", a.kl_coef, "a finite number >= 0 (0 disables the reference model)", lambda v: v >= 0),
        ("algo.kl_target", a.kl_target, "a finite number > 0 (e.g. 0.01) or null for a fixed algo.kl_coef", lambda v: v > 0),
        ("algo.value_clip", a.value_clip, "a finite number > 0 (e.g. 0.2) or null for no clipping", lambda v: v > 0),
        ("rollout.temperature", cfg.rollout.temperature, "a finite number >= 0 (0: greedy)", lambda v: v >= 0),
        ("eval.temperature", cfg.eval.temperature, "a finite number >= 0 (0: greedy)", lambda v: v >= 0),
        ("generate.temperature", g.temperature, "a finite number >= 0 (0: greedy)", lambda v: v >= 0),
        ("tools.timeout_s", cfg.tools.timeout_s, positive, lambda v: v > 0),
        ("engine.timeout_s", cfg.engine.timeout_s, positive, lambda v: v > 0),
        ("engine.startup_timeout_s", cfg.engine.startup_timeout_s, positive, lambda v: v > 0),
        ("generate.timeout_s", g.timeout_s, positive, lambda v: v > 0),
        ("reward.repetition_max_penalty", cfg.reward.repetition_max_penalty, "a finite number <= 0 (e.g. -1.0)", lambda v: v <= 0),
    ]
    for key, value, allowed, ok in ranges:
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ConfigError(f"{key}: must be {allowed}, got {value}")
    for section, cls in SECTIONS.items():  # the rest: any float anywhere, lists included
        for key, hint in typing.get_type_hints(cls).items():
            value = getattr(getattr(cfg, section), key)
            for i, v in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(v, float) and not math.isfinite(v):
                    where = f"{section}.{key}" + (f"[{i}]" if isinstance(value, list) else "")
                    nullable = " or null" if type(None) in typing.get_args(hint) and not isinstance(value, list) else ""
                    raise ConfigError(f"{where}: must be a finite number{nullable}, got {v}")
    if t.max_nonfinite < 0:
        raise ConfigError(f"train.max_nonfinite: must be >= 0 (0: never stop on nan/inf updates), got {t.max_nonfinite}")


def _check_async(cfg: Config) -> None:
    """rollout.mode / max_staleness / max_concurrent and decoupled PPO (algo.decoupled, prox_logp,
    behav_imp_cap); resolves algo.decoupled (none: true in async mode) so the saved config says it."""
    r, a = cfg.rollout, cfg.algo
    _choice("rollout.mode", r.mode, ("sync", "async"))
    _choice("algo.prox_logp", a.prox_logp, ("recompute", "loglinear"))
    if r.max_staleness < 0:
        raise ConfigError(f"rollout.max_staleness: must be >= 0 (0 trains only on tokens of the current policy), got {r.max_staleness}")
    if r.max_concurrent is not None and r.max_concurrent < r.group_size:
        raise ConfigError(f"rollout.max_concurrent ({r.max_concurrent}) must be at least rollout.group_size ({r.group_size}): "
                          "a task's G episodes start together; raise it or leave it unset (= rollout.batch_size)")
    if a.decoupled is None:
        a.decoupled = r.mode == "async"
    if a.behav_imp_cap is not None and a.behav_imp_cap <= 0:
        raise ConfigError(f"algo.behav_imp_cap: must be > 0 (e.g. 5.0), got {a.behav_imp_cap}")
    if a.behav_imp_cap is not None and not a.decoupled:
        raise ConfigError("algo.behav_imp_cap caps decoupled PPO's behaviour weight; set algo.decoupled=true or drop the cap")
    if a.decoupled and cfg.tools.format is not None and not r.mask_observations:
        raise ConfigError("algo.decoupled=true needs rollout.mask_observations=true: inserted tool tokens have no behaviour "
                          "log-probs to weight by; set algo.decoupled=false for the unmasked ablation")


def _check_dist(cfg: Config) -> None:
    """train.dist_backend / fsdp / dist_timeout_s / mixed_precision and the cluster section."""
    t, c = cfg.train, cfg.cluster
    _choice("train.dist_backend", t.dist_backend, ("auto", "gloo", "nccl"))
    _choice("train.fsdp", t.fsdp, ("full", "hybrid", "none"))
    _choice("train.mixed_precision", t.mixed_precision, ("auto", "bf16", "fp32"))
    if t.dist_timeout_s <= 0:
        raise ConfigError(f"train.dist_timeout_s: must be > 0 seconds, got {t.dist_timeout_s}")
    if not (c.address in ("local", "auto") or c.address.startswith("ray://")):
        raise ConfigError(f"cluster.address: '{c.address}' is not local, auto or ray://host:port")
    for key in ("trainer_ranks", "num_nodes"):
        if getattr(c, key) < 1:
            raise ConfigError(f"cluster.{key}: must be at least 1, got {getattr(c, key)}")
    if c.trainer_ranks % c.num_nodes:
        raise ConfigError(f"cluster.trainer_ranks ({c.trainer_ranks}) must be a multiple of cluster.num_nodes ({c.num_nodes})")
    for key in ("engine_servers", "gpus_per_trainer", "gpus_per_engine", "cpus_per_trainer", "cpus_per_engine"):
        if getattr(c, key) < 0:
            raise ConfigError(f"cluster.{key}: must be >= 0, got {getattr(c, key)}")
    if c.num_cpus is not None and c.num_cpus < 1:
        raise ConfigError(f"cluster.num_cpus: must be at least 1 or null (all CPUs), got {c.num_cpus}")
    if not isinstance(c.runtime_env, dict):
        raise ConfigError(f"cluster.runtime_env: must be a mapping (e.g. {{pip: [seekrl]}}), got {c.runtime_env!r}")
    if c.timeout_s <= 0:
        raise ConfigError(f"cluster.timeout_s: must be > 0 seconds, got {c.timeout_s}")
    if c.address == "local" and c.num_nodes > 1:
        raise ConfigError(f"cluster.num_nodes={c.num_nodes} needs a cluster: a local Ray (cluster.address=local) is one node; "
                          "use cluster.address=auto (a running cluster) or ray://host:port")
    for what, cpus, gpus, n in (("trainer", c.cpus_per_trainer, c.gpus_per_trainer, c.trainer_ranks),
                                ("engine", c.cpus_per_engine, c.gpus_per_engine, c.engine_servers)):
        if n and cpus == 0 and gpus == 0:  # a placement group bundle cannot be empty
            raise ConfigError(f"cluster.cpus_per_{what} and cluster.gpus_per_{what} are both 0; Ray places only what reserves "
                              f"something: give it CPUs (e.g. cluster.cpus_per_{what}=0.5) or GPUs")
    if c.engine_servers and cfg.engine.servers:  # (engine.urls may be set: a launched run's saved config has them; launch replaces them)
        raise ConfigError(f"cluster.engine_servers={c.engine_servers} and engine.servers={cfg.engine.servers} are both set; "
                          "seekrl launch places cluster.engine_servers servers itself: set engine.servers=0")


def validate(cfg: Config) -> None:
    """Cross-field checks that must fail before any model loads."""
    _check_floats(cfg)
    m, r, a, t = cfg.model, cfg.rollout, cfg.algo, cfg.train
    _choice("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    _choice("model.device", m.device, ("auto", "cpu", "cuda"))
    _choice("algo.name", a.name, ALGOS)
    _choice("algo.loss_agg", a.loss_agg, LOSS_AGGS)
    _choice("algo.kl_estimator", a.kl_estimator, ("k1", "k2", "k3"))
    _choice("algo.kl_in", a.kl_in, ("loss", "reward"))
    _choice("train.schedule", t.schedule, ("constant", "cosine"))
    _choice("train.recompute_logprobs", t.recompute_logprobs, ("auto", "always", "never"))
    if isinstance(r.compile, bool):  # YAML reads true / false as booleans
        r.compile = "true" if r.compile else "false"
    _choice("rollout.compile", r.compile, ("auto", "true", "false"))
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
    _check_data_specs(cfg)
    _check_engine(cfg)
    _check_async(cfg)
    _check_dist(cfg)
    g = cfg.generate
    if g.n < 1 or g.concurrency < 1 or g.retries < 0:
        raise ConfigError("generate.n and generate.concurrency must be at least 1, generate.retries at least 0")
    for key in ("teacher_skip_search", "teacher_stop_early", "teacher_weak_query", "teacher_give_up"):
        if not 0.0 <= getattr(g, key) <= 1.0:
            raise ConfigError(f"generate.{key}: must be a probability in [0, 1], got {getattr(g, key)}")
    _choice("generate.teacher_first_query", g.teacher_first_query, ("title", "question"))
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
    from seekrl.types import MIN_TEMPERATURE

    for key, temp in (("rollout.temperature", r.temperature), ("eval.temperature", cfg.eval.temperature),
                      ("generate.temperature", cfg.generate.temperature)):
        if 0 < temp < MIN_TEMPERATURE:  # float32 cannot sample there: NaN log-probs
            raise ConfigError(f"{key}: {temp} is too small to sample with; use 0 (greedy) or at least {MIN_TEMPERATURE}")
    if t.save_every < 0:
        raise ConfigError(f"train.save_every: must be >= 0 (0: a checkpoint only at the end), got {t.save_every}")
    if not 0 <= t.seed < 2**32:  # numpy's np.random.seed range (torch's is wider)
        raise ConfigError(f"train.seed: must be in 0..{2**32 - 1} (what numpy and torch both accept), got {t.seed}")
    name = cfg.log.name
    if name and (Path(name).is_absolute() or ".." in Path(name).parts or not Path(name).parts):
        raise ConfigError(f"log.name: '{name}' would put the run folder outside log.dir ('{cfg.log.dir}') or on it; "
                          "give a name inside it, without '..' or a leading '/' (e.g. my_run or sweeps/lr_1e-3); move runs with log.dir")
    if m.tiny_intermediate < 0:
        raise ConfigError(f"model.tiny_intermediate: must be >= 0 (0 = 4 x tiny_hidden), got {m.tiny_intermediate}")
