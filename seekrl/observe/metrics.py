"""Every metric a run writes to metrics.jsonl, and what it means.

docs/ARCHITECTURE.md's table of metrics is generated from `METRICS` (scripts/docs_tables.py), and
the integration tests check that every key their runs log is documented here (`undocumented`),
so the table cannot fall behind the code. A name may hold placeholders: `<part>` a reward part
(a rubric name, or `name/part` of a RewardResult), `<source>` a data source, `<kind>` a task's
meta kind, `<scope>` a source or kind, `<tool>` a tool name, `<k>` an integer, `<metric>` any
evaluation metric above it, `<status>` a trajectory status.
"""

from __future__ import annotations

import re

__all__ = ["METRICS", "MACHINE_PREFIXES", "documented", "undocumented", "reproducible"]

# name -> (written by, meaning)
METRICS: dict[str, tuple[str, str]] = {
    "step": ("all", "the step the row belongs to (0: before the first update)"),
    # rollout (train/rl.py)
    "reward/mean": ("rl", "mean reward of the step's trajectories (also /std /min /max)"),
    "reward/std": ("rl", "population std of the rewards"),
    "reward/min": ("rl", "lowest reward"),
    "reward/max": ("rl", "highest reward"),
    "reward/<part>": ("rl", "mean of one unweighted reward part (qa_em, search_r1/em, ...)"),
    "reward/<part>/spread_frac": ("rl", "fraction of trajectories in groups where that reward part differs: which part carries the group-relative signal (rollout/kept_frac: the total reward's)"),
    "reward/judge/rubric_items": ("rl", "judge reward: rubric items scored per trajectory (0 for tasks without rubrics)"),
    "reward/judge/item_<k>": ("rl", "judge reward: score of rubric item k (the row's order), mean over the step's trajectories (0 where the task has fewer items); each trajectory's own in its reward_parts"),
    "reward/<source>/mean": ("rl", "mean reward per data source, when the step mixes several"),
    "reward/<source>/em": ("rl", "exact match per data source, when the step mixes several and the rubric has an EM part (qa_em, or a <name>/em part such as search_r1/em)"),
    "response_len/mean": ("rl", "tokens after the prompt per trajectory, sampled and inserted (also /std /min /max)"),
    "response_len/std": ("rl", "std of response_len"),
    "response_len/min": ("rl", "shortest response"),
    "response_len/max": ("rl", "longest response"),
    "rollout/truncated_frac": ("rl", "fraction of trajectories cut by their token budget"),
    "rollout/turns": ("rl", "engine calls per episode (tool workflow; rollout.agent: model calls)"),
    "rollout/tool_calls": ("rl", "tool calls per episode"),
    "rollout/tool_calls/<tool>": ("rl", "calls of one tool per episode"),
    "rollout/tool_errors": ("rl", "tool calls that failed (error observation) per episode"),
    "rollout/valid_actions": ("rl", "well-formed turns (a call or the answer) per episode"),
    "rollout/invalid_actions": ("rl", "malformed turns per episode"),
    "rollout/obs_tokens": ("rl", "inserted observation tokens per episode"),
    "rollout/truncated_obs": ("rl", "observations cut to rollout.max_obs_tokens per episode"),
    "rollout/unmasked_inserted_tokens": ("rl", "inserted tokens trained on (rollout.mask_observations=false) per episode"),
    "rollout/prefix_breaks": ("rl", "rollout.trajectory=stepwise or rollout.agent: turns per episode whose prompt is not the previous prompt + the tokens since (the chat template re-rendered the history; an agent edited it)"),
    "rollout/branch_spread_frac": ("rl", "rollout.answer_branches > 1: the share of a step's trajectories in an episode's branch set (the episode and its branches) whose rewards differ: the answers read from one history that the group can tell apart"),
    "rollout/answer_branch": ("rl", "rollout.answer_branches > 1: the share of a step's trajectories that are branches of an episode's last turn (the other rollout/* means count them as trajectories too)"),
    "rollout/sampled_tokens": ("rl", "tokens the policy sampled per episode"),
    "rollout/response_len": ("rl", "tokens after the prompt per episode (the workflow's count)"),
    "rollout/truncated": ("rl", "single-turn: the completion hit max_new_tokens"),
    "rollout/kept_frac": ("rl", "algo.filter_zero_std: fraction of trajectories in groups with reward spread (algo.branch_credit=local: spread inside one of the group's answer-branch sets; algo.turn_advantage: or in the per-turn returns)"),
    "rollout/refill/rounds": ("rl", "rollout.refill: extra batches of the data order rolled out this step to replace groups without reward spread"),
    "rollout/refill/tasks": ("rl", "rollout.refill: tasks rolled out beyond the step's first batch"),
    "rollout/refill/repeats": ("rl", "rollout.refill: tasks drawn that the step already held (skipped, not rolled out twice)"),
    "rollout/refill/dropped_groups": ("rl", "rollout.refill: groups handed to the trainer without reward spread (algo.filter_zero_std drops them)"),
    "rollout/refill/dropped_frac": ("rl", "rollout.refill: dropped_groups over the groups handed to the trainer"),
    "rollout/refill/surplus": ("rl", "rollout.refill: groups of the last round after the batch was full (rolled out, neither trained nor logged)"),
    "rollout/refill/short": ("rl", "rollout.refill: informative groups missing from batch_size / group_size after rollout.max_refill_rounds (0: a full batch)"),
    "data/skip_flat/skipped": ("rl", "data.skip_flat: training tasks left out of the current epoch's order (their recent groups had no reward spread)"),
    "data/skip_flat/flat": ("rl", "data.skip_flat: training tasks whose groups had no reward spread in their last data.skip_flat rollouts in a row"),
    "data/skip_flat/full_epochs": ("rl", "data.skip_flat: epochs so far that left nothing out, because leaving out would have left less than one batch"),
    "data/skip_flat/capped_epochs": ("rl", "data.skip_flat: epochs so far whose left-out tasks were cut to keep the fraction data.skip_flat_keep of the training tasks"),
    "rollout/excluded/engine_error": ("rl", "trajectories left out because the engine failed their request (not learned from)"),
    "rollout/excluded/tool_unavailable": ("rl", "trajectories left out because a tool's server could not be reached"),
    "rollout/excluded/reward_unavailable": ("rl", "trajectories left out because a judge reward could not score them (refused, timeout, 5xx, unreadable replies after retries)"),
    "rollout/excluded/version_mismatch": ("rl", "trajectories left out for a token from a weight version the trainer did not publish"),
    "rollout/excluded/agent_error": ("rl", "rollout.agent: episodes left out because the agent raised, ran past rollout.agent_timeout_s or made no model call"),
    "rollout/agent_errors": ("rl", "rollout.agent: episodes whose agent raised (not after a spent budget) per episode"),
    "rollout/agent_timeouts": ("rl", "rollout.agent: episodes past rollout.agent_timeout_s, per episode"),
    "rollout/agent_budget_hits": ("rl", "rollout.agent: episodes that spent rollout.agent_max_calls or rollout.agent_max_tokens, per episode"),
    "rollout/excluded_frac": ("rl", "fraction of the step's trajectories left out for an infrastructure failure"),
    "mismatch/kl": ("rl", "k3 estimate of KL(engine || trainer) on fresh sampled tokens (0 when they agree)"),
    "mismatch/ratio_max": ("rl", "largest trainer / engine probability ratio on the compared tokens"),
    "mismatch/abs_diff_max": ("rl", "largest |engine - trainer| log-prob on the compared tokens"),
    "mismatch/disagree": ("rl", "1 when mismatch/kl passed train.agreement_max_kl this step (a warning is logged once)"),
    "mismatch/weight_mean": ("rl", "algo.mismatch: mean importance ratio (old / behaviour) before the cap"),
    "mismatch/truncated_frac": ("rl", "algo.mismatch=tis: fraction of sampled tokens whose weight was cut to algo.mismatch_cap"),
    "mismatch/masked_frac": ("rl", "algo.mismatch=mis: fraction of sampled tokens given weight 0 (0 with no correction)"),
    "rollout/staleness/mean": ("rl", "versions between the trained policy and the oldest sampled token, mean over trajectories"),
    "rollout/staleness/max": ("rl", "the same, max (<= rollout.max_staleness by construction)"),
    "rollout/interrupted": ("rl", "turns cut by a weight update and continued (async)"),
    "rollout/queue": ("rl", "finished groups waiting for a later step (async)"),
    "time/wait_s": ("rl", "seconds the trainer waited for the step's groups"),
    "time/rollout_s": ("rl", "seconds from asking for the batch to having it"),
    "time/step_s": ("rl, sft", "seconds of the whole step"),
    "time/logprobs_s": ("rl", "seconds of the step's scoring before the update: old (recomputed or checked), reference and teacher log-probs, values"),
    "time/update_s": ("rl", "seconds of the step's critic and policy updates (PPO-ptx's share included)"),
    "time/critic_s": ("rl", "PPO: seconds of the update spent on the critic's value-loss epochs (the rest of time/update_s is the policy's)"),
    "time/ptx_s": ("rl", "PPO-ptx: seconds of the update spent on the data.ptx examples' loss and backward"),
    "time/publish_s": ("rl", "seconds giving the engine the step's weights (a disk sync to servers; a version bump in-process)"),
    "time/eval_s": ("rl", "seconds of the step's evaluation (steps with eval/* only)"),
    "tokens/sampled": ("rl", "tokens sampled by the policy in the step"),
    "memory/rss_gib": ("rl, sft", "the process's resident memory at the end of the step, after glibc's free pages went back to the system (seekrl/memory.py; Linux only)"),
    "memory/trimmed_gib": ("rl, sft", "free pages glibc gave back at the end of the step (malloc_trim; 0 with other C libraries)"),
    "memory/peak_rss_gib": ("rl, sft, eval", "the process's most resident memory during the step (Linux's VmHWM, reset at each step's end; from the second step on): what sizes several runs at once (demo.seed_memory_gib); in `seekrl eval`'s eval.json, the eval process's peak, model loading included (an engine server's memory is its own)"),
    "epoch": ("rl, sft", "passes over the training tasks so far"),
    # the update (train/policy.py)
    "loss/policy": ("rl", "policy loss of the step (minibatch-weighted)"),
    "loss/kl": ("rl", "KL loss term (algo.kl_in=loss, algo.kl_coef > 0)"),
    "loss/ptx": ("rl", "PPO-ptx: token-mean cross-entropy of the step's data.ptx examples (algo.ptx_coef > 0; weighted by it in the loss)"),
    "ptx/tokens": ("rl", "PPO-ptx: trained tokens of the step's data.ptx examples"),
    "loss/value": ("rl", "PPO critic's clipped value loss"),
    "actor/clip_frac": ("rl", "fraction of trained tokens whose ratio was clipped"),
    "actor/clip_frac_low": ("rl", "clipped below 1 - clip_low"),
    "actor/clip_frac_high": ("rl", "clipped above 1 + clip_high"),
    "actor/dual_clip_frac": ("rl", "tokens under the dual clip (algo.dual_clip)"),
    "actor/approx_kl": ("rl", "mean 0.5 (log ratio)^2 of the trained tokens"),
    "actor/ratio_mean": ("rl", "mean importance ratio"),
    "actor/ratio_max": ("rl", "largest importance ratio"),
    "actor/behav_imp_weight/mean": ("rl", "decoupled PPO: mean proximal / behaviour weight (1 on-policy)"),
    "actor/behav_cap_frac": ("rl", "decoupled PPO: tokens dropped by algo.behav_imp_cap"),
    "critic/vf_clip_frac": ("rl", "PPO: values clipped by algo.value_clip"),
    "critic/value_mean": ("rl", "PPO: mean value"),
    "critic/returns_mean": ("rl", "PPO: mean return"),
    "critic/explained_var": ("rl", "PPO: explained variance of the returns"),
    "grad_norm/policy": ("rl", "policy gradient norm before clipping"),
    "grad_norm/critic": ("rl", "critic gradient norm before clipping"),
    "skipped_minibatches": ("rl", "minibatches with no trained token"),
    "train/skipped_rows": ("rl", "share of the update's rows left out because every trained token of theirs has advantage 0 (train.skip_zero_advantage; their gradient is 0)"),
    "entropy": ("rl", "mean entropy of the policy at the trained tokens (of the rows the update ran: train.skip_zero_advantage)"),
    "kl": ("rl", "mean KL(old || reference) per sampled token (per trained token when the update gives the old log-probs; approx_kl without a reference)"),
    "kl_coef": ("rl", "the KL coefficient this step (algo.kl_target moves it)"),
    "distill/reverse_kl": ("rl", "on-policy distillation: mean log p_student - log p_teacher per sampled token (algo.teacher; 0 when they agree)"),
    "lr": ("rl, sft", "learning rate this step"),
    "train/nonfinite_skipped": ("rl, sft", "1 when an update of the step was skipped for a nan/inf loss or gradient norm"),
    "train/nonfinite_skipped_total": ("rl, sft", "such steps over the run"),
    # remote engines (engines/remote.py)
    "engine/server_failures": ("rl", "servers marked dead (refused, timed out, 5xx)"),
    "engine/servers_alive": ("rl", "servers still in use"),
    "engine/weight_syncs": ("rl", "weight updates sent to the servers"),
    "engine/weight_sync_s": ("rl", "seconds spent in weight syncs, total"),
    "engine/requests": ("rl", "generate calls sent"),
    "engine/http_requests": ("rl", "HTTP requests (batched generate calls count once)"),
    "engine/retries": ("rl", "calls re-sent to another server"),
    "engine/paused_retries": ("rl", "requests sent again to a server that answered 503 while paused for a weight sync"),
    "engine/dropped_retries": ("rl", "requests sent again to the same server after the connection broke with no answer (a keep-alive connection it had just closed)"),
    "tools/<tool>/resent": ("rl", "requests a tool's retrieval client sent again after the connection broke with no answer, over the run (tools.retriever as a server URL)"),
    # SFT (train/sft.py)
    "loss": ("sft", "cross-entropy per trained (assistant) token"),
    "grad_norm": ("sft", "gradient norm before clipping"),
    "tokens/assistant": ("sft", "trained tokens in the step"),
    "tokens/s": ("sft", "tokens (trained or not) per second"),
    "eval/loss": ("sft", "cross-entropy per trained token on data.eval"),
    # evaluation (evaluate.py), also every eval.every steps of RL
    "eval/count": ("rl, eval", "tasks evaluated"),
    "eval/reward": ("rl, eval", "mean reward"),
    "eval/accuracy": ("rl, eval", "fraction correct (math: math_verify; QA: primary reward >= 0.5)"),
    "eval/em": ("rl, eval", "QA exact match of the final answer"),
    "eval/f1": ("rl, eval", "QA token F1 of the final answer"),
    "eval/pass@<k>": ("rl, eval", "unbiased pass@k over eval.n samples"),
    "eval/tool_calls": ("rl, eval", "tool calls per episode"),
    "eval/invalid_actions": ("rl, eval", "malformed turns per episode"),
    "eval/answer_rate": ("rl, eval", "episodes that ended with an answer"),
    "eval/well_formed": ("rl, eval", "episodes that ended with an answer after well-formed tool calls only"),
    "eval/response_len": ("rl, eval", "tokens after the prompt per episode"),
    "eval/<part>": ("rl, eval", "mean of one reward part"),
    "eval/excluded/<status>": ("rl, eval", "samples left out of the scores for an infrastructure failure (engine_error, tool_unavailable, reward_unavailable, agent_error)"),
    "eval/excluded_frac": ("rl, eval", "fraction of the samples left out for an infrastructure failure"),
    "eval/tools/<tool>/resent": ("rl, eval", "requests a tool's retrieval client sent again after the connection broke with no answer, during the eval"),
    "eval/<scope>/<metric>": ("rl, eval", "any of the above per data source (when several) and per task kind"),
}


