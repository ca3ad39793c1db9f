"""The contracts between stages: Task → (engine) Completion → Trajectory → TrajectoryGroup.

These are the only objects that cross module boundaries in the RL step (DESIGN.md, Contracts).
Token ids are the source of truth: text is decoded from ids for rewards and logs, never
re-tokenized back into the training batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Task", "SamplingParams", "Completion", "Trajectory", "TrajectoryGroup", "MIN_TEMPERATURE"]


@dataclass(frozen=True)
class Task:
    """One prompt to roll out. The ground truth lives in `answer`, never in `prompt`."""

    id: str
    prompt: list[dict]  # chat messages [{"role": ..., "content": ...}]
    answer: Any  # ground truth: str, list of aliases, number
    source: str = "default"  # data set name, for per-source metrics
    meta: dict = field(default_factory=dict)

    def __hash__(self) -> int:  # prompt/meta are lists/dicts; identity is the id
        return hash((self.id, self.source))


MIN_TEMPERATURE = 1e-5  # below it (and above 0) logits / T leaves float32's range: NaN log-probs


@dataclass(frozen=True)
class SamplingParams:
    """How one engine call samples. `max_new_tokens` counts sampled tokens only. A temperature is 0
    (greedy) or at least MIN_TEMPERATURE (the servers and the config refuse what lies between)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop: tuple[str, ...] = ()  # stop strings; the stop string itself is kept in the output
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # extra token ids that end the completion (kept, like EOS)
    ignore_eos: bool = False  # keep sampling past EOS (benchmarks; SGLang's ignore_eos)
    seed_offset: int = 0  # draws of the seeded generator already used: a turn continued after an interruption draws as if uncut


