"""The `rollout:` config section: how episodes are sampled (per turn and per episode), how many per
step, and whether the rollout runs in step with the trainer or alongside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range
from seekrl.types import MIN_TEMPERATURE, SamplingParams

__all__ = ["RolloutConfig", "sampling_params"]


@dataclass
class RolloutConfig:
    group_size: Annotated[int, Range(ge=1)] = 8
    """G: samples per task; the group is the baseline for GRPO/RLOO."""
    batch_size: Annotated[int, Range(ge=1)] = 64
    """Trajectories per RL step (tasks per step = batch_size / group_size)."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 256
    """Tokens the policy may sample per completion."""
    max_prompt_tokens: Annotated[int, Range(ge=1)] = 512
    """Longest prompt in tokens; longer tasks are skipped at load time and counted."""
    temperature: Annotated[float, Range(ge=0, hint="0: greedy")] = 1.0
    """Sampling temperature (the trainer recomputes log-probs at the same temperature)."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling threshold."""
    top_k: int = 0
    """Top-k sampling; 0 disables."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (kept in the output)."""
    engine_batch_size: Annotated[int, Range(ge=1)] = 64
    """Most sequences the local engine samples in one batch."""
    reuse_kv_tokens: Annotated[int, Range(ge=0, text=">= 0 (0: every turn prefills its whole history)")] = 0
    """In-process engine: keep the keys and values of finished requests, up to this many tokens, so the next turn of a multi-turn episode prefills only its new tokens (the tool output); emptied at every weight update (engines/prefix_kv.py)."""
    compile: Literal["auto", "true", "false"] = "auto"
    """Local engine decode: false (growing KV cache, eager) | true (static KV cache, torch.compile per shape bucket; falls back to eager with a warning) | auto (static KV cache; on CUDA a shape is compiled once it served 2048 decode steps, about where its ~47 s compile pays back; on CPU never compiled, where a 20-50 s compile per shape repays only after ~20k+ tokens)."""
    max_turns: int = 4
    """Tool turns per episode (with tools.format); then one last turn without tools."""
    max_obs_tokens: int = 512
    """Longest inserted tool output in tokens; longer ones keep their head and a truncation marker."""
    max_total_tokens: int = 1024
    """Tokens after the prompt per episode, sampled and inserted together (with tools.format)."""
    mask_observations: bool = True
    """Mask inserted tool output out of the loss; false is Search-R1's ablation (old log-probs are then recomputed)."""
    trajectory: Literal["prefix", "stepwise"] = "prefix"
    """How a multi-turn episode trains: prefix (one sequence; each turn's prompt is the previous prompt + the tokens since, never re-rendered) | stepwise (one sample per turn: the prompt exactly as the chat template rendered it for that turn, the turn's sampled tokens; for templates that rewrite earlier turns, e.g. thinking models that drop <think>). Episodes, not turns, form the group baseline."""
    answer_branches: Annotated[int, Range(ge=1)] = 1
    """Training rollout with tools.format (prefix layout): each episode that ends by its last turn's decision is sampled this many times from its state before that last engine call; the branches train only what they sampled, join the task's group, and share the history's KV cache (workflows/tool_agent.py). 1: off. Evaluation never branches."""
    branch_temperature: float | None = None
    """With rollout.answer_branches > 1: the temperature the branches sample at (the trainer scores each branch's tokens at it, the episodes' at rollout.temperature); none = rollout.temperature. Higher makes the answers read from one history differ more."""
    branch_from: Literal["turn", "answer"] = "turn"
    """With rollout.answer_branches > 1, where a branch starts: turn (the episode's last engine call again, from the state before it: the branch may answer otherwise or search again) | answer (after the opening tag of the episode's answer, copied: the branch samples only the answer's text, so the branches compare readings of one history and never train the choice between answering and searching; only episodes whose last turn opened an answer branch; text formats only)."""
    mode: Literal["sync", "async"] = "sync"
    """sync (roll out a batch, then train on it) | async (episodes keep running on the engine while the trainer steps; AReaL)."""
    max_staleness: Annotated[int, Range(ge=0, text=">= 0 (0 trains only on tokens of the current policy)")] = 2
    """Async: a batch is trained on only if every sampled token in it came from a policy at most this many versions older (AReaL's max_head_offpolicyness); 0 gives the sync results."""
    max_concurrent: int | None = None
    """Async: episodes in flight at once (a multiple of group_size is best); none = batch_size."""
    agent: str | None = None
    """An agent written against the OpenAI API, trained as it is: package.module:function (or path/to/agent.py:function), called as function(task, base_url, api_key, **agent_kwargs) once per episode with its own loopback endpoint (workflows/agent.py); none = seekrl's own workflows."""
    agent_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for rollout.agent (e.g. {retriever_url: ...})."""
    agent_max_calls: Annotated[int, Range(ge=1)] = 8
    """rollout.agent: model calls per episode; past it the endpoint answers 400 and the episode ends (finish_reason max_calls)."""
    agent_max_tokens: Annotated[int, Range(ge=1)] = 1024
    """rollout.agent: sampled tokens per episode over all its calls (finish_reason length past it)."""
    agent_timeout_s: Annotated[float, Range(gt=0)] = 300.0
    """rollout.agent: seconds per episode; an episode past it is left out of the update (status agent_error) and counted."""
    refill: bool = False
    """DAPO dynamic sampling with refill (sync; with algo.filter_zero_std=true): when fewer than batch_size / group_size of a step's groups have reward spread (usable trajectories only; with algo.branch_credit=local, spread inside one of their answer-branch sets; with algo.turn_advantage, per-turn returns that differ count too), roll out the next batches of the data order until they do, at most max_refill_rounds more; the step trains on exactly that many informative groups (the data position moves on by every task drawn)."""
    max_refill_rounds: Annotated[int, Range(ge=1)] = 4
    """rollout.refill: most extra batches (of batch_size / group_size tasks) one step may roll out; after them the step trains on the informative groups it has (rollout/refill/short counts the missing ones)."""

    @property
    def tasks_per_step(self) -> int:
        return self.batch_size // self.group_size

    def check(self) -> None:
        if self.batch_size % self.group_size:
            raise ConfigError(
                f"rollout.batch_size ({self.batch_size}) must be a multiple of rollout.group_size ({self.group_size}); "
                f"try rollout.batch_size={max(1, self.batch_size // self.group_size) * self.group_size}"
            )
        if 0 < self.temperature < MIN_TEMPERATURE:  # float32 cannot sample there: NaN log-probs
            raise ConfigError(f"rollout.temperature: {self.temperature} is too small to sample with; use 0 (greedy) or at least {MIN_TEMPERATURE}")
        if self.trajectory == "stepwise" and not self.mask_observations:
            raise ConfigError("rollout.trajectory=stepwise puts each tool output in the next turn's prompt, where it is never trained; "
                              "set rollout.mask_observations=true (or rollout.trajectory=prefix for the unmasked ablation)")
        if self.refill and self.mode != "sync":
            raise ConfigError("rollout.refill=true works with rollout.mode=sync only (an async step's groups were admitted "
                              "before they were scored); set rollout.mode=sync or rollout.refill=false")
        if self.refill and self.group_size * self.answer_branches < 2:
            raise ConfigError("rollout.refill=true needs rollout.group_size >= 2 (or rollout.answer_branches >= 2): "
                              "a group of one sample never has reward spread")
        if self.max_concurrent is not None and self.max_concurrent < self.group_size:
            raise ConfigError(f"rollout.max_concurrent ({self.max_concurrent}) must be at least rollout.group_size ({self.group_size}): "
                              "a task's G episodes start together; raise it or leave it unset (= rollout.batch_size)")


def sampling_params(r: RolloutConfig, temperature: float | None = None, seed: int | None = None) -> SamplingParams:
    """One turn's sampling parameters from `rollout.*` (`temperature`: another one, e.g. eval's)."""
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature if temperature is None else temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop=tuple(r.stop),
        seed=seed,
    )