def _pattern(name: str) -> re.Pattern:
    parts = {"part": r"[\w.:-]+(?:/[\w.:-]+)?", "source": r"[\w.:-]+", "kind": r"[\w.:-]+", "scope": r"[\w.:-]+", "status": r"\w+",
             "tool": r"[\w.:-]+", "k": r"\d+", "metric": r"[\w.:@-]+(?:/[\w.:-]+)?"}
    out = re.sub(r"<(\w+)>", lambda m: f"(?:{parts[m.group(1)]})", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
    return re.compile(f"^{out}$")


_PATTERNS = [_pattern(n) for n in METRICS]


def documented(key: str) -> bool:
    """Whether `key` is a metric of `METRICS` (placeholders filled in)."""
    return key in METRICS or any(p.match(key) for p in _PATTERNS)


def undocumented(keys) -> list[str]:
    """The keys of a metrics.jsonl row (or rows) that `METRICS` does not describe."""
    if isinstance(keys, dict):
        keys = keys.keys()
    return sorted({k for k in keys if not documented(k)})


MACHINE_PREFIXES = ("time/", "memory/")  # what the machine and its load decide, not the run's seed and data


def reproducible(row: dict) -> dict:
    """A metrics row without its seconds and memory (`MACHINE_PREFIXES`): what a resumed run, or
    the same run on another engine, must reproduce exactly."""
    return {k: v for k, v in row.items() if not k.startswith(MACHINE_PREFIXES)}
