"""Single-turn RLVR: one prompt, G sampled completions, each scored by the rubric.

The G samples of a task are submitted together, so the engine coalesces them (and those of the
other tasks of the step) into one batch. The trajectory's text is decoded from the sampled ids,
which stay the training tokens: nothing is re-tokenized.
"""

from __future__ import annotations

import asyncio

from seekrl.engines.base import InferenceEngine
from seekrl.errors import EngineRequestError
from seekrl.models import ChatPrompts
from seekrl.rewards.rubric import Rubric
from seekrl.rollout import episode_params
from seekrl.types import Completion, SamplingParams, Task, Trajectory, TrajectoryGroup

__all__ = ["SingleTurnWorkflow"]


class SingleTurnWorkflow:
    def __init__(self, tokenizer, params: SamplingParams, rubric: Rubric):
        self.tokenizer = tokenizer
        self.params = params
        self.rubric = rubric
        self._prompts = ChatPrompts(tokenizer)

    def prompt_ids(self, task: Task) -> list[int]:
        return self._prompts(task)

    def close(self) -> None:
        """Nothing to release (the tool executor's clients belong to the run)."""

    async def run(self, task: Task, engine: InferenceEngine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup:
        params = params or self.params
        prompt_ids = self.prompt_ids(task)
        completions = await asyncio.gather(*(_generate(engine, prompt_ids, p) for p in episode_params(params, task, n)))
        trajs = []
        for c in completions:
            t = Trajectory(task=task, prompt_ids=prompt_ids, completion_ids=[], loss_mask=[], logprobs=[], versions=[])
            if c is None:  # the engine failed this request: an infrastructure failure, left out of the update
                t.status, t.finish_reason = "engine_error", "error"
                trajs.append(t)
                continue
            t.append(c.token_ids, sampled=True, logprobs=c.logprobs, version=c.token_versions())
            t.text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            t.finish_reason = "length" if c.finish_reason == "length" else "answered"
            t.metrics = {"response_len": float(len(c.token_ids)), "truncated": float(c.finish_reason == "length")}
            trajs.append(t)
        results = await self.rubric.score_many(
            (t.text, task, {"num_tokens": len(t.completion_ids), "max_tokens": params.max_new_tokens, "finish_reason": t.finish_reason,
                            "status": t.status})
            for t in trajs
        )
        for t, r in zip(trajs, results):
            t.reward, t.reward_parts = r.total, r.parts
            if r.unavailable and t.status == "ok":  # the judge could not score it: left out of the update, counted, not scored 0
                t.status = "reward_unavailable"
        return TrajectoryGroup(task=task, trajectories=trajs)


async def _generate(engine: InferenceEngine, prompt_ids: list[int], params: SamplingParams) -> Completion | None:
    """One sample, or None when the engine failed the request (EngineRequestError). A dead engine
    (EngineUnavailable) still ends the run: nothing could be sampled."""
    try:
        return await engine.generate(prompt_ids, params)
    except EngineRequestError:
        return None
