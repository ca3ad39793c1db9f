"""The RL loop: rollout → rewards → advantages → policy (and critic) update → weights to the engine.

    seekrl train examples/tiny_grpo.yaml [section.key=value ...]

It reads top to bottom and calls the functions that do the work (rollout/, workflows/,
train/offpolicy.py, train/estimate.py, train/policy.py, train/checkpoint.py, observe/). Under
torchrun (or `seekrl launch`) every trainer rank runs this same loop: rank 0 rolls out and
logs, every rank receives the batch and computes its share of the log-probs and gradients on a
policy sharded with FSDP2; that machinery is in parallel/ behind `c.ranks` and `c.rollout`. Each step
asks the rollout for its batch: `rollout.mode=sync` rolls the step's tasks out then, `async`
has kept episodes running on the engine while the trainer stepped (rollout/executor.py); the
update runs in a worker thread so that episodes go on meanwhile. The algorithm is chosen by
`algo.name`; PPO adds a critic (a value head on a copy of the policy backbone, as in verl);
a reference model exists only when `algo.kl_coef > 0`. Old log-probs are the engine's when the
engine shares the trainer's fp32 weights (they agree to 1e-4, see the engine tests), otherwise
they are recomputed. A run folder holds config.yaml, metrics.jsonl, tensorboard/,
trajectories/step_<N>.jsonl and checkpoints/step_<N>/; `train.resume=auto` continues it.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from seekrl.algo.advantages import AdaptiveKLController, FixedKLController, zero_std_group_mask
from seekrl.config import Config
from seekrl.engines.base import InferenceEngine, text_decoder
from seekrl.engines.launch import terminate_as_exit
from seekrl.engines.setup import make_engine
from seekrl.evaluate import evaluate
from seekrl.models import make_value_model
from seekrl.observe.loggers import NullLogger, RunLogger
from seekrl.observe.progress import Progress
from seekrl.observe.samples import write_trajectories
from seekrl.observe.stats import StatsTracker
from seekrl.parallel.checkpoint import save_ranks_checkpoint
from seekrl.parallel.controller import FollowerEngine, FollowerRollout, LeaderRollout
from seekrl.parallel.fsdp import is_sharded, shard_model
from seekrl.parallel.ranks import Ranks, init_ranks
from seekrl.rollout import stable_seed
from seekrl.rollout.executor import AsyncRollout, SyncRollout, make_rollout
from seekrl.train.checkpoint import resume_checkpoint
from seekrl.train.estimate import estimate_advantages
from seekrl.train.offpolicy import old_logprobs
from seekrl.train.policy import CriticTrainer, PolicyTrainer
from seekrl.train.setup import TaskSets, build_rubric, load_policy, load_task_sets, make_workflow, prepare_run_dir, sampling_params


@dataclass
class Components:
    cfg: Config
    run_dir: Path
    tasks: TaskSets
    model: torch.nn.Module
    tokenizer: object
    engine: InferenceEngine  # LocalEngine, or RemoteEngine on servers (engine.kind=remote)
    workflow: object  # SingleTurnWorkflow | ToolAgentWorkflow: `async run(task, engine, n, params)`
    trainer: PolicyTrainer
    critic: CriticTrainer | None
    kl_ctl: FixedKLController | AdaptiveKLController
    reuse_engine_logprobs: bool
    rollout: SyncRollout | AsyncRollout | LeaderRollout | FollowerRollout  # where each step's batch comes from
    ranks: Ranks  # one process: Ranks(); under torchrun this process's rank (parallel/ranks.py)
    full_model: torch.nn.Module | None  # rank 0: the policy's full weights (the model itself unless sharded)


def build(cfg: Config) -> Components:
    """Everything that can fail on bad input fails here, before the model loads, then loads it."""
    rubric = build_rubric(cfg)
    tasks = load_task_sets(cfg)
    ranks = init_ranks(cfg)  # one process, or this rank of torchrun's (joins the process group)
    run_dir = prepare_run_dir(cfg, write=ranks.is_main)
    seed_everything(cfg.train.seed)
    m = cfg.model
    model, tokenizer = load_policy(cfg, tasks.tiny_texts)
    # rank 0 samples from a full copy when the policy is sharded; the other ranks have no engine
    full_model = (copy.deepcopy(model) if ranks.sharded else model) if ranks.is_main else None
    workflow, engine = None, FollowerEngine()
    if ranks.is_main:
        workflow = make_workflow(cfg, tokenizer, rubric)
        tasks.drop_long_prompts(workflow.prompt_ids, cfg.rollout.max_prompt_tokens)
        engine = make_engine(cfg, full_model, tokenizer, run_dir)  # engine.servers=N starts them here
    else:
        tasks.eval = []  # rank 0 evaluates
    a = cfg.algo
    ref_model = None
    if a.kl_coef > 0 and m.lora_r == 0:
        ref_model = shard_model(copy.deepcopy(model).eval().requires_grad_(False), ranks, cfg.train.mixed_precision)
    value_model = make_value_model(model) if a.name == "ppo" else None
    model = shard_model(model, ranks, cfg.train.mixed_precision)  # FSDP2 over the ranks; one process: as it is
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id, cfg.train.steps, ref_model=ref_model, ranks=ranks)
    critic = None
    if value_model is not None:
        critic = CriticTrainer(shard_model(value_model, ranks, cfg.train.mixed_precision), cfg, tokenizer.pad_token_id,
                               cfg.train.steps, ranks=ranks)
    kl_ctl = (
        AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target is not None else FixedKLController(a.kl_coef)
    )
    # Engine log-probs are exact old log-probs on shared fp32 weights; inserted tokens trained on
    # (mask_observations=false) have none, so that ablation recomputes them.
    unmasked = cfg.tools.format is not None and not cfg.rollout.mask_observations
    reuse = cfg.train.recompute_logprobs == "never" or (
        cfg.train.recompute_logprobs == "auto" and next(model.parameters()).dtype == torch.float32 and not unmasked
        and getattr(engine, "exact_logprobs", True)  # remote: only seekrl's fp32 servers on the same weights
        and not (is_sharded(model) and model.device.type == "cuda")  # bf16 compute under FSDP mixed precision
    )
    reuse = ranks.broadcast_json(reuse)  # rank 0 knows its engine
    if ranks.is_main:
        rollout = make_rollout(cfg, workflow, engine, tasks.iterator, text_decoder(tokenizer))
        rollout = LeaderRollout(rollout, ranks, full_model) if ranks.distributed else rollout
    else:
        rollout = FollowerRollout(ranks)
    return Components(cfg, run_dir, tasks, model, tokenizer, engine, workflow, trainer, critic, kl_ctl, reuse, rollout, ranks,
                      full_model)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: Config) -> Path:
    """Run (or resume) the RL loop described by `cfg`; return the run folder. Engine servers the
    run started are stopped when it ends: normally, on an error, on Ctrl-C and on SIGTERM."""
    with terminate_as_exit():
        c = build(cfg)
        try:
            return asyncio.run(_train(c))
        finally:
            c.engine.close()
            c.ranks.close()


async def _train(c: Components) -> Path:
    cfg = c.cfg
    start = resume(c)
    # The engine samples from the weights the loop starts with (resumed, or changed since build):
    # in-process this only sets the version; servers get one disk sync.
    await c.rollout.publish(c.model, start)
    logger = RunLogger(
        c.run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
        config=cfg.to_dict(), resume_step=start if start > 0 else None,
    ) if c.ranks.is_main else NullLogger()
    stop_at = cfg.train.steps if not cfg.train.max_steps_this_run else min(cfg.train.steps, start + cfg.train.max_steps_this_run)
    progress = Progress(cfg.train.steps, start_step=start, enabled=cfg.log.progress and c.ranks.is_main, fields=("kl", "entropy"))
    progress.start()
    try:
        c.rollout.start(start)  # async: episodes of the next steps start now
        if start == 0 and c.tasks.eval:
            logger.log(await run_eval(c), step=0)
        for step in range(start + 1, stop_at + 1):
            metrics = await rl_step(c, step)
            if c.tasks.eval and cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.train.steps:
                metrics.update(await run_eval(c))
            if step == cfg.train.steps and c.tasks.eval:
                metrics.update(await run_eval(c))
            logger.log(metrics, step=step)
            progress.update(step, metrics)
            c.trainer.guard.raise_if_stuck(step)  # train.max_nonfinite skipped steps in a row: stop, no checkpoint
            if step == stop_at or (cfg.train.save_every and step % cfg.train.save_every == 0):
                checkpoint(c, step)
    finally:
        await c.rollout.aclose()
        progress.close()
        logger.close()
    return c.run_dir


async def rl_step(c: Components, step: int) -> dict[str, float]:
    cfg, stats = c.cfg, StatsTracker()
    t0 = time.perf_counter()
    # 1. Rollout: the step's groups (G episodes per task, scored by the rubric inside the workflow).
    batch = await c.rollout.next_batch(step)
    groups = batch.groups
    t_rollout = time.perf_counter() - t0
    trajs = [t for g in groups for t in g.trajectories]
    group_ids = [i for i, g in enumerate(groups) for _ in g.trajectories]
    log_rollout_stats(stats, trajs)
    if cfg.log.samples_every and step % cfg.log.samples_every == 0 and c.ranks.is_main:
        write_trajectories(c.run_dir / "trajectories" / f"step_{step}.jsonl", groups, c.tokenizer, max_groups=cfg.log.samples_groups)

    # 2. Optionally drop groups without reward spread (DAPO dynamic sampling).
    if cfg.algo.filter_zero_std:
        keep = zero_std_group_mask(torch.tensor([t.reward for t in trajs]), torch.tensor(group_ids)).tolist()
        trajs = [t for t, k in zip(trajs, keep) if k]
        group_ids = [g for g, k in zip(group_ids, keep) if k]
        stats.add(**{"rollout/kept_frac": len(trajs) / max(1, len(keep))})

    # 3-5. Log-probs, advantages and the updates, in a worker thread: async episodes go on meanwhile.
    if trajs:
        await asyncio.to_thread(learn, c, trajs, group_ids, step, stats)
    # Updates with a nan/inf loss or gradient norm were skipped (policy.py): counted here.
    stats.add(**c.trainer.guard.end_step())
    # 6. New weights to the engine (in-process sync: the same tensors, so only the version moves;
    #    async: the turns in flight are cut and continue under the new weights).
    await c.rollout.publish(c.model, step)
    out = stats.export()
    out.setdefault("kl", out.get("actor/approx_kl", 0.0))
    out.setdefault("loss/policy", 0.0)
    out.setdefault("entropy", 0.0)
    out.setdefault("actor/behav_imp_weight/mean", 1.0)
    out.setdefault("actor/behav_cap_frac", 0.0)
    out.update(batch.metrics)  # rollout/staleness/mean|max, rollout/interrupted, rollout/queue, time/wait_s
    out["time/rollout_s"] = t_rollout
    out["time/step_s"] = time.perf_counter() - t0
    out["tokens/sampled"] = float(sum(t.num_sampled for t in trajs)) if trajs else 0.0
    out["epoch"] = float(c.tasks.iterator.epoch)
    out.update(c.engine.metrics())  # engine/server_failures, ... (remote engines)
    return out


def learn(c: Components, trajs, group_ids, step: int, stats: StatsTracker) -> None:
    """Old / reference log-probs, values, advantages, then the critic and policy updates."""
    cfg = c.cfg
    # 3. Old log-probs (behaviour, or proximal with decoupled PPO), reference log-probs and values.
    old = old_logprobs(cfg, c.trainer, trajs, trained_version=step - 1, reuse=c.reuse_engine_logprobs)
    ref_logp = c.trainer.ref_logprobs(trajs) if cfg.algo.kl_coef > 0 else None
    values = c.critic.values(trajs) if c.critic else None
    # 4. Advantages.
    kl_coef = c.kl_ctl.value
    est = estimate_advantages(
        cfg.algo.name, trajs, group_ids, old_logp=old.old, ref_logp=ref_logp,
        kl_coef_in_reward=kl_coef if cfg.algo.kl_in == "reward" else 0.0, kl_estimator=cfg.algo.kl_estimator,
        values=values, gamma=cfg.algo.gamma, lam=cfg.algo.lam,
    )
    # 5. Updates.
    if c.critic:
        c.critic.update(trajs, values, est.returns, stats, guard=c.trainer.guard)
    c.trainer.update(trajs, est.adv, old.old, ref_logp, kl_coef if cfg.algo.kl_in == "loss" else 0.0, stats,
                     behav_logp=old.behav, prox_alpha=old.alpha)
    if est.kl_mean is not None:
        c.kl_ctl.update(est.kl_mean, len(trajs))
        stats.add(kl=est.kl_mean, kl_coef=kl_coef)
    if c.ranks.distributed:  # each rank measured its share: combine them (what one process would have logged)
        stats.merge(c.ranks.all_gather_json(stats.state()))


def log_rollout_stats(stats: StatsTracker, trajs) -> None:
    rewards = [t.reward for t in trajs]
    stats.add_dist("reward", rewards)
    stats.add_dist("response_len", [float(len(t.completion_ids)) for t in trajs])
    stats.add(**{"rollout/truncated_frac": sum(t.finish_reason == "length" for t in trajs) / len(trajs)})
    for key in sorted({k for t in trajs for k in t.metrics}):  # turns, tool_calls/<name>, tool_errors, ...
        stats.add(**{f"rollout/{key}": sum(t.metrics.get(key, 0.0) for t in trajs) / len(trajs)})
    for part in sorted({p for t in trajs for p in t.reward_parts}):
        stats.add(**{f"reward/{part}": sum(t.reward_parts.get(part, 0.0) for t in trajs) / len(trajs)})
    sources = sorted({t.task.source for t in trajs})
    if len(sources) > 1:
        for s in sources:
            rs = [t.reward for t in trajs if t.task.source == s]
            stats.add(**{f"reward/{s}/mean": sum(rs) / len(rs)})


async def run_eval(c: Components) -> dict[str, float]:
    cfg = c.cfg
    params = sampling_params(cfg, c.tokenizer, temperature=cfg.eval.temperature, seed=stable_seed(cfg.train.seed, "eval"))
    metrics, _ = await evaluate(c.workflow, c.engine, c.tasks.eval, cfg.eval.n, params, c.workflow.rubric.names[0])
    return metrics


# ---- checkpoints --------------------------------------------------------------------------------
def _sched_state(sched) -> dict:
    return {k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}


def _engine_state(engine) -> dict:
    """The engine's state as JSON: the version, and a local engine's sampler state as a list."""
    state = dict(engine.state_dict())
    if isinstance(state.get("generator"), torch.Tensor):
        state["generator"] = state["generator"].tolist()
    return state


def checkpoint(c: Components, step: int) -> Path | None:
    state = {
        "step": step,
        "kind": "rl",
        "data": c.rollout.data_state(step),  # the first batch not trained (async: later ones may be in flight)
        "engine": _engine_state(c.engine),
        "kl_ctl": c.kl_ctl.state_dict(),
        "trainer_gen": c.trainer.gen.get_state().tolist(),
        "critic_gen": c.critic.gen.get_state().tolist() if c.critic else None,
        "critic_sched": _sched_state(c.critic.scheduler) if c.critic else None,
        "nonfinite": c.trainer.guard.state_dict(),
    }
    # one process: the usual folder; several ranks: rank 0 writes the whole model, each rank its
    # optimizer shard (parallel/checkpoint.py)
    return save_ranks_checkpoint(
        c.ranks, c.run_dir / "checkpoints", step, model=c.model, full_model=c.full_model, tokenizer=c.tokenizer,
        optimizer=c.trainer.optimizer, scheduler=c.trainer.scheduler, critic=c.critic.model if c.critic else None,
        critic_optimizer=c.critic.optimizer if c.critic else None, state=state, keep_last=c.cfg.train.keep_last,
    )


def _quiet(message: str) -> None:
    pass


def resume(c: Components) -> int:
    """Restore the checkpoint `train.resume` names, verified first (auto: the one checkpoints/latest
    names, else the newest intact one; damaged ones are skipped with a warning; none intact, or a
    bad path, is a CheckpointError); return the step it ends at (0: fresh run)."""
    found = resume_checkpoint(  # every rank reads it (a sharded model keeps its shard; N ranks resume on M)
        c.cfg.train.resume, c.run_dir / "checkpoints", model=c.model, optimizer=c.trainer.optimizer,
        scheduler=c.trainer.scheduler, critic=c.critic.model if c.critic else None,
        critic_optimizer=c.critic.optimizer if c.critic else None, kind="rl", **({} if c.ranks.is_main else {"warn": _quiet}),
    )
    if found is None:
        return 0
    _, state = found
    c.tasks.iterator.load_state_dict(state["data"])
    c.engine.load_state_dict(state["engine"])
    c.kl_ctl.load_state_dict(state["kl_ctl"])
    c.trainer.gen.set_state(torch.tensor(state["trainer_gen"], dtype=torch.uint8))
    if c.critic:
        c.critic.gen.set_state(torch.tensor(state["critic_gen"], dtype=torch.uint8))
        c.critic.scheduler.load_state_dict({**state["critic_sched"], "lr_lambdas": [None]})
    c.trainer.guard.load_state_dict(state.get("nonfinite") or {})
    return int(state["step"])
