"""Write rollouts to JSONL so a person (or a viewer) can read what the policy did.

One JSON object per trajectory, decoded from token ids (never the reverse):

    {"task_id", "source", "step", "group", "sample", "reward", "reward_parts",
     "finish_reason", "status", "metrics", "answer", "prompt", "completion",
     "segments": [{"text": ..., "masked": false}, {"text": <tool output>, "masked": true}, ...],
     "num_prompt_tokens", "num_completion_tokens", "num_sampled_tokens",
     "policy_versions": [the versions that sampled its tokens; several in async runs]}

With per-turn rewards the record has `turn_rewards`; a trajectory sampled at its own temperature
(an answer branch with rollout.branch_temperature) has `temperature`; with rollout.answer_branches
each row of an episode's set (it and its branches) has `branch_set`, the set's number in the
group; a stepwise trajectory (rollout.trajectory=stepwise) has `turn_prompts`: per turn, the
prompt the engine was given where it is not the prompt and completion before the turn (a
re-rendered history), else null.

`segments` are the maximal runs of equal loss_mask, each decoded on its own: `masked: true`
marks inserted text (tool output, environment text) that is excluded from the loss. Joined,
the segments give the completion text for tokenizers that decode token-by-token (byte-level
BPE may split a multi-byte character across a boundary; the ids remain the truth).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol, Sequence

from seekrl.types import Trajectory, TrajectoryGroup

__all__ = ["write_trajectories", "trajectory_record", "mask_runs", "Decoder"]


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


def mask_runs(loss_mask: Sequence[int]) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal mask as (start, end, masked) with masked = (mask value == 0)."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(loss_mask) + 1):
        if i == len(loss_mask) or bool(loss_mask[i]) != bool(loss_mask[start]):
            runs.append((start, i, not bool(loss_mask[start])))
            start = i
    return runs


def trajectory_record(traj: Trajectory, tokenizer: Decoder, **extra: Any) -> dict[str, Any]:
    """The JSON-able record of one trajectory (see the module docstring)."""
    ids = list(traj.completion_ids)
    segments = [
        {"text": tokenizer.decode(ids[a:b], skip_special_tokens=False), "masked": masked}
        for a, b, masked in mask_runs(traj.loss_mask)
    ]
    record = {
        "task_id": traj.task.id,
        "source": traj.task.source,
        **extra,
        "reward": float(traj.reward),
        "reward_parts": {k: float(v) for k, v in traj.reward_parts.items()},
        "finish_reason": traj.finish_reason,
        "status": traj.status,
        "metrics": dict(traj.metrics),
        "answer": str(traj.task.answer),
        "prompt": tokenizer.decode(list(traj.prompt_ids), skip_special_tokens=False),
        "completion": tokenizer.decode(ids, skip_special_tokens=False),
        "segments": segments,
        "num_prompt_tokens": len(traj.prompt_ids),
        "num_completion_tokens": len(ids),
        "num_sampled_tokens": int(sum(1 for m in traj.loss_mask if m)),
        # the policy versions that sampled its tokens (several when async generation was cut by updates)
        "policy_versions": sorted({int(v) for v, m in zip(traj.versions, traj.loss_mask) if m and v >= 0}),
    }
    if traj.turn_rewards is not None:
        record["turn_rewards"] = [float(r) for r in traj.turn_rewards]
    if traj.temperature is not None:
        record["temperature"] = float(traj.temperature)
    if traj.branch_set is not None:
        record["branch_set"] = int(traj.branch_set)
    if traj.turn_prompts is not None:
        record["turn_prompts"] = [None if p is None else tokenizer.decode(list(p), skip_special_tokens=False) for p in traj.turn_prompts]
    return record


def write_trajectories(
    path: str | os.PathLike,
    groups: Sequence[TrajectoryGroup],
    tokenizer: Decoder,
    max_groups: int | None = None,
    step: int | None = None,
    append: bool = False,
) -> int:
    """Write the trajectories of (the first `max_groups` of) `groups` to `path`; returns the count.

    `step`, when given, is stored in every record. The file is overwritten unless `append`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chosen = groups if max_groups is None else groups[:max_groups]
    count = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for g, group in enumerate(chosen):
            for s, traj in enumerate(group.trajectories):
                extra: dict[str, Any] = {"group": g, "sample": s}
                if step is not None:
                    extra = {"step": int(step), **extra}
                record = trajectory_record(traj, tokenizer, **extra)
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                count += 1
    return count
