"""The RL loop: rollout → rewards → advantages → policy (and critic) update → weights to the engine.

    seekrl train examples/tiny_grpo.yaml [section.key=value ...]     # seekrl.jobs.train

`run(rl)` reads top to bottom: for each step it asks the rollout for the step's trajectories,
turns them into one `TokenBatch` (train/batch.py), fills in the old / reference log-probs, values
and advantages (train/offpolicy.py, train/estimate.py), updates the critic and the policy
(train/policy.py), gives the engine the new weights, and logs, evaluates and checkpoints. What it
runs on (`RLRun`) is assembled by the composition root (seekrl/build.py `build_rl`), so nothing
here reads the config file or builds a component.

`rollout.mode=sync` rolls the step's tasks out when asked; `async` has kept episodes running on
the engine while the trainer stepped (rollout/executor.py); the update runs in a worker thread
so that episodes go on meanwhile. Under torchrun (or `seekrl launch`) every trainer rank runs
this same loop: rank 0 rolls out and logs, every rank receives the batch and computes its share
of the log-probs and gradients on a policy sharded with FSDP2 (parallel/, train/plan.py). The
algorithm is `algo.name`; PPO adds a critic; a reference model exists only when
`algo.kl_coef > 0`; on-policy distillation (`algo.name=distill`, or `algo.distill_coef` with
another estimator) adds a teacher that scores the sampled tokens (train/teacher.py); PPO-ptx
(`algo.ptx_coef`, `data.ptx`) adds a supervised loss to each policy update (train/ptx.py). Old
log-probs are the engine's when the engine's are exact for the trainer's weights
(engines/base.py), otherwise they are recomputed. A run folder holds
config.yaml, metrics.jsonl, tensorboard/, trajectories/step_<N>.jsonl and
checkpoints/step_<N>/; `train.resume=auto` continues it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seekrl.algo.advantages import AdaptiveKLController, FixedKLController, zero_std_group_mask
from seekrl.algo.config import AlgoConfig
from seekrl.data.sets import TaskSets
from seekrl.engines.base import InferenceEngine
from seekrl.evaluate import EvalConfig, evaluate
from seekrl.memory import release as release_memory
from seekrl.observe.config import LogConfig
from seekrl.observe.loggers import SAMPLES_DIR, NullLogger, RunLogger
from seekrl.observe.progress import Progress
from seekrl.observe.samples import write_trajectories
from seekrl.observe.stats import StatsTracker
from seekrl.parallel.ranks import Ranks
from seekrl.rollout.base import RolloutSource, Workflow
from seekrl.train.agreement import AgreementCheck, reject_unexpected_versions
from seekrl.train.batch import TokenBatch
from seekrl.train.checkpoint import resume_checkpoint, save_ranks_checkpoint
from seekrl.train.config import TrainConfig
from seekrl.train.estimate import estimate_advantages
from seekrl.train.offpolicy import old_logprobs
from seekrl.train.policy import CriticTrainer, PolicyTrainer
from seekrl.train.teacher import Teacher
from seekrl.types import SamplingParams, Trajectory, TrajectoryGroup

__all__ = ["RLRun", "run", "rl_step", "learn"]


@dataclass
class RLRun:
    """What the RL loop runs on, assembled by seekrl.build.build_rl (the composition root)."""

    train: TrainConfig
    algo: AlgoConfig
    eval: EvalConfig
    log: LogConfig
    config: dict  # the resolved config, for the loggers
    run_dir: Path
    tasks: TaskSets
    model: torch.nn.Module  # the policy being trained (sharded over the ranks when there are several)
    full_model: torch.nn.Module | None  # rank 0: its full weights, which the engine samples (the model itself unless sharded)
    tokenizer: Any
    engine: InferenceEngine | None  # rank 0: LocalEngine, or RemoteEngine on servers; None on the other ranks
    workflow: Workflow | None  # rank 0
    eval_params: SamplingParams  # how evaluation samples (eval.temperature, its own seed)
    eval_in_flight: int | None  # episodes the in-training eval runs at once (build.eval_in_flight); None: every task
    primary_reward: str  # the rubric's first reward: evaluation's accuracy rule
    rollout: RolloutSource  # where each step's batch comes from
    trainer: PolicyTrainer
    critic: CriticTrainer | None  # PPO
    kl_ctl: FixedKLController | AdaptiveKLController
    reuse_engine_logprobs: bool  # the engine's log-probs are the old log-probs (exact on the trainer's weights)
    old_from_update: bool  # otherwise one optimizer step a batch: the update's own log-probs, detached (no extra pass)
    agreement: AgreementCheck  # engine vs trainer log-probs, every step
    sync_versions: bool  # sync rollout: every sampled token comes from the version published last
    ranks: Ranks  # one process: Ranks(); under torchrun this process's rank (parallel/ranks.py)
    signal: Callable[[TrajectoryGroup], bool]  # algo.filter_zero_std: the groups that train something (rollout/refill.py GroupSignal)
    teacher: Teacher | None = None  # on-policy distillation (algo.teacher): scores the student's tokens

    def close(self) -> None:
        """Release the workflow (an agent endpoint), the engine (the servers a run started stop), the
        teacher, and leave the process group."""
        if self.workflow is not None:
            self.workflow.close()
        if self.engine is not None:
            self.engine.close()
        if self.teacher is not None:
            self.teacher.close()
        self.ranks.close()


async def run(rl: RLRun) -> Path:
    """Run (or resume) the loop; return the run folder."""
    t = rl.train
    start = resume(rl)
    # The engine samples from the weights the loop starts with (resumed, or changed since build):
    # in-process this only sets the version; servers get one disk sync.
    await rl.rollout.publish(rl.model, start)
    logger = RunLogger.for_run(rl.log, rl.run_dir, rl.config, resume_step=start if start > 0 else None) if rl.ranks.is_main else NullLogger()
    stop_at = t.steps if not t.max_steps_this_run else min(t.steps, start + t.max_steps_this_run)
    progress = Progress(t.steps, start_step=start, enabled=rl.log.progress and rl.ranks.is_main, fields=("kl", "entropy"))
    progress.start()
    try:
        rl.rollout.start(start)  # async: episodes of the next steps start now
        if start == 0 and rl.tasks.eval:
            logger.log(await run_eval(rl), step=0)
        for step in range(start + 1, stop_at + 1):
            metrics = await rl_step(rl, step)
            if rl.tasks.eval and rl.eval.every and step % rl.eval.every == 0 and step != t.steps:
                metrics.update(await run_eval(rl))
            if step == t.steps and rl.tasks.eval:
                metrics.update(await run_eval(rl))
            logger.log(metrics, step=step)
            progress.update(step, metrics)
            rl.trainer.guard.raise_if_stuck(step)  # train.max_nonfinite skipped steps in a row: stop, no checkpoint
            if step == stop_at or (t.save_every and step % t.save_every == 0):
                checkpoint(rl, step)
    finally:
        await rl.rollout.aclose()
        progress.close()
        logger.close()
    return rl.run_dir


async def rl_step(rl: RLRun, step: int) -> dict[str, float]:
    stats = StatsTracker()
    t0 = time.perf_counter()
    # 1. Rollout: the step's groups (G episodes per task, scored by the rubric inside the workflow).
    batch = await rl.rollout.next_batch(step)
    groups = batch.groups
    t_rollout = time.perf_counter() - t0
    trajs = [t for g in groups for t in g.trajectories]
    group_ids = [i for i, g in enumerate(groups) for _ in g.trajectories]
    if rl.ranks.is_main and rl.log.samples_every and step % rl.log.samples_every == 0:
        write_trajectories(rl.run_dir / SAMPLES_DIR / f"step_{step}.jsonl", groups, rl.tokenizer, max_groups=rl.log.samples_groups)
    # Leave out what the infrastructure broke: an engine or tool server failure, or a token from a
    # weight version the trainer did not publish (train/agreement.py). Counted, never learned from.
    reject_unexpected_versions(trajs, step, sync=rl.sync_versions)
    trajs, group_ids = usable(trajs, group_ids, stats)
    if trajs:
        log_rollout_stats(stats, trajs, group_ids)

    # 2. Optionally drop the groups that would train nothing (DAPO dynamic sampling): no reward
    #    spread among their usable trajectories, by the credit's notion (rl.signal, the refill's).
    if rl.algo.filter_zero_std and trajs:
        signal = [rl.signal(g) for g in groups]
        keep = [signal[g] for g in group_ids]
        trajs = [t for t, k in zip(trajs, keep) if k]
        group_ids = [g for g, k in zip(group_ids, keep) if k]
        stats.add(**{"rollout/kept_frac": len(trajs) / max(1, len(keep))})

    # 3-5. One per-token batch; log-probs, advantages and the updates in a worker thread: async episodes go on meanwhile.
    if trajs:
        await asyncio.to_thread(learn, rl, TokenBatch.from_trajectories(trajs, group_ids), step, stats)
    # Updates with a nan/inf loss or gradient norm were skipped (train/optim.py): counted here.
    stats.add(**rl.trainer.guard.end_step())
    # 6. New weights to the engine (in-process sync: the same tensors, so only the version moves;
    #    async: the turns in flight are cut and continue under the new weights).
    t_publish = time.perf_counter()
    await rl.rollout.publish(rl.model, step)
    stats.add(**{"time/publish_s": time.perf_counter() - t_publish})
    out = stats.export()
    out.setdefault("kl", out.get("actor/approx_kl", 0.0))
    out.setdefault("loss/policy", 0.0)
    out.setdefault("entropy", 0.0)
    out.setdefault("actor/behav_imp_weight/mean", 1.0)
    out.setdefault("actor/behav_cap_frac", 0.0)
    out.setdefault("mismatch/masked_frac", 0.0)  # no correction (exact engine log-probs) masks nothing
    out.update(batch.metrics)  # rollout/staleness/mean|max, rollout/interrupted, rollout/queue, time/wait_s
    out["time/rollout_s"] = t_rollout
    out["time/step_s"] = time.perf_counter() - t0
    out["tokens/sampled"] = float(sum(t.num_sampled for t in trajs)) if trajs else 0.0
    out["epoch"] = float(rl.tasks.iterator.epoch)
    out.update(release_memory())  # the step's freed pages back to the system: memory/rss_gib (seekrl/memory.py)
    if rl.engine is not None:
        out.update(rl.engine.metrics())  # engine/server_failures, ... (remote engines)
    return out


def learn(rl: RLRun, batch: TokenBatch, step: int, stats: StatsTracker) -> None:
    """Old / reference log-probs, values, advantages, then the critic and policy updates."""
    a = rl.algo
    t0 = time.perf_counter()
    # 3. Old log-probs (behaviour, or proximal with decoupled PPO), reference log-probs and values;
    #    the engine's log-probs checked against the trainer's (train/agreement.py).
    old = old_logprobs(a, rl.trainer, batch, trained_version=step - 1, reuse=rl.reuse_engine_logprobs,
                       from_update=rl.old_from_update)
    batch.old_logp_BC, batch.prox_alpha_BC = old.old_BC, old.alpha_BC
    check = rl.agreement.measure(rl.trainer, batch, step - 1, old.old_BC if old.recomputed else None)
    stats.add_max(**{k: check.pop(k) for k in ("mismatch/ratio_max", "mismatch/abs_diff_max") if k in check})
    stats.add(**check)
    batch.ref_logp_BC = rl.trainer.ref_logprobs(batch) if a.kl_coef > 0 else None
    batch.teacher_logp_BC = rl.teacher.logprobs(batch) if rl.teacher else None  # distillation: the teacher scores the student's tokens
    batch.values_BC = rl.critic.values(batch) if rl.critic else None
    stats.add(**{"time/logprobs_s": time.perf_counter() - t0})
    # 4. Advantages.
    kl_coef = rl.kl_ctl.value
    est = estimate_advantages(
        a.name, batch, ref_logp_BC=batch.ref_logp_BC, kl_coef_in_reward=kl_coef if a.kl_in == "reward" else 0.0,
        kl_estimator=a.kl_estimator, values_BC=batch.values_BC, gamma=a.gamma, lam=a.lam, distill_coef=a.distill_coef,
        turn_gamma=a.turn_gamma, turn_advantage=a.turn_advantage, branch_credit=a.branch_credit,
    )
    batch.adv_BC, batch.returns_BC = est.adv_BC, est.returns_BC
    stats.add(**est.metrics)  # distill/reverse_kl
    batch.kl_coef = kl_coef if a.kl_in == "loss" else 0.0
    # 5. Updates.
    t_update = time.perf_counter()
    if rl.critic:
        rl.critic.update(batch, stats, guard=rl.trainer.guard)
        stats.add(**{"time/critic_s": time.perf_counter() - t_update})
    rl.trainer.update(batch, stats)
    stats.add(**{"time/update_s": time.perf_counter() - t_update})
    if est.kl_mean is not None:  # else, with old log-probs from the update, the update measured it
        rl.kl_ctl.update(est.kl_mean, len(batch))
        stats.add(kl=est.kl_mean)
    if batch.ref_logp_BC is not None:
        stats.add(kl_coef=kl_coef)
    if rl.ranks.distributed:  # each rank measured its share: combine them (what one process would have logged)
        stats.merge(rl.ranks.all_gather_json(stats.state()))


def usable(trajs: list[Trajectory], group_ids: list[int], stats: StatsTracker) -> tuple[list[Trajectory], list[int]]:
    """The trajectories with status "ok" (and their group ids); the others counted by status in
    `rollout/excluded/<status>` and `rollout/excluded_frac`. A group keeps its usable members:
    the baseline is taken over them."""
    keep = [t.status == "ok" for t in trajs]
    counts = {"engine_error": 0, "tool_unavailable": 0, "reward_unavailable": 0, "version_mismatch": 0, "agent_error": 0}
    for t, k in zip(trajs, keep):
        if not k:
            counts[t.status] = counts.get(t.status, 0) + 1
    stats.add(**{f"rollout/excluded/{s}": float(n) for s, n in counts.items()},
              **{"rollout/excluded_frac": (len(trajs) - sum(keep)) / max(1, len(trajs))})
    return [t for t, k in zip(trajs, keep) if k], [g for g, k in zip(group_ids, keep) if k]


def log_rollout_stats(stats: StatsTracker, trajs: list[Trajectory], group_ids: list[int] | None = None) -> None:
    """The step's reward, length, per-turn and per-source metrics; with `group_ids`, also each
    reward part's `reward/<part>/spread_frac`: the share of trajectories in groups where that part
    differs (which part carries the group-relative signal; `rollout/kept_frac` is the total's)."""
    rewards = [t.reward for t in trajs]
    stats.add_dist("reward", rewards)
    stats.add_dist("response_len", [float(len(t.completion_ids)) for t in trajs])
    stats.add(**{"rollout/truncated_frac": sum(t.finish_reason == "length" for t in trajs) / len(trajs)})
    for key in sorted({k for t in trajs for k in t.metrics}):  # turns, tool_calls/<name>, tool_errors, ...
        stats.add(**{f"rollout/{key}": sum(t.metrics.get(key, 0.0) for t in trajs) / len(trajs)})
    groups = torch.tensor(group_ids) if group_ids is not None else None
    for part in sorted({p for t in trajs for p in t.reward_parts}):
        values = [t.reward_parts.get(part, 0.0) for t in trajs]
        stats.add(**{f"reward/{part}": sum(values) / len(trajs)})
        if groups is not None:
            stats.add(**{f"reward/{part}/spread_frac": zero_std_group_mask(torch.tensor(values), groups).float().mean().item()})
    sources = sorted({t.task.source for t in trajs})
    if len(sources) > 1:
        parts = sorted({p for t in trajs for p in t.reward_parts})
        # the exact-match part, when the rubric has one: qa_em, else a RewardResult's <name>/em (search_r1/em)
        em = "qa_em" if "qa_em" in parts else next((p for p in parts if p.rsplit("/", 1)[-1] == "em"), None)
        for s in sources:
            mine = [t for t in trajs if t.task.source == s]
            stats.add(**{f"reward/{s}/mean": sum(t.reward for t in mine) / len(mine)})
            if em is not None:
                stats.add(**{f"reward/{s}/em": sum(t.reward_parts.get(em, 0.0) for t in mine) / len(mine)})


async def run_eval(rl: RLRun) -> dict[str, float]:
    t0 = time.perf_counter()
    metrics, _ = await evaluate(rl.workflow, rl.engine, rl.tasks.eval, rl.eval.n, rl.eval_params, rl.primary_reward,
                                max_in_flight=rl.eval_in_flight)
    return {**metrics, "time/eval_s": time.perf_counter() - t0}


# ---- checkpoints --------------------------------------------------------------------------------
def _sched_state(sched) -> dict:
    return {k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}


def _engine_state(engine: InferenceEngine | None) -> dict:
    """The engine's state as JSON: the version, and a local engine's sampler state as a list."""
    state = dict(engine.state_dict()) if engine is not None else {}
    if isinstance(state.get("generator"), torch.Tensor):
        state["generator"] = state["generator"].tolist()
    return state


def checkpoint(rl: RLRun, step: int) -> Path | None:
    critic = rl.critic
    state = {
        "step": step,
        "kind": "rl",
        "data": rl.rollout.data_state(step),  # the first batch not trained (async: later ones may be in flight)
        "engine": _engine_state(rl.engine),
        "kl_ctl": rl.kl_ctl.state_dict(),
        "trainer_gen": rl.trainer.gen.get_state().tolist(),
        "critic_gen": critic.gen.get_state().tolist() if critic else None,
        "critic_sched": _sched_state(critic.scheduler) if critic else None,
        "nonfinite": rl.trainer.guard.state_dict(),
        "ptx": rl.trainer.ptx.state_dict() if rl.trainer.ptx else None,  # PPO-ptx: the examples drawn so far
    }
    # one process: the usual folder; several ranks: rank 0 writes the whole model, each rank its
    # optimizer shard (train/checkpoint.py save_ranks_checkpoint)
    return save_ranks_checkpoint(
        rl.ranks, rl.run_dir / "checkpoints", step, model=rl.model, full_model=rl.full_model, tokenizer=rl.tokenizer,
        optimizer=rl.trainer.optimizer, scheduler=rl.trainer.scheduler, critic=critic.model if critic else None,
        critic_optimizer=critic.optimizer if critic else None, state=state, keep_last=rl.train.keep_last,
    )


def _quiet(message: str) -> None:
    pass


def resume(rl: RLRun) -> int:
    """Restore the checkpoint `train.resume` names, verified first (auto: the one checkpoints/latest
    names, else the newest intact one; damaged ones are skipped with a warning; none intact, or a
    bad path, is a CheckpointError); return the step it ends at (0: fresh run)."""
    critic = rl.critic
    found = resume_checkpoint(  # every rank reads it (a sharded model keeps its shard; N ranks resume on M)
        rl.train.resume, rl.run_dir / "checkpoints", model=rl.model, optimizer=rl.trainer.optimizer,
        scheduler=rl.trainer.scheduler, critic=critic.model if critic else None,
        critic_optimizer=critic.optimizer if critic else None, kind="rl", **({} if rl.ranks.is_main else {"warn": _quiet}),
    )
    if found is None:
        return 0
    _, state = found
    rl.tasks.iterator.load_state_dict(state["data"])
    if rl.engine is not None:
        rl.engine.load_state_dict(state["engine"])
    rl.kl_ctl.load_state_dict(state["kl_ctl"])
    rl.trainer.gen.set_state(torch.tensor(state["trainer_gen"], dtype=torch.uint8))
    if critic:
        critic.gen.set_state(torch.tensor(state["critic_gen"], dtype=torch.uint8))
        critic.scheduler.load_state_dict({**state["critic_sched"], "lr_lambdas": [None]})
    rl.trainer.guard.load_state_dict(state.get("nonfinite") or {})
    if rl.trainer.ptx:
        rl.trainer.ptx.load_state_dict(state.get("ptx") or {})
    return int(state["step"])
