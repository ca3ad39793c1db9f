"""The composition root: from a checked `Config` to the typed components each job runs on.

    rl = build_rl(cfg)           # RLRun   (train/rl.py): tasks, policy, engine, workflow, rollout, trainers
    ev = build_eval(cfg)         # EvalRun (evaluate.py): tasks, policy, engine, workflow; no optimizer, no critic
    sft = build_sft(cfg)         # SFTRun  (train/sft.py): examples, policy
    gen = build_generate(cfg)    # GenerateRun (generate.py): tasks, chat engine, tools, rubric

This is the one module that reads the whole config and knows how the parts fit: every other
module gets its own section (`EngineConfig`, `TrainConfig`, ...) or plain values. Each builder
checks what can fail on bad input first (reward names, data files, tools), then loads the model.
The jobs (seekrl/jobs.py) run what these return; servers build their engine with `local_engine`.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import torch
from rich.console import Console

from seekrl.algo.advantages import AdaptiveKLController, FixedKLController
from seekrl.algo.config import AlgoConfig
from seekrl.algo.mismatch import Correction
from seekrl.config import Config
from seekrl.data.curriculum import curriculum_key, keep_filter
from seekrl.data.sets import TaskSets, load_split, load_task_sets, tiny_texts_of
from seekrl.engines.base import InferenceEngine, text_decoder
from seekrl.engines.local import LocalEngine
from seekrl.engines.scoring import TeacherClient
from seekrl.engines.setup import SamplerSettings, make_engine
from seekrl.engines.weights import write_weights
from seekrl.errors import CheckpointError, ConfigError
from seekrl.evaluate import EvalRun
from seekrl.generate import GenerateRun, OpenAIChatEngine
from seekrl.models import ModelConfig, load_policy, make_value_model, native_bf16, seed_everything, unwrap_peft
from seekrl.observe.config import run_dir as run_folder_of
from seekrl.parallel.controller import FollowerRollout, LeaderRollout
from seekrl.parallel.fsdp import is_sharded, shard_model
from seekrl.parallel.ranks import Ranks, init_ranks
from seekrl.rewards.rubric import Rubric, build_rubric
from seekrl.rollout import stable_seed
from seekrl.rollout.base import Workflow
from seekrl.rollout.config import sampling_params
from seekrl.rollout.executor import make_rollout
from seekrl.rollout.refill import GroupSignal
from seekrl.train.agreement import AgreementCheck
from seekrl.train.batching import FORWARD_METHODS
from seekrl.train.compute import set_autocast, trainer_precision
from seekrl.train.packing import can_pack
from seekrl.train.policy import CriticTrainer, PolicyTrainer
from seekrl.train.ptx import PtxAnchor, last_turn
from seekrl.train.rl import RLRun
from seekrl.train.sft import SFTRun, load_sft_rows, tiny_texts, tokenize_examples
from seekrl.train.teacher import LocalTeacher, RemoteTeacher, Teacher, teacher_folder, teacher_plan, tokenizer_problem

__all__ = ["run_folder", "engine_dtype", "sampler_settings", "build_workflow", "rollout_workflow", "build_rl", "policy_trainer", "ptx_anchor", "critic_trainer", "build_eval",
           "build_curriculum", "curriculum_cache_key", "curriculum_seed", "eval_in_flight", "build_sft", "build_generate",
           "write_initial_weights", "local_engine", "check_teacher", "build_teacher", "check_chat_template", "check_agent",
           "check_rewards_apply"]


def run_folder(cfg: Config, write: bool = True) -> Path:
    """runs/<log.name>/; with `write`, created, the resolved config printed and saved as config.yaml
    (`write=False`: only the path, for trainer ranks other than 0)."""
    run_dir = run_folder_of(cfg.log)
    if not write:
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    if cfg.log.progress:
        Console(stderr=True).print(f"[bold]seekrl[/bold] run folder: {run_dir}\n" + cfg.to_yaml(), highlight=False)
    return run_dir


def engine_dtype(cfg: Config, device_type: str | None = None) -> str:
    """engine.dtype as the engine loads it: auto is model.dtype; bf16_if_native is bfloat16 where
    `device_type` (default: model.device's) computes bf16 natively (seekrl.models.native_bf16),
    model.dtype elsewhere."""
    d = cfg.engine.dtype
    if d == "auto":
        return cfg.model.dtype
    if d == "bf16_if_native":
        if device_type is None:
            dev = cfg.model.device
            device_type = "cuda" if dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available()) else "cpu"
        return "bfloat16" if native_bf16(device_type) else cfg.model.dtype
    return d


def sampler_settings(cfg: Config, device_type: str | None = None) -> SamplerSettings:
    """How seekrl's own engines sample: engine.dtype (`engine_dtype`), model.device, rollout.engine_batch_size / compile / reuse_kv_tokens, train.seed."""
    return SamplerSettings(dtype=engine_dtype(cfg, device_type), device=cfg.model.device, max_batch_size=cfg.rollout.engine_batch_size,
                           seed=cfg.train.seed, compile=cfg.rollout.compile, reuse_kv_tokens=cfg.rollout.reuse_kv_tokens)


def _rubric(cfg: Config) -> Rubric:
    return build_rubric(cfg.reward, cfg.rollout.max_new_tokens)


def build_workflow(cfg: Config, tokenizer, rubric: Rubric) -> Workflow:
    """Single-turn RLVR, the multi-turn tool agent when `tools.format` is set, or the user's
    OpenAI-client agent when `rollout.agent` is."""
    from seekrl.workflows.single_turn import SingleTurnWorkflow

    params = sampling_params(cfg.rollout)
    r = cfg.rollout
    if r.agent is not None:
        from seekrl.workflows.agent import AgentWorkflow, load_agent

        return AgentWorkflow(tokenizer, params, rubric, load_agent(r.agent), agent_kwargs=r.agent_kwargs, max_calls=r.agent_max_calls,
                             max_tokens=r.agent_max_tokens, timeout_s=r.agent_timeout_s, trajectory=r.trajectory,
                             context=cfg.model.max_context)
    if cfg.tools.format is None:
        return SingleTurnWorkflow(tokenizer, params, rubric)
    from seekrl.tools.parsers import get_format
    from seekrl.tools.setup import make_tool_executor
    from seekrl.workflows.tool_agent import ToolAgentWorkflow

    return ToolAgentWorkflow(
        tokenizer, params, rubric, get_format(cfg.tools.format), make_tool_executor(cfg.tools), max_turns=r.max_turns,
        max_obs_tokens=r.max_obs_tokens, max_total_tokens=r.max_total_tokens, mask_observations=r.mask_observations,
        trajectory=r.trajectory,
    )


def rollout_workflow(workflow: Workflow, answer_branches: int, branch_temperature: float | None = None,
                     branch_from: str = "turn") -> Workflow:
    """The training rollout's workflow: `workflow` itself, or with rollout.answer_branches > 1 the
    tool agent that samples each episode's last turn (or its answer's text: rollout.branch_from)
    that many times, the branches at rollout.branch_temperature (evaluation keeps `workflow`)."""
    return workflow if answer_branches == 1 else workflow.with_answer_branches(answer_branches, branch_temperature, branch_from)


def _task_sets(cfg: Config, curriculum: bool = False) -> TaskSets:
    """`curriculum`: filtered by data.curriculum when it is set (the RL run; data/curriculum.py)."""
    keep = keep_filter(cfg.data.curriculum, curriculum_cache_key(cfg)) if curriculum and cfg.data.curriculum else None
    return load_task_sets(cfg.data, seed=cfg.train.seed, tasks_per_step=cfg.rollout.tasks_per_step,
                          tiny=cfg.model.path == "tiny", tools=cfg.tools.format is not None, keep=keep)


def curriculum_cache_key(cfg: Config) -> dict:
    """What a data.curriculum measurement depends on (its cache key): the starting model, the
    training data and its prompts, data.curriculum_k, its seed, and how it samples."""
    d, r = cfg.data, cfg.rollout
    train = [dataclasses.asdict(s) for s in d.train] if isinstance(d.train, list) else d.train
    data = {"train": train, "max_train": d.max_train, "converter": d.converter, "prompt_field": d.prompt_field,
            "answer_field": d.answer_field, "template": d.template, "system_prompt": d.system_prompt,
            "user_template": d.user_template, "max_prompt_tokens": r.max_prompt_tokens}
    return curriculum_key(model=cfg.model.path, data=data, k=d.curriculum_k, seed=curriculum_seed(cfg), temperature=r.temperature,
                          max_new_tokens=r.max_new_tokens)


def eval_in_flight(cfg: Config) -> int | None:
    """Episodes an eval (`seekrl eval`, the RL loop's `eval.every`) or curriculum measurement runs at once: with the in-process engine keeping
    KV across turns, one engine batch (rollout.engine_batch_size), so an episode's next turn finds
    its stored prefix (with every task at once the store overflows and later turns are prefilled
    whole: BENCHMARKS.md); otherwise every task at once (engine servers queue and batch them)."""
    r = cfg.rollout
    return r.engine_batch_size if cfg.engine.kind == "local" and r.reuse_kv_tokens > 0 else None


def curriculum_seed(cfg: Config) -> int:
    """The pass-rate measurement's seed: data.curriculum_seed, or train.seed when it is unset."""
    return cfg.train.seed if cfg.data.curriculum_seed is None else cfg.data.curriculum_seed


def build_curriculum(cfg: Config) -> EvalRun:
    """What `seekrl curriculum` runs on: every data.train task (long prompts dropped as in training),
    the starting policy of model.path built as `build_rl` builds it, the training workflow and
    engine; data.curriculum_k samples per task at rollout.temperature, seeded
    stable_seed(curriculum_seed(cfg), "curriculum"): data.curriculum_seed, else train.seed."""
    if not cfg.data.curriculum:
        raise ConfigError("data.curriculum is not set; name the cache file to write (e.g. data.curriculum=runs/curriculum.json)")
    rubric = _rubric(cfg)
    check_chat_template(cfg)
    check_agent(cfg)
    tasks = _task_sets(cfg)
    seed_everything(curriculum_seed(cfg))
    model, tokenizer = _policy(cfg, tasks.tiny_texts)
    workflow = build_workflow(cfg, tokenizer, rubric)
    tasks.drop_long_prompts(workflow.prompt_ids, cfg.rollout.max_prompt_tokens)
    out = Path(cfg.data.curriculum).resolve().parent
    engine = _engine(cfg, model, tokenizer, out)
    params = sampling_params(cfg.rollout, seed=stable_seed(curriculum_seed(cfg), "curriculum"))
    return EvalRun(run_dir=out, tasks=tasks.train, workflow=workflow, engine=engine, tokenizer=tokenizer, n=cfg.data.curriculum_k,
                   params=params, primary_reward=rubric.names[0], progress=cfg.log.progress, max_in_flight=eval_in_flight(cfg))


def _policy(cfg: Config, texts: list[str] | None, model: ModelConfig | None = None):
    return load_policy(model or cfg.model, seed=cfg.train.seed, tiny_texts=texts)


def _eval_params(cfg: Config):
    return sampling_params(cfg.rollout, temperature=cfg.eval.temperature, seed=stable_seed(cfg.train.seed, "eval"))


def _engine(cfg: Config, model, tokenizer, run_dir: Path) -> InferenceEngine:
    """engine.servers=N starts them here. The async rollout with staleness samples while the
    trainer steps: from a copy of the weights (with max_staleness 0 nothing is sampled during an
    update, so they stay shared)."""
    r = cfg.rollout
    return make_engine(cfg.engine, model, tokenizer, run_dir, sampler_settings(cfg, next(model.parameters()).device.type),
                       copy_weights=r.mode == "async" and r.max_staleness > 0)


def check_chat_template(cfg: Config) -> None:
    """The prefix layout with template-rendered turns (tools.format=hermes) needs a chat template
    that never rewrites an earlier turn (workflows/tool_agent.py): a model folder's tokenizer is
    checked here, before the weights load; the workflow checks again, with its tools' schemas."""
    folder = Path(cfg.model.path)
    if cfg.tools.format != "hermes" or cfg.rollout.trajectory != "prefix" or not (folder / "tokenizer_config.json").is_file():
        return
    from transformers import AutoTokenizer

    from seekrl.tools.parsers import HermesFormat
    from seekrl.workflows.tool_agent import check_prefix_template

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception:  # load_policy reports a folder it cannot load, in one line
        return
    if getattr(tokenizer, "chat_template", None):
        check_prefix_template(tokenizer, HermesFormat())


def check_agent(cfg: Config) -> None:
    """rollout.agent names a function that imports (before any model loads; one line if not)."""
    if cfg.rollout.agent is not None:
        from seekrl.workflows.agent import load_agent

        load_agent(cfg.rollout.agent)


def check_resume_path(resume: str) -> None:
    """train.resume naming a folder that does not exist fails here, in one line, before any model loads
    (the full check of an existing checkpoint runs when it is loaded)."""
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        what = "is not a folder" if Path(resume).exists() else "does not exist"
        raise CheckpointError(f"train.resume: '{resume}' {what}; give a checkpoint folder "
                              "(runs/<name>/checkpoints/step_<N>), auto or never", what)


def check_rewards_apply(rubric: Rubric, tasks: list, source: object) -> None:
    """A reward that declares what a task must carry (`Rubric.unscorable`, e.g. retrieved_support_turn:
    gold paragraph titles) is refused, before the model loads, when no training task carries it:
    it would score 0 on every episode. Every such reward is named in the one line."""
    missing = rubric.unscorable(tasks)
    if missing:
        lacks = "; ".join(f"reward.functions has {name}, but none of the {len(tasks)} training tasks of data.train={source} "
                          f"names {what}" for name, what in missing)
        raise ConfigError(f"{lacks}; train on rows that do or drop the reward")


def build_rl(cfg: Config) -> RLRun:
    """Everything `seekrl train` runs on. What can fail on bad input fails first, then the model loads."""
    t, m = cfg.train, cfg.model
    check_resume_path(t.resume)
    check_teacher(cfg)
    rubric = _rubric(cfg)
    if cfg.algo.turn_advantage and rubric.per_turn is False:
        raise ConfigError(f"algo.turn_advantage=true but no reward of reward.functions={rubric.names} gives per-turn rewards; "
                          "add one (e.g. retrieved_gold_turn) or set algo.turn_advantage=false")
    check_chat_template(cfg)
    check_agent(cfg)
    ptx_rows = load_sft_rows(cfg.data.ptx) if cfg.algo.ptx_coef > 0 else None  # a bad row fails before the model loads
    tasks = _task_sets(cfg, curriculum=True)
    check_rewards_apply(rubric, tasks.train, cfg.data.train)
    ranks = init_ranks(t.dist_backend, t.fsdp, t.dist_timeout_s, lora=m.lora_r > 0, device=m.device)
    run_dir = run_folder(cfg, write=ranks.is_main)
    seed_everything(t.seed)
    model, tokenizer = _policy(cfg, tasks.tiny_texts)
    # rank 0 samples from a full copy when the policy is sharded; the other ranks have no engine
    full_model = (copy.deepcopy(model) if ranks.sharded else model) if ranks.is_main else None
    workflow = engine = None
    if ranks.is_main:
        workflow = build_workflow(cfg, tokenizer, rubric)
        tasks.drop_long_prompts(workflow.prompt_ids, cfg.rollout.max_prompt_tokens)
        engine = _engine(cfg, full_model, tokenizer, run_dir)
    else:
        tasks.eval = []  # rank 0 evaluates
    try:
        ptx = ptx_anchor(cfg, ptx_rows, model, tokenizer) if ptx_rows else None
        return _assemble_rl(cfg, run_dir, tasks, model, tokenizer, full_model, engine, workflow, rubric, ranks, ptx)
    except BaseException:
        if engine is not None:
            engine.close()  # servers started above stop
        if workflow is not None:
            workflow.close()
        raise


def _shard(model: torch.nn.Module, cfg: Config, ranks: Ranks) -> torch.nn.Module:
    """FSDP2 over the ranks (its own bf16 compute); one process: as it is, under autocast with train.mixed_precision=bf16."""
    precision = trainer_precision(cfg.train.mixed_precision, next(model.parameters()).device.type)
    if not ranks.sharded:
        set_autocast(model, torch.bfloat16 if precision == "bf16" else None)
    return shard_model(model, ranks, precision, FORWARD_METHODS)


def ptx_anchor(cfg: Config, rows: list, model, tokenizer) -> PtxAnchor:
    """PPO-ptx's examples (data.ptx, tokenized as `seekrl sft` does; longer than model.max_context:
    dropped and counted), drawn data.ptx_batch at a time, in micro-batches of train.micro_batch_tokens."""
    t = cfg.train
    examples = tokenize_examples(tokenizer, rows, cfg.model.max_context, "data.ptx")
    if cfg.data.ptx_tokens == "last":  # only each example's last assistant turn: an episode's answer, not its searches
        examples = [(ids, last_turn(mask)) for ids, mask in examples]
    return PtxAnchor(examples, coef=cfg.algo.ptx_coef, batch=cfg.data.ptx_batch, seed=t.seed, budget=t.micro_batch_tokens,
                     pad_id=tokenizer.pad_token_id, device=next(model.parameters()).device,
                     pack=t.packing and can_pack(unwrap_peft(model)), buckets=t.length_buckets)


def _assemble_rl(cfg: Config, run_dir: Path, tasks: TaskSets, model, tokenizer, full_model, engine: InferenceEngine | None,
                 workflow: Workflow | None, rubric: Rubric, ranks: Ranks, ptx: PtxAnchor | None = None) -> RLRun:
    t, a, r = cfg.train, cfg.algo, cfg.rollout
    ref_model = None
    if a.kl_coef > 0 and cfg.model.lora_r == 0:
        ref_model = _shard(copy.deepcopy(model).eval().requires_grad_(False), cfg, ranks)
    value_model = make_value_model(model) if a.name == "ppo" else None
    model = _shard(model, cfg, ranks)  # FSDP2 over the ranks; one process: as it is
    exact = ranks.broadcast_json(  # the engine's log-probs equal the trainer's on the same weights (rank 0 knows its engine)
        next(model.parameters()).dtype == torch.float32 and (engine is None or engine.exact_logprobs)
        and not (is_sharded(model) and model.device.type == "cuda")  # bf16 compute under FSDP mixed precision
        and trainer_precision(t.mixed_precision, next(model.parameters()).device.type) != "bf16"  # the trainer computes in bf16: its log-probs are not the fp32 engine's
    )
    trainer = policy_trainer(cfg, model, tokenizer.pad_token_id, ref_model=ref_model, ranks=ranks,
                             correction=mismatch_correction(a, exact), ptx=ptx)
    critic = critic_trainer(cfg, _shard(value_model, cfg, ranks), tokenizer.pad_token_id, ranks=ranks) if value_model else None
    teacher = build_teacher(cfg, tokenizer, tasks.tiny_texts, ranks)
    kl_ctl = AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target is not None else FixedKLController(a.kl_coef)
    # Engine log-probs are exact old log-probs on shared fp32 weights; inserted tokens trained on
    # (mask_observations=false) have none, so that ablation recomputes them.
    unmasked = cfg.tools.format is not None and not r.mask_observations
    reuse = t.recompute_logprobs == "never" or (t.recompute_logprobs == "auto" and exact and not unmasked)
    # Recomputed old log-probs that nothing reads before the update (no KL in the reward, no adaptive
    # KL coefficient, no distillation) and one optimizer step: the update's own forward pass gives them
    # (train/offpolicy.py); with the KL in the loss the update then measures the step's `kl` itself.
    kl_read_before = a.kl_coef > 0 and (a.kl_in == "reward" or a.kl_target is not None)
    one_minibatch = t.minibatches == 1 and t.minibatch_size in (0, r.batch_size // r.group_size)
    from_update = (t.recompute_logprobs == "auto" and not reuse and t.ppo_epochs == 1 and one_minibatch
                   and r.mode == "sync" and not a.decoupled and not kl_read_before and a.name != "distill")
    signal = GroupSignal.of(a)  # which groups train something: the refill's count and algo.filter_zero_std's keep
    if ranks.is_main:
        rollout = make_rollout(r, rollout_workflow(workflow, r.answer_branches, r.branch_temperature, r.branch_from), engine, tasks.iterator, sampling_params(r), seed=t.seed,
                               decode=text_decoder(tokenizer), signal=signal)
        rollout = LeaderRollout(rollout, ranks, full_model) if ranks.distributed else rollout
    else:
        rollout = FollowerRollout(ranks)
    return RLRun(
        train=t, algo=a, eval=cfg.eval, log=cfg.log, config=cfg.to_dict(), run_dir=run_dir, tasks=tasks, model=model,
        full_model=full_model, tokenizer=tokenizer, engine=engine, workflow=workflow, eval_params=_eval_params(cfg),
        eval_in_flight=eval_in_flight(cfg), primary_reward=rubric.names[0], rollout=rollout, trainer=trainer, critic=critic, kl_ctl=kl_ctl,
        reuse_engine_logprobs=reuse, old_from_update=from_update, ranks=ranks, agreement=AgreementCheck(t.agreement_rows, t.agreement_max_kl),
        sync_versions=r.mode == "sync", teacher=teacher, signal=signal,
    )


def _teacher_token(cfg: Config) -> str | None:
    env = cfg.algo.teacher.token_env
    if env and not os.environ.get(env):
        raise ConfigError(f"algo.teacher.token_env: the environment variable {env} is not set; export it or drop the key")
    return os.environ.get(env) if env else None


def check_teacher(cfg: Config) -> None:
    """What can be checked of `algo.teacher` before any model loads: the model folder (a checkpoint
    folder means its model/), the token's variable, and vLLM's temperature (its prompt log-probs
    are taken at temperature 1, the trainer's at rollout.temperature and rollout.branch_temperature)."""
    tc, temperature = cfg.algo.teacher, cfg.rollout.temperature
    if tc.path is not None:
        try:
            dataclasses.replace(cfg.model, path=teacher_folder(tc.path), gguf_file=None).check()
        except ConfigError as e:
            raise ConfigError(str(e).replace("model.path", "algo.teacher.path", 1)) from None
    if tc.url is not None:
        _teacher_token(cfg)
        scored = (("rollout.temperature", temperature), ("rollout.branch_temperature", cfg.rollout.branch_temperature))
        for key, t in scored if tc.api == "vllm" else ():
            if t is not None and t != 1.0:
                raise ConfigError(f"algo.teacher.api=vllm scores at temperature 1 (vLLM's prompt log-probs take no temperature), "
                                  f"the student is scored at {key}={t:g}; set {key}=1 "
                                  "or serve the teacher with seekrl serve engine (algo.teacher.api=seekrl)")


def build_teacher(cfg: Config, tokenizer, texts: list[str] | None, ranks: Ranks | None = None) -> Teacher | None:
    """On-policy distillation's teacher (train/teacher.py), or None without `algo.teacher`: the
    model of algo.teacher.path (loaded as model.path is, frozen, sharded like the reference model;
    `texts` train a tiny teacher's tokenizer) or a client of the server at algo.teacher.url (rank 0
    only). Its tokenizer must be `tokenizer` (ConfigError, one line, before training starts)."""
    tc, ranks = cfg.algo.teacher, ranks or Ranks()
    if tc.path is not None:
        m = dataclasses.replace(cfg.model, path=teacher_folder(tc.path), gguf_file=None, lora_r=0, gradient_checkpointing=False)
        model, teacher_tok = load_policy(m, seed=cfg.train.seed, tiny_texts=texts)
        problem = tokenizer_problem(tokenizer, teacher_tok)
        if problem:
            tiny = (" (model.path=tiny trains its tokenizer on the tasks data.train and data.eval pick with train.seed: use "
                    "the teacher run's data settings and seed)") if cfg.model.path == "tiny" else ""
            raise ConfigError(f"algo.teacher.path: the teacher's tokenizer is not the policy's: {problem}; distillation scores "
                              f"the student's own token ids, so use a teacher with the policy's tokenizer{tiny}")
        model = _shard(model.eval().requires_grad_(False), cfg, ranks)
        return LocalTeacher(model, teacher_plan(model, cfg.train, tokenizer.pad_token_id, ranks), cfg.rollout.temperature)
    if tc.url is not None:
        client = None
        if ranks.is_main:
            client = TeacherClient(tc.url, tc.api, token=_teacher_token(cfg), timeout_s=tc.timeout_s)
            try:
                client.check_tokenizer(tokenizer)
            except BaseException:
                client.close()
                raise
        return RemoteTeacher(client, cfg.rollout.temperature, ranks)
    return None


def mismatch_correction(a: AlgoConfig, exact: bool) -> Correction | None:
    """The importance weight on engine log-probs (algo/mismatch.py): `algo.mismatch`, where auto is
    tis when the engine's log-probs are not `exact` for the trainer's weights and off when they are.
    Decoupled PPO always weighs by proximal / behaviour: None there means the plain weight (or
    `algo.behav_imp_cap`'s mask)."""
    mode = a.mismatch if a.mismatch != "auto" else ("none" if exact else "tis")
    if a.behav_imp_cap is not None and mode == "none":
        return Correction("mis", "token", a.behav_imp_cap)
    if mode == "none":
        return None
    return Correction(mode, a.mismatch_level, a.mismatch_cap, a.mismatch_cap_low)


def policy_trainer(cfg: Config, model, pad_id: int, *, total_steps: int | None = None, ref_model=None,
                   ranks: Ranks | None = None, correction: Correction | None = None, ptx: PtxAnchor | None = None) -> PolicyTrainer:
    """The policy update of `train.*` / `algo.*`, scoring at rollout.temperature (the lr schedule
    counts `total_steps`, default train.steps)."""
    r = cfg.rollout
    return PolicyTrainer(model, cfg.train, cfg.algo, pad_id=pad_id, temperature=r.temperature, norm_tokens=r.max_new_tokens,
                         total_steps=cfg.train.steps if total_steps is None else total_steps, ref_model=ref_model, ranks=ranks,
                         correction=correction, ptx=ptx)


def critic_trainer(cfg: Config, value_model, pad_id: int, *, total_steps: int | None = None,
                   ranks: Ranks | None = None) -> CriticTrainer:
    """PPO's critic update (train.critic_lr, algo.value_clip)."""
    return CriticTrainer(value_model, cfg.train, cfg.algo, pad_id=pad_id,
                         total_steps=cfg.train.steps if total_steps is None else total_steps, ranks=ranks)


def build_eval(cfg: Config) -> EvalRun:
    """What `seekrl eval` runs on: `data.eval` only (nothing is trained: no optimizer, no critic, no
    reference model), the policy of `model.path`, the training workflow and engine. Its folder is
    runs/<name>/eval/, next to the training run's files."""
    if not cfg.data.eval:
        raise ConfigError("data.eval is not set; name the tasks to evaluate (e.g. data.eval=gsm8k:test)")
    check_agent(cfg)
    rubric = _rubric(cfg)
    d = cfg.data
    tasks = load_split(d.eval, d, "test", d.max_eval, cfg.train.seed)
    # runs/<name>/eval/: next to the training run's files, never over its config.yaml
    out = run_folder(dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=str(run_folder_of(cfg.log)), name="eval")))
    seed_everything(cfg.train.seed)
    texts = tiny_texts_of(tasks, tools=cfg.tools.format is not None) if cfg.model.path == "tiny" else None
    model, tokenizer = _policy(cfg, texts)
    workflow = build_workflow(cfg, tokenizer, rubric)
    tasks = [task for task in tasks if len(workflow.prompt_ids(task)) <= cfg.rollout.max_prompt_tokens]
    if not tasks:
        raise ConfigError(f"every data.eval prompt is longer than rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens}; raise it")
    engine = _engine(cfg, model, tokenizer, out)
    return EvalRun(run_dir=out, tasks=tasks, workflow=workflow, engine=engine, tokenizer=tokenizer, n=cfg.eval.n,
                   params=_eval_params(cfg), primary_reward=rubric.names[0], progress=cfg.log.progress,
                   max_in_flight=eval_in_flight(cfg))


