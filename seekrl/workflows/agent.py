"""Train an agent written against the OpenAI API as it is (`rollout.agent=package.module:function`).

    def run(task, base_url, api_key, **agent_kwargs):       # the user's code; imports nothing from seekrl
        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        reply = client.chat.completions.create(model="policy", messages=task["messages"])
        ...                                                  # tools, loops, sub-calls: its own business
        return reply.choices[0].message.content              # the final answer (or a reward, below)

Each episode gets its own base URL and key on a loopback endpoint served while the rollout runs
(agent_endpoint.py); every call samples from the policy being trained and is recorded token for
token (agent_record.py): the calls become one trajectory when each prompt extends the one before,
one sample per call otherwise, and only sampled tokens are trained. `task` is a plain dict:
`{"id", "messages", "source"}` (never the answer or other ground truth). A synchronous function
runs in its own thread (the stock client blocks); an `async def` one runs on the rollout's loop.

What the function returns:
- a string: the final answer, scored by the rubric (`reward.functions`) like a built-in episode;
- a number: the reward itself (`reward_parts["agent"]`);
- a dict with "answer" and/or "reward";
- None: the last call's reply is the final answer.

Bounds (rollout.agent_*): at most `agent_max_calls` calls and `agent_max_tokens` sampled tokens
per episode (the endpoint answers 400 past them, and the episode ends with finish_reason
max_calls or length, scored on what it has: the policy's doing, so it is learned from), and
`agent_timeout_s` seconds. An agent that raises for another reason, times out or makes no call
gets the status "agent_error": left out of the update and counted (`rollout/excluded/agent_error`),
like an engine failure; the first message of each kind is logged. Per-episode metrics:
`turns` (model calls), `prefix_breaks` (calls that did not extend the one before), `sampled_tokens`,
`agent_errors`, `agent_timeouts`, `agent_budget_hits`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from seekrl.engines.base import InferenceEngine
from seekrl.errors import ConfigError
from seekrl.models import ChatPrompts
from seekrl.rewards.base import TurnContext
from seekrl.rewards.rubric import Rubric
from seekrl.rollout import episode_params
from seekrl.types import SamplingParams, Task, Trajectory, TrajectoryGroup
from seekrl.workflows.agent_endpoint import AgentEndpoint, Session

__all__ = ["AgentWorkflow", "load_agent", "agent_task"]

log = logging.getLogger(__name__)


def load_agent(spec: str) -> Callable:
    """The function of `package.module:function` (or `path/to/file.py:function`); a one-line
    ConfigError naming what is wrong. A module not found on sys.path is looked for from the
    working directory too, as `python -m` would."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name.isidentifier():
        raise ConfigError(f"rollout.agent={spec!r}: write it as package.module:function (or path/to/agent.py:function)")
    try:
        if module_name.endswith(".py") or "/" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise ConfigError(f"rollout.agent={spec!r}: no file {path}")
            mod_spec = importlib.util.spec_from_file_location(f"seekrl_agent_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if os.getcwd() in sys.path or not (e.name and module_name.startswith(e.name)):
                    raise
                sys.path.insert(0, os.getcwd())
                module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"rollout.agent={spec!r}: cannot import {module_name}: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"rollout.agent={spec!r}: {module_name} has no function {name!r}")
    return fn


def agent_task(task: Task) -> dict:
    """What the agent is told about a task: no answer, no ground truth."""
    return {"id": task.id, "messages": [dict(m) for m in task.prompt], "source": task.source}


async def _call_agent(fn: Callable, args: tuple, kwargs: dict, timeout_s: float) -> Any:
    """Run the agent: an async function on this loop, a sync one in a daemon thread (a thread that
    outlives the timeout is abandoned; its endpoint refuses further calls)."""
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(*args, **kwargs), timeout_s)
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(method, value):
        if not future.done():
            getattr(future, method)(value)

    def target():
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # handed to the loop, raised there
            outcome = ("set_exception", e)
        else:
            outcome = ("set_result", result)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=target, name="seekrl-agent", daemon=True).start()
    return await asyncio.wait_for(future, timeout_s)