@dataclass
class Completion:
    """One engine call: exactly the sampled tokens and their behaviour log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "abort"
    version: int  # policy version that sampled the first token
    versions: list[int] | None = None  # per-token versions when a weight update fell inside the call; None: all `version`

    def token_versions(self) -> list[int]:
        """The policy version of each sampled token."""
        return list(self.versions) if self.versions is not None else [self.version] * len(self.token_ids)


@dataclass
class Trajectory:
    """One episode. `completion_ids` are all tokens after the prompt, sampled and inserted.

    Layouts: prefix (`turn_prompts` None) trains the episode as one sequence, every turn's prompt
    being `prompt_ids + completion_ids` before it; stepwise (`turn_prompts` a list) trains one
    sample per turn (`steps()`): the exact ids the engine was given and the turn's sampled tokens,
    for chat templates that re-render earlier turns differently (thinking models drop `<think>`)."""

    task: Task
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]  # 1 = sampled by the policy, 0 = inserted (tool output, env text)
    logprobs: list[float]  # behaviour log-probs; 0.0 where loss_mask == 0
    versions: list[int]  # policy version per token; -1 where inserted
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    finish_reason: str = "answered"  # answered | max_turns | length | error
    metrics: dict[str, float] = field(default_factory=dict)
    text: str = ""  # decoded completion (derived from completion_ids, for rewards and logs)
    status: str = "ok"  # ok | engine_error | tool_unavailable | reward_unavailable | version_mismatch | agent_error: an infrastructure failure is excluded from the update, not learned from
    turn_spans: list[list[int]] = field(default_factory=list)  # [start, end) of each engine call's sampled tokens in completion_ids
    turn_prompts: list[list[int] | None] | None = None  # stepwise layout: each turn's prompt ids where they are not prompt_ids + completion_ids[:start] (None there); None: prefix layout
    turn_rewards: list[float] | None = None  # one reward per turn, when a reward function gives them (Rubric)
    temperature: float | None = None  # sampled at this temperature, not the run's (rollout.branch_temperature); the trainer scores it there
    branch_set: int | None = None  # rollout.answer_branches: its answer-branch set in the task's group (an episode and its branches share one); None: no branches
    shared_tokens: int = 0  # the set's episode: the leading completion tokens its branches share (masked in them); 0 otherwise (algo.branch_credit)

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n):
            raise ValueError(
                f"Trajectory {self.task.id}: completion_ids ({n}), loss_mask ({len(self.loss_mask)}), "
                f"logprobs ({len(self.logprobs)}) and versions ({len(self.versions)}) must have equal length"
            )
        if self.turn_prompts is not None and len(self.turn_prompts) != len(self.turn_spans):
            raise ValueError(f"Trajectory {self.task.id}: {len(self.turn_prompts)} turn prompts for {len(self.turn_spans)} turns")

    def append(self, ids: list[int], *, sampled: bool, logprobs: list[float] | None = None, version: int | list[int] = -1) -> None:
        """Append one segment, writing its mask at the moment it is appended (Habit 4). `version` is
        the policy version of the sampled tokens: one for all, or one per token (`Completion.token_versions`)."""
        self.completion_ids.extend(ids)
        if sampled:
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError("a sampled segment needs one log-prob per token")
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(logprobs)
            if isinstance(version, int):
                self.versions.extend([version] * len(ids))
            elif len(version) == len(ids):
                self.versions.extend(int(v) for v in version)
            else:
                raise ValueError("a sampled segment needs one version, or one per token")
        else:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
            self.versions.extend([-1] * len(ids))

    def append_turn(self, ids: list[int], *, logprobs: list[float], version: int | list[int] = -1,
                    prompt_ids: list[int] | None = None) -> None:
        """Append one engine call's sampled tokens (`append(sampled=True)`) and record its span. In the
        stepwise layout (`turn_prompts` not None) `prompt_ids` are the ids the engine was given; they are
        kept only where they are not `prompt_ids + completion_ids` so far (a re-rendered history)."""
        start = len(self.completion_ids)
        if self.turn_prompts is not None:
            p, n = self.prompt_ids, len(self.prompt_ids)
            same = prompt_ids is None or (len(prompt_ids) == n + start and prompt_ids[:n] == p and prompt_ids[n:] == self.completion_ids)
            self.turn_prompts.append(None if same else list(prompt_ids))
        self.append(ids, sampled=True, logprobs=logprobs, version=version)
        self.turn_spans.append([start, len(self.completion_ids)])

    @property
    def stepwise(self) -> bool:
        """Trained as one sample per turn (rollout.trajectory=stepwise), not as one sequence."""
        return self.turn_prompts is not None

    @property
    def num_turns(self) -> int:
        """Engine calls of the episode (1 for a trajectory that recorded none: one sequence)."""
        return max(1, len(self.turn_spans))

    def turn_prompt(self, k: int) -> list[int]:
        """The exact prompt ids turn k was sampled from."""
        stored = self.turn_prompts[k] if self.turn_prompts is not None else None
        return list(stored) if stored is not None else self.prompt_ids + self.completion_ids[: self.turn_spans[k][0]]

    def turn_index(self) -> list[int]:
        """The turn of each completion token: turn k's sampled tokens and what was inserted after them
        (up to turn k + 1) are k; 0 for all tokens of a trajectory that recorded no turns."""
        out = [0] * len(self.completion_ids)
        starts = [s for s, _ in self.turn_spans[1:]] + [len(out)]
        for k, (start, end) in enumerate(zip(starts[:-1], starts[1:]), start=1):
            out[start:end] = [k] * (end - start)
        return out

    def steps(self) -> list[Trajectory]:
        """The stepwise samples: one per turn, its prompt exactly the ids the engine was given and its
        completion the turn's sampled tokens; reward, status and finish reason are the episode's."""
        out = []
        for k, (a, b) in enumerate(self.turn_spans):
            out.append(Trajectory(
                task=self.task, prompt_ids=self.turn_prompt(k), completion_ids=self.completion_ids[a:b], loss_mask=self.loss_mask[a:b],
                logprobs=self.logprobs[a:b], versions=self.versions[a:b], reward=self.reward, reward_parts=self.reward_parts,
                finish_reason=self.finish_reason, status=self.status, turn_spans=[[0, b - a]],
            ))
        return out

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)


@dataclass
class TrajectoryGroup:
    """The G samples of one task: the unit of group baselines."""

    task: Task
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]
