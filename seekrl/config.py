"""The whole config of a run: every section, read from YAML of two levels and `section.key=value`
overrides, resolved, then checked once before any model loads.

    seekrl train examples/tiny_grpo.yaml algo.name=ppo train.steps=50
    cfg = load_config("examples/tiny_grpo.yaml", ["train.steps=50"])

Each section is a dataclass next to the module that reads it (models.py `ModelConfig`,
data/config.py, rollout/config.py, engines/config.py, tools/config.py, rewards/config.py,
algo/config.py, train/config.py, evaluate.py `EvalConfig`, generate.py `GenerateConfig`,
observe/config.py `LogConfig`); seekrl/schema.py says how a section declares its values. The
`demo` and `cluster` sections are declared here: the jobs that read them (`seekrl demo`, `seekrl
launch`) run other jobs and so sit above this module. Only the composition root
(seekrl/build.py) and the jobs above it see the whole `Config`; every other module gets the
sections it reads.

`load_config` reads (unknown keys and wrong types fail here, each naming its file line or key),
then `resolve` fills the values that derive from others (log.name from the file, engine.kind
from engine.urls / engine.servers, algo.decoupled from rollout.mode; a new Config, shown in the
saved config.yaml), then `Config.check` runs each section's own checks and the rules between
sections. A problem is a one-line ConfigError, which the CLI prints and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from seekrl.algo.config import GROUP_ALGOS, AlgoConfig
from seekrl.data.config import DataConfig
from seekrl.data.synthetic import WorldStyle
from seekrl.engines.config import EngineConfig, EngineDtype
from seekrl.errors import ConfigError
from seekrl.evaluate import EvalConfig
from seekrl.generate import GenerateConfig
from seekrl.models import ModelConfig
from seekrl.observe.config import LogConfig
from seekrl.rewards.config import RewardConfig
from seekrl.rollout.config import RolloutConfig
from seekrl.schema import Range, apply_fields, check_fields, coerce, did_you_mean, field_docs, is_subsection, section_hints
from seekrl.tools.config import ToolsConfig
from seekrl.tools.parsers import FORMATS
from seekrl.train.config import TrainConfig
from seekrl.yaml_keys import DuplicateKeyError, UniqueKeyLoader

__all__ = ["Config", "ConfigError", "SECTIONS", "DemoConfig", "ClusterConfig", "load_config", "parse_override", "resolve",
           "field_docs", "reference_markdown"]

_LR = "a finite number >= 0 (e.g. 1e-6 for a real model, 1e-3 for the tiny one; 0 freezes it)"


QuestionKind = Literal["yes/no", "either-or", "open"]  # a HotpotQA question's answer form (recipes/hotpotqa_scores.py answer_options)


@dataclass
class DemoConfig:
    world_seed: int = 0
    """`seekrl demo`: seed of the synthetic world."""
    world_entities: int = 300
    """`seekrl demo`: entities in the world (one corpus paragraph each)."""
    world_questions: int = 2400
    """`seekrl demo`: questions (1-hop, 2-hop, comparison), 20% of them the test split."""
    world_style: WorldStyle = "varied"
    """`seekrl demo`: how the world's paragraphs are phrased: varied (several templates per fact, shuffled) or plain (one fixed sentence per fact)."""
    teacher_n: int = 1
    """`seekrl demo`: scripted-teacher episodes per train question (the SFT data)."""
    pretrain_entities: int = 4000
    """`seekrl demo`: entities of the background world (another seed) whose corpus the tiny model reads before SFT."""
    pretrain_episodes: int = 0
    """`seekrl demo`: questions of the background world that the flawless scripted teacher plays (with its own index) for the pretraining rows, every token trained (0: paragraphs only)."""
    pretrain_steps: int = 400
    """`seekrl demo`: language-modeling steps of the tiny model on the background corpus before SFT (0: none)."""
    pretrain_lr: Annotated[float, Range(ge=0, text=_LR)] = 2.0e-3
    """`seekrl demo`: learning rate of the background-corpus pretraining."""
    sft_steps: int = 600
    """`seekrl demo`: SFT optimizer steps."""
    sft_lr: Annotated[float, Range(ge=0, text=_LR)] = 2.0e-3
    """`seekrl demo`: SFT learning rate."""
    sft_batch_size: int = 16
    """`seekrl demo`: SFT episodes per step."""
    sft_precision: Literal["fp32", "bf16", "bf16_if_native"] = "fp32"
    """`seekrl demo --recipe hotpotqa_smollm2`: the SFT stage's train.mixed_precision: fp32, bf16 (the decoder under bf16 autocast, fp32 weights and AdamW; about 1.7x faster a step on a CPU with avx512_bf16, and up to 46x slower on an AVX2-only CPU, which emulates bf16; BENCHMARKS.md), or bf16_if_native (bf16 where the device computes it natively, fp32 elsewhere)."""
    eval_questions: int = 300
    """`seekrl demo --recipe hotpotqa_smollm2`: held-out questions of dev_distractor.jsonl (never trained on) for the before/after evals."""
    base_questions: int = 100
    """`seekrl demo --recipe hotpotqa_smollm2`: the first N held-out questions the untrained model is evaluated on (its long, malformed episodes are slow to sample)."""
    check_questions: int = 200
    """`seekrl demo --recipe hotpotqa_smollm2`: further unseen questions for the independent check of the final policy."""
    grpo_seeds: list[int] = field(default_factory=lambda: [0])
    """`seekrl demo --recipe hotpotqa_smollm2`: one GRPO run per train.seed from the same SFT checkpoint (DIR/grpo for the first, DIR/grpo_s<seed> for the others), each evaluated on the held-out questions; results.md gives every seed's gain and their mean."""
    grpo_parallel: Annotated[int, Range(ge=1, text=">= 1 (1: one seed after the other, in the recipe's process)")] = 1
    """`seekrl demo --recipe hotpotqa_smollm2`: GRPO seeds trained at the same time, each a child `seekrl train` process with an even share of the cores as torch threads, pinned to those cores (a vLLM server it starts binds to them too; with more seeds than cores each may use every core and its server's one thread is unbound), which then runs that seed's held-out eval (`seekrl eval`) on the same cores while the others may still train (its output in DIR/<run>.log; the eval of a seed trained before, in DIR/<run>.eval.log; recipes/children.py); the seeds go in groups of N in demo.grpo_seeds order. On the 2-core CPU two seeds at one thread each took 0.71 of the time of the two one after the other at two threads in-process, and 0.52 on vLLM servers with their start (BENCHMARKS.md, "Several runs on one CPU"). Memory: with two vLLM seeds of the recipe at once the free memory of a 24 GiB machine fell to 0.7 GiB once (each trainer up to 7.3 GiB in its update, each vLLM worker up to 3.9 GiB with its 1 GiB KV cache); with the 2 GiB KV cache vLLM servers had before, the kernel killed a trainer at step 24; with the update's lengths rounded (train.length_buckets) its least was 2.4 and 1.65 GiB in two runs of the pair, and demo.seed_memory_gib checks the memory before the seeds start. 1: each seed in this process with every core, evaluated before the next starts."""
    seed_memory_gib: Annotated[float, Range(ge=0, text="a number of GiB >= 0 (0: no check)")] = 11.0
    """`seekrl demo --recipe hotpotqa_smollm2`: the memory one GRPO seed of demo.grpo_parallel takes at its peak, its trainer and the vLLM server it starts together: before anything runs, and again before each group of seeds starts, the recipe stops with an error when min(demo.grpo_parallel, seeds) x this is more than the machine's available memory (Linux MemAvailable), instead of the kernel killing a trainer mid-run. 11: with two seeds of the recipe at once the available memory of a 24 GiB machine fell by 20.7 and 21.4 GiB at their peak in two runs, the recipe's own process included (2026-12-07, RESULTS.md, "GRPO on all 725 training questions", "the recipe end to end with three seeds, two at once"). The HotpotQA recipe sets 7 for its three seeds at once (demo.grpo_parallel=3, demo.grpo_micro_batch_tokens=1024, 256 MiB vLLM KV caches): the least available memory was 3.67 GiB in a 48-step run, trainers up to 4.4 GiB and vLLM workers up to 1.75 GiB each (RESULTS.md, "three seeds at once"). 0: no check."""
    grpo_engine: Literal["local", "vllm"] = "local"
    """`seekrl demo --recipe hotpotqa_smollm2`: where the GRPO stages sample: local (in the trainer, as every other stage) | vllm (each GRPO run starts one vLLM server, engine.servers=1 engine.server_kind=vllm, with --max-model-len model.max_context; `make vllm` first). The evals stay in-process, so their figures compare with SFT's; demo.grpo_dtype sets the server's dtype (engine.dtype without it). On the 2-core CPU a GRPO step of the local-credit configuration took 0.76 of the in-process bf16 engine's time (BENCHMARKS.md, "Whole GRPO steps on vLLM")."""
    grpo_dtype: EngineDtype | None = None
    """`seekrl demo --recipe hotpotqa_smollm2`: the GRPO stages' engine.dtype, the weights their rollouts are sampled with (with demo.grpo_engine=vllm, the server's dtype), while every eval samples with engine.dtype; e.g. bf16_if_native: a vLLM server in bfloat16 where the CPU computes it natively, and the evals in fp32 as SFT's. null: engine.dtype for both."""
    grpo_micro_batch_tokens: Annotated[int, Range(ge=0, text=">= 0 (0: train.micro_batch_tokens)")] = 0
    """`seekrl demo --recipe hotpotqa_smollm2`: the GRPO stages' train.micro_batch_tokens (over train.micro_batch_tokens, one given on the command line included), while SFT keeps train.micro_batch_tokens; e.g. 1024 with three seeds at once (demo.grpo_parallel=3), whose updates then fit beside each other in 24 GiB, while SFT's 2048-token micro-batches stay fast. 0: train.micro_batch_tokens for both."""
    check_every: Annotated[int, Range(ge=0, text=">= 0 (0: the check questions only after GRPO)")] = 0
    """`seekrl demo --recipe hotpotqa_smollm2`: the first GRPO seed evaluates the first `curve_questions` check questions at step 0, every N steps and at its last step (the learning curve against steps and minutes); 0: no curve."""
    curve_questions: Annotated[int, Range(ge=1)] = 100
    """`seekrl demo --recipe hotpotqa_smollm2`: check questions of the learning curve (the first N of the check split)."""
    curriculum_questions: Annotated[int, Range(ge=0, text=">= 0 (0: GRPO on every training question)")] = 0
    """`seekrl demo --recipe hotpotqa_smollm2`: before GRPO, the SFT model's pass rate on the first N training questions (data.curriculum_k samples each, seed 0, cached in DIR/curriculum.json); every GRPO seed trains only on those it solves sometimes but not always. 0: no curriculum."""
    sft_share: Annotated[float, Range(gt=0, le=1, text="in (0, 1] (1: the teacher and SFT on every training question)")] = 1.0
    """`seekrl demo --recipe hotpotqa_smollm2`: the share of the training questions the teacher plays and SFT trains on: the first of DIR/data/train.jsonl (in the split's fixed hash order), written to DIR/data/train_sft.jsonl; GRPO (and the curriculum) draws only from the rest, DIR/data/train_rl.jsonl, questions whose answers SFT never saw, so a GRPO group rewards finding an answer, not recalling one. 1: teacher, SFT and GRPO on every training question."""
    grpo_share: Literal["rest", "all"] = "rest"
    """`seekrl demo --recipe hotpotqa_smollm2`: with demo.sft_share < 1, the training questions GRPO (and the curriculum) draws from: rest, only DIR/data/train_rl.jsonl, the questions outside SFT's share, whose answers SFT never saw; or all, every training question, SFT's share too (DIR/data/train.jsonl): twice the questions, so that an epoch of 48 steps does not run dry (with rest, HotpotQA's 363 questions are drawn again from step 28 on), at the cost of groups on questions whose answers SFT was taught. With demo.sft_share=1 GRPO draws from every question either way."""
    grpo_questions: Literal["all", "open", "retrievable"] = "all"
    """`seekrl demo --recipe hotpotqa_smollm2`: the training questions GRPO (and the curriculum) draws from: all, or open: only those whose answer has to be read from a passage (not yes/no, not "X or Y?"; `answer_options`), written to DIR/data/train_open.jsonl. A policy that cannot read answers the two-answer questions by chance, and their groups' reward spread only moves its guessing (RESULTS.md). retrievable: only the open ones whose question, searched as it is, brings back every needed paragraph in the top tools.topk results (DIR/data/train_retrievable.jsonl): a group's episodes then read the same paragraphs, and their rewards differ by how they read them. It filters the questions GRPO may draw (with demo.sft_share < 1: those outside SFT's share); the teacher and SFT stages are not filtered by it."""
    ptx_coef: Annotated[float, Range(ge=0, text="a finite number >= 0 (0: no PPO-ptx)")] = 0.0
    """`seekrl demo --recipe hotpotqa_smollm2`: the GRPO stages add PPO-ptx (algo.ptx_coef, train/ptx.py) on the teacher's kept episodes of the training questions GRPO does not draw (with demo.grpo_questions=open: the yes/no and "X or Y?" ones; with all: every kept episode), written to DIR/data/ptx.jsonl: SFT's behaviour held where GRPO does not train. 0: off."""
    ptx_kinds: list[QuestionKind] = field(default_factory=lambda: ["yes/no", "either-or", "open"])
    """`seekrl demo --recipe hotpotqa_smollm2`: with demo.ptx_coef > 0, the question kinds (`answer_options`: yes/no, either-or, open) whose teacher episodes PPO-ptx holds; e.g. [yes/no]: only the yes/no format, which GRPO under an EM reward can lose and not win back (RESULTS.md, "PPO-ptx on the teacher's yes/no episodes")."""

    def check(self) -> None:
        if not self.ptx_kinds:
            raise ConfigError("demo.ptx_kinds is empty; name one or more question kinds of yes/no, either-or, open "
                              "(e.g. demo.ptx_kinds=[yes/no])")


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
    timeout_s: Annotated[float, Range(gt=0, text="> 0 seconds")] = 600.0
    """Longest wait for the cluster's resources and for each server to come up."""

    def check(self) -> None:
        if not (self.address in ("local", "auto") or self.address.startswith("ray://")):
            raise ConfigError(f"cluster.address: '{self.address}' is not local, auto or ray://host:port")
        for key in ("trainer_ranks", "num_nodes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"cluster.{key}: must be at least 1, got {getattr(self, key)}")
        if self.trainer_ranks % self.num_nodes:
            raise ConfigError(f"cluster.trainer_ranks ({self.trainer_ranks}) must be a multiple of cluster.num_nodes ({self.num_nodes})")
        for key in ("engine_servers", "gpus_per_trainer", "gpus_per_engine", "cpus_per_trainer", "cpus_per_engine"):
            if getattr(self, key) < 0:
                raise ConfigError(f"cluster.{key}: must be >= 0, got {getattr(self, key)}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"cluster.num_cpus: must be at least 1 or null (all CPUs), got {self.num_cpus}")
        if not isinstance(self.runtime_env, dict):
            raise ConfigError(f"cluster.runtime_env: must be a mapping (e.g. {{pip: [seekrl]}}), got {self.runtime_env!r}")
        if self.address == "local" and self.num_nodes > 1:
            raise ConfigError(f"cluster.num_nodes={self.num_nodes} needs a cluster: a local Ray (cluster.address=local) is one node; "
                              "use cluster.address=auto (a running cluster) or ray://host:port")
        for what, cpus, gpus, n in (("trainer", self.cpus_per_trainer, self.gpus_per_trainer, self.trainer_ranks),
                                    ("engine", self.cpus_per_engine, self.gpus_per_engine, self.engine_servers)):
            if n and cpus == 0 and gpus == 0:  # a placement group bundle cannot be empty
                raise ConfigError(f"cluster.cpus_per_{what} and cluster.gpus_per_{what} are both 0; Ray places only what reserves "
                                  f"something: give it CPUs (e.g. cluster.cpus_per_{what}=0.5) or GPUs")


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

    def check(self) -> None:
        """Each section's values and own rules (schema.check_fields), then the rules between sections.
        Raises a one-line ConfigError; changes nothing."""
        for name in SECTIONS:
            check_fields(name, getattr(self, name))
        _check_between(self)


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}


VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses more


def _check_between(cfg: Config) -> None:
    """The rules that tie keys of two sections together."""
    m, r, a, t, e, tl = cfg.model, cfg.rollout, cfg.algo, cfg.train, cfg.engine, cfg.tools
    if r.agent is not None:
        if tl.format is not None:
            raise ConfigError(f"rollout.agent runs its own tools, so tools.format={tl.format} has no use; drop tools.format (or rollout.agent)")
        if a.name not in (*GROUP_ALGOS, "distill"):
            raise ConfigError(f"rollout.agent episodes whose calls do not extend each other train one sample per call, with their episode's "
                              f"advantage from a group baseline; algo.name={a.name} takes returns along one sequence: use grpo, dr_grpo, rloo or distill")
    if r.group_size * r.answer_branches < 2 and a.name in GROUP_ALGOS:  # one episode and its answer branches are a group too
        raise ConfigError(f"rollout.group_size: {a.name} needs at least 2 samples per task for its group baseline "
                          "(rollout.group_size >= 2, or one episode with rollout.answer_branches >= 2)")
    if r.refill and not a.filter_zero_std:
        raise ConfigError("rollout.refill=true replaces the groups algo.filter_zero_std drops; set algo.filter_zero_std=true "
                          "(or rollout.refill=false)")
    if cfg.data.skip_flat and r.mode != "sync":
        raise ConfigError("data.skip_flat works with rollout.mode=sync only (an async run draws tasks before the groups that "
                          "would leave them out are scored); set rollout.mode=sync or data.skip_flat=0")
    if r.batch_size % t.minibatches:
        raise ConfigError(f"train.minibatches ({t.minibatches}) must divide rollout.batch_size ({r.batch_size})")
    if t.minibatch_size:
        if t.minibatches != 1:
            raise ConfigError(f"train.minibatch_size={t.minibatch_size} and train.minibatches={t.minibatches} both split the batch; "
                              "keep one (train.minibatches=1 or train.minibatch_size=0)")
        tasks = r.batch_size // r.group_size
        if tasks % t.minibatch_size:
            raise ConfigError(f"train.minibatch_size ({t.minibatch_size}) must divide the batch's {tasks} tasks "
                              f"(rollout.batch_size / rollout.group_size), as verl's ppo_mini_batch_size divides its prompts")
    if r.max_prompt_tokens + r.max_new_tokens > m.max_context:
        raise ConfigError(f"rollout.max_prompt_tokens + rollout.max_new_tokens = {r.max_prompt_tokens + r.max_new_tokens} "
                          f"exceeds model.max_context ({m.max_context}); lower one or raise model.max_context")
    if tl.format is not None:
        if tl.topk < 1 or r.max_turns < 0 or r.max_obs_tokens < 1:
            raise ConfigError("tools.topk and rollout.max_obs_tokens must be at least 1, rollout.max_turns at least 0")
        if r.max_prompt_tokens + r.max_total_tokens > m.max_context:
            raise ConfigError(f"rollout.max_prompt_tokens + rollout.max_total_tokens = {r.max_prompt_tokens + r.max_total_tokens} "
                              f"exceeds model.max_context ({m.max_context}); lower one or raise model.max_context")
    if e.kind == "remote" and e.api == "vllm" and (r.top_p < 1 or r.top_k > 0):
        raise ConfigError("engine.api=vllm returns log-probs after top-p / top-k filtering, which the trainer cannot "
                          "reproduce; set rollout.top_p=1 and rollout.top_k=0 (or use engine.api=sglang)")
    if e.kind == "remote" and e.api == "vllm":
        for key, temperature in (("rollout.temperature", r.temperature), ("eval.temperature", cfg.eval.temperature),
                                 ("rollout.branch_temperature", r.branch_temperature or 0.0)):
            if temperature > VLLM_MAX_TEMPERATURE:
                raise ConfigError(f"{key}={temperature:g}: vLLM refuses temperatures above {VLLM_MAX_TEMPERATURE:g}; "
                                  f"lower it to at most {VLLM_MAX_TEMPERATURE:g} (or use engine.api=sglang)")
    if a.decoupled and tl.format is not None and not r.mask_observations:
        raise ConfigError("algo.decoupled=true needs rollout.mask_observations=true: inserted tool tokens have no behaviour "
                          "log-probs to weight by; set algo.decoupled=false for the unmasked ablation")
    if r.trajectory == "stepwise" and a.name not in (*GROUP_ALGOS, "distill"):
        raise ConfigError(f"rollout.trajectory=stepwise gives each turn its episode's advantage from a group baseline over episodes; "
                          f"algo.name={a.name} takes returns along one sequence: use grpo, dr_grpo, rloo or distill, or rollout.trajectory=prefix")
    if r.answer_branches > 1 and (tl.format is None or r.trajectory != "prefix"):
        raise ConfigError(f"rollout.answer_branches={r.answer_branches} samples the last turn of a tool episode again from its history: "
                          "it needs tools.format set and rollout.trajectory=prefix; set rollout.answer_branches=1")
    tagged = [name for name, f in FORMATS.items() if getattr(f, "answer_open", None)]  # formats whose answer opens with a tag
    if r.branch_from != "turn" and (r.answer_branches < 2 or tl.format not in tagged):
        raise ConfigError(f"rollout.branch_from={r.branch_from} starts answer branches after the answer's opening tag: it needs "
                          f"rollout.answer_branches > 1 and tools.format {' or '.join(tagged)}; set those, or rollout.branch_from=turn")
    if r.branch_temperature is not None and (r.answer_branches < 2 or not r.branch_temperature > 0):
        raise ConfigError(f"rollout.branch_temperature={r.branch_temperature:g} is the temperature of answer branches: it needs "
                          "rollout.answer_branches > 1 and a value > 0; set both, or rollout.branch_temperature=null")
    for key, on in (("algo.turn_advantage=true", a.turn_advantage), (f"algo.turn_gamma={a.turn_gamma:g}", a.turn_gamma != 1)):
        if on and a.name not in GROUP_ALGOS:
            raise ConfigError(f"{key} acts on a group baseline's advantage, which algo.name={a.name} has not; use grpo, dr_grpo or rloo, or drop it")
    if a.ptx_coef > 0 and not cfg.data.ptx:
        raise ConfigError(f"algo.ptx_coef={a.ptx_coef:g} weighs a supervised loss on data.ptx, which is not set; name a file of "
                          "conversations or episodes (data.ptx=episodes.jsonl) or set algo.ptx_coef=0")
    if cfg.data.ptx and a.ptx_coef == 0:
        raise ConfigError(f"data.ptx={cfg.data.ptx} is set but algo.ptx_coef=0 gives its loss no weight; set algo.ptx_coef "
                          "(e.g. 0.2) or drop data.ptx")
    c = cfg.cluster
    if c.engine_servers and e.servers:  # (engine.urls may be set: a launched run's saved config has them; launch replaces them)
        raise ConfigError(f"cluster.engine_servers={c.engine_servers} and engine.servers={e.servers} are both set; "
                          "seekrl launch places cluster.engine_servers servers itself: set engine.servers=0")


def resolve(cfg: Config, stem: str | None = None) -> Config:
    """The values that derive from others, as a new Config (module docstring): log.name (the config
    file's stem when unset), engine.kind (remote when engine.urls or engine.servers is set),
    engine.api (vllm when engine.server_kind=vllm: vLLM speaks nothing else), algo.decoupled
    (unset: true in async mode), and algo's objective defaults (AlgoConfig.resolved)."""
    log = cfg.log if cfg.log.name is not None or stem is None else dataclasses.replace(cfg.log, name=stem)
    engine = dataclasses.replace(cfg.engine, kind="remote") if cfg.engine.urls or cfg.engine.servers else cfg.engine
    if engine.server_kind == "vllm" and engine.api == "sglang":  # `engine.servers=1 engine.server_kind=vllm` alone
        engine = dataclasses.replace(engine, api="vllm")
    algo = cfg.algo if cfg.algo.decoupled is not None else dataclasses.replace(cfg.algo, decoupled=cfg.rollout.mode == "async")
    algo = algo.resolved()  # the objective's clip range and loss aggregation, distill_coef
    return dataclasses.replace(cfg, log=log, engine=engine, algo=algo)


def _apply(cfg: Config, section: str, key: str, value: Any) -> None:
    """Set `section.key` (or `section.sub.key` of a subsection such as algo.teacher) to `value`."""
    if section not in SECTIONS:
        raise ConfigError(f"unknown section '{section}'{did_you_mean(section, SECTIONS)}")
    hints = section_hints(SECTIONS[section])
    head, _, rest = key.partition(".")
    if head not in hints or (rest and not is_subsection(hints[head])):
        raise ConfigError(f"unknown key '{section}.{key}'{did_you_mean(key, field_docs(SECTIONS[section]), section + '.')}")
    if rest:  # one key of a subsection: the others keep their values
        apply_fields(f"{section}.{head}", getattr(getattr(cfg, section), head), {rest: value})
    elif is_subsection(hints[head]) and isinstance(value, dict):  # a mapping merges into the subsection
        apply_fields(f"{section}.{head}", getattr(getattr(cfg, section), head), value)
    else:
        setattr(getattr(cfg, section), key, coerce(f"{section}.{key}", value, hints[key]))


def parse_override(text: str) -> tuple[str, str, Any]:
    """'algo.kl_coef=0.01' → ('algo', 'kl_coef', 0.01); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not section.key=value (e.g. train.steps=50)")
    dotted, raw = text.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ConfigError(f"override '{text}': keys are section.key (e.g. algo.name=ppo) or section.sub.key (algo.teacher.path=DIR)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts[0], ".".join(parts[1:]), value


def _read_file(cfg: Config, path: str | Path) -> None:
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
            raise ConfigError(f"{path}: unknown section '{section}'{did_you_mean(str(section), SECTIONS)}")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: section '{section}' must be a mapping of key: value")
        for key, value in body.items():
            _apply(cfg, section, str(key), value)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file, apply `section.key=value` overrides, resolve, check. Raises ConfigError."""
    cfg = Config()
    if path is not None:
        _read_file(cfg, path)
    for text in overrides:
        _apply(cfg, *parse_override(text))
    cfg = resolve(cfg, Path(path).stem if path is not None else None)
    cfg.check()
    return cfg


def reference_markdown() -> str:
    """The config reference table: every section.key with its default and meaning (README embeds it)."""
    default = Config()
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for name, cls in SECTIONS.items():
        for key, doc in field_docs(cls).items():
            value = getattr(getattr(default, name), key.split(".")[0])
            for sub in key.split(".")[1:]:
                value = getattr(value, sub)
            lines.append(f"| `{name}.{key}` | `{json.dumps(value)}` | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)