def build_sft(cfg: Config) -> SFTRun:
    """What `seekrl sft` runs on: the chat rows of data.train (and data.eval), tokenized with the
    policy's tokenizer, conversations longer than model.max_context dropped and counted."""
    d, m = cfg.data, cfg.model
    check_resume_path(cfg.train.resume)
    if not isinstance(d.train, str):
        raise ConfigError("data.train: seekrl sft reads one chat file, not a mixture of sources; give the file's path")
    train_convs = load_sft_rows(d.train, d.max_train)
    eval_convs = load_sft_rows(d.eval, d.max_eval) if d.eval else []
    run_dir = run_folder(cfg)
    seed_everything(cfg.train.seed)
    model, tokenizer = _policy(cfg, tiny_texts(train_convs + eval_convs) if m.path == "tiny" else None)
    precision = trainer_precision(cfg.train.mixed_precision, next(model.parameters()).device.type)
    set_autocast(model, torch.bfloat16 if precision == "bf16" else None)
    train_ex = tokenize_examples(tokenizer, train_convs, m.max_context, "data.train")
    eval_ex = tokenize_examples(tokenizer, eval_convs, m.max_context, "data.eval") if eval_convs else []
    return SFTRun(train=cfg.train, log=cfg.log, eval_every=cfg.eval.every, batch_size=cfg.rollout.batch_size, shuffle=d.shuffle,
                  config=cfg.to_dict(), run_dir=run_dir, model=model, tokenizer=tokenizer, train_examples=train_ex,
                  eval_examples=eval_ex)