class AgentWorkflow:
    def __init__(self, tokenizer, params: SamplingParams, rubric: Rubric, agent: Callable, *, agent_kwargs: dict | None = None,
                 max_calls: int = 8, max_tokens: int = 1024, timeout_s: float = 300.0, trajectory: str = "prefix",
                 context: int | None = None, endpoint: AgentEndpoint | None = None):
        if max_calls < 1 or max_tokens < 1 or timeout_s <= 0:
            raise ValueError("max_calls and max_tokens must be >= 1 and timeout_s > 0")
        self.tokenizer = tokenizer
        self.params = params
        self.rubric = rubric
        self.agent = agent
        self.agent_kwargs = dict(agent_kwargs or {})
        self.max_calls, self.max_tokens, self.timeout_s = max_calls, max_tokens, timeout_s
        self.stepwise = trajectory == "stepwise"
        self.endpoint = endpoint or AgentEndpoint(tokenizer, context=context)
        self._prompts = ChatPrompts(tokenizer)
        self._logged: set[str] = set()

    def prompt_ids(self, task: Task) -> list[int]:
        """The task's messages through the chat template: what an agent that sends them first samples from."""
        return self._prompts(task)

    def close(self) -> None:
        self.endpoint.close()

    async def run(self, task: Task, engine: InferenceEngine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup:
        params = params or self.params
        done = await asyncio.gather(*(self._episode(task, engine, p) for p in episode_params(params, task, n)))
        trajs = [t for t, *_ in done]
        to_score = [(t, answer, turns) for t, answer, turns, reward in done if reward is None]
        results = await self.rubric.score_many(
            (answer, task, {"num_tokens": int(t.metrics["sampled_tokens"]), "max_tokens": self.max_tokens, "finish_reason": t.finish_reason,
                            "turns": turns, "status": t.status})
            for t, answer, turns in to_score
        )
        for (t, _, _), r in zip(to_score, results):
            t.reward, t.reward_parts, t.turn_rewards = r.total, r.parts, r.turn_rewards
            if r.unavailable and t.status == "ok":  # the judge could not score it: left out, counted, not scored 0
                t.status = "reward_unavailable"
        for t, _, _, reward in done:
            if reward is not None:
                t.reward, t.reward_parts = reward, {"agent": reward}
        return TrajectoryGroup(task=task, trajectories=trajs)

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("rollout.agent: %s (further ones are counted in rollout/agent_errors, not logged)", message)

    async def _episode(self, task: Task, engine: InferenceEngine, params: SamplingParams):
        """(trajectory, final answer, turn contexts, reward the agent returned or None)."""
        s: Session = self.endpoint.open(engine, asyncio.get_running_loop(), params, max_calls=self.max_calls, max_tokens=self.max_tokens)
        value, outcome = None, "ok"
        try:
            value = await _call_agent(self.agent, (agent_task(task), s.base_url, s.key), self.agent_kwargs, self.timeout_s)
        except asyncio.TimeoutError:
            outcome = "timeout"
        except Exception as e:
            outcome = "error"
            if s.budget_hit is None and s.failure is None:
                self._warn_once(f"{type(e).__name__}", f"the agent raised {type(e).__name__}: {' '.join(str(e).split())[:300]}")
        finally:
            self.endpoint.release(s)
        if s.fatal is not None:
            raise s.fatal
        calls = s.record.snapshot()
        answer, reward = _final(value, calls, self.tokenizer)
        status, finish = "ok", "answered"
        if s.failure:
            status, finish = s.failure, "error"
        elif outcome == "ok" or s.budget_hit:
            finish = s.budget_hit or "answered"
        elif outcome == "timeout":
            status, finish = "agent_error", "error"
            self._warn_once("timeout", f"an episode ran past rollout.agent_timeout_s={self.timeout_s:g} s")
        else:
            status, finish = "agent_error", "error"
        if not calls:
            if status == "ok":
                self._warn_once("no_calls", "an episode made no model call; there is nothing to train on")
            status, finish = ("agent_error" if status == "ok" else status), "error"
            traj = Trajectory(task=task, prompt_ids=self.prompt_ids(task), completion_ids=[], loss_mask=[], logprobs=[], versions=[])
        else:
            traj = s.record.trajectory(task, stepwise=self.stepwise)
        traj.status, traj.finish_reason, traj.text = status, finish, answer
        sampled = sum(len(c.token_ids) for c in calls)
        traj.metrics = {
            "turns": float(len(calls)), "sampled_tokens": float(sampled), "response_len": float(len(traj.completion_ids)),
            "prefix_breaks": float(sum(c.base != k - 1 for k, c in enumerate(calls) if k)),
            "agent_errors": float(outcome == "error" and status == "agent_error"), "agent_timeouts": float(outcome == "timeout"),
            "agent_budget_hits": float(s.budget_hit is not None),
        }
        turns = [TurnContext(self.tokenizer.decode(c.token_ids, skip_special_tokens=True)) for c in calls]
        return traj, answer, turns, (reward if status == "ok" else None)


def _final(value: Any, calls, tokenizer) -> tuple[str, float | None]:
    """(final answer text, reward or None) from what the agent returned (module docstring)."""
    last = tokenizer.decode(calls[-1].token_ids, skip_special_tokens=True) if calls else ""
    if isinstance(value, bool):
        value = float(value)
    if isinstance(value, (int, float)):
        return last, float(value)
    if isinstance(value, str):
        return value, None
    if isinstance(value, dict):
        answer = value.get("answer")
        reward = value.get("reward")
        return (str(answer) if answer is not None else last), (float(reward) if isinstance(reward, (int, float)) else None)
    return last, None