def build_generate(cfg: Config) -> GenerateRun:
    """What `seekrl generate` runs on: the train tasks, the text tool format and tools, the rubric,
    and the chat engine (`generate.endpoint`: an OpenAI-compatible server or the scripted teacher)."""
    import os

    from seekrl.tools.parsers import get_format
    from seekrl.tools.setup import make_tool_executor

    g = cfg.generate
    if cfg.tools.format not in ("search_r1", "dr_tulu"):
        raise ConfigError(f"generate needs tools.format search_r1 or dr_tulu (text tool calls), got {cfg.tools.format}")
    if not g.out:
        raise ConfigError("generate.out is not set; name the JSONL file to write (e.g. generate.out=data/sft.jsonl)")
    rubric = _rubric(cfg)
    tasks = load_split(cfg.data.train, cfg.data, "train", cfg.data.max_train, cfg.train.seed)
    fmt, executor = get_format(cfg.tools.format), make_tool_executor(cfg.tools)
    if g.endpoint == "teacher":
        from seekrl.data.teacher import ScriptedTeacher

        try:  # the probabilities are validated with the config; the kinds need the tasks
            engine = ScriptedTeacher(tasks, cfg.tools.format, seed=cfg.train.seed, skip_search=g.teacher_skip_search,
                                     stop_early=g.teacher_stop_early, weak_query=g.teacher_weak_query, give_up=g.teacher_give_up,
                                     max_turns=cfg.rollout.max_turns, quote=g.teacher_quote, first_query=g.teacher_first_query,
                                     overconfident_kinds=g.teacher_overconfident_kinds)
        except ValueError as e:
            raise ConfigError(f"generate.teacher_{e}") from e
    else:
        key = os.environ.get(g.api_key_env) if g.api_key_env else None
        engine = OpenAIChatEngine(g.endpoint, g.model, key, timeout_s=g.timeout_s, retries=g.retries, concurrency=g.concurrency)
    return GenerateRun(settings=g, tasks=tasks, engine=engine, fmt=fmt, executor=executor, rubric=rubric,
                       max_turns=cfg.rollout.max_turns, max_tokens=cfg.rollout.max_new_tokens, progress=cfg.log.progress,
                       seed=cfg.train.seed)


def write_initial_weights(cfg: Config, run_dir: str | Path) -> Path:
    """`<run>/engine/weights/v0`: the policy the trainer starts from (as `build_rl` loads it: the task
    sets give a tiny model's tokenizer its texts, seeded by train.seed), built on this process's CPU
    (the same weights; the GPUs are the servers' and the ranks'). `seekrl launch` starts its engine
    servers on them."""
    tasks = _task_sets(cfg)
    seed_everything(cfg.train.seed)
    cpu = dataclasses.replace(cfg.model, device="cpu")
    model, tokenizer = _policy(cfg, tasks.tiny_texts, cpu)
    return write_weights(model, Path(run_dir) / "engine" / "weights", 0, tokenizer=tokenizer,
                         untie_embeddings=cfg.engine.api == "vllm")


def local_engine(model_path: str, *, dtype: str = "float32", device: str = "auto", seed: int = 0, max_batch_size: int = 64,
                 compile: str = "false") -> tuple[LocalEngine, object]:
    """An engine over `model_path` (anything model.path accepts), for the servers: frozen weights,
    a tiny model's tokenizer trained on the printable characters. Returns (engine, tokenizer)."""
    import string

    model, tokenizer = load_policy(ModelConfig(path=str(model_path), dtype=dtype, device=device), seed=seed,
                                   tiny_texts=[string.printable])
    return LocalEngine(model.eval().requires_grad_(False), tokenizer, max_batch_size=max_batch_size, seed=seed,
                       compile=compile), tokenizer
