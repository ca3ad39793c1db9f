"""Named, weighted reward functions: the registry and the `Rubric` that scores a completion.

A reward function is `fn(completion: str, task: Task, **ctx) -> float | RewardResult`, sync or
async. It reads the completion and `task.answer` / `task.meta`, never the prompt. `ctx` holds
what the rollout knows about the sample: `num_tokens` (sampled length), `max_tokens` (the
budget), `finish_reason`; a function ignores keys it does not use.

A `Rubric` is a list of reward names with weights. Each name is a registered reward (see
`REWARD_FUNCTIONS`), a dotted path "package.module:function" to a user function, or a callable.
`score` returns every part unweighted, keyed by name, and total = Σ weight · part. A function
that returns a `RewardResult` contributes its total as its part, and its own parts appear as
"name/part" (not counted again in the total). Errors propagate: a reward that raises fails the
score (with a note naming the reward), and a non-finite or non-numeric value is an error.

Parameters go to factories by name: `Rubric.from_names(["math", "cosine"], [1.0, 0.5],
cosine={"max_len": 512})`. Registered factories: format, tag_count, cosine, repetition,
overlong, search_r1, retrieved_gold_turn, retrieved_support_turn, judge (an LLM judge, rewards/judge.py: its params are
`make_judge_reward`'s, from `reward.judge_*` in `build_rubric`); a dotted path given params is
called with them and must return the reward function.

A judge that cannot answer raises `RewardUnavailable`; `score` then returns a result with
`unavailable` set instead of raising (rewards/base.py), and the workflow leaves the trajectory
out (status `reward_unavailable`).

Per-turn rewards (rewards/base.py): a function returning `RewardResult(..., turn_rewards=[...])`
contributes `weight · value` to each turn of the result's `turn_rewards` (None when no function
gives any); the count must match `ctx["turns"]`.
`cosine`'s `correct_fn` may be a reward name ("gsm8k") or a dotted path.

    rubric = Rubric.from_names(["qa_em", "format"], weights=[1.0, 0.2])
    result = await rubric.score("<think>..</think><answer>Paris</answer>", task, num_tokens=12)
    result.total, result.parts  # 1.2, {"qa_em": 1.0, "format": 1.0}
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from seekrl.errors import ConfigError, RewardUnavailable
from seekrl.rewards.base import RewardFn, RewardResult
from seekrl.rewards.config import RewardConfig
from seekrl.rewards.judge import DEFAULT_RUBRIC_TEMPLATE, DEFAULT_TEMPLATE, default_cache_dir, make_judge_reward, read_template
from seekrl.rewards.math import gsm8k_accuracy, math_accuracy
from seekrl.rewards.qa import qa_em, qa_f1, subem
from seekrl.rewards.search import make_retrieved_gold_turn_reward, make_retrieved_support_turn_reward, make_search_r1_reward
from seekrl.rewards.shaping import (
    boxed_reward,
    format_reward,
    make_cosine_length_reward,
    make_format_reward,
    make_repetition_penalty_reward,
    make_soft_overlong_reward,
    make_tag_count_reward,
    reasoning_steps_reward,
    tag_count_reward,
)
from seekrl.types import Task

__all__ = ["Rubric", "build_rubric", "register_reward", "resolve_reward", "REWARD_FUNCTIONS", "REWARD_FACTORIES"]


REWARD_FACTORIES: dict[str, Callable[..., RewardFn]] = {
    "format": make_format_reward,
    "tag_count": make_tag_count_reward,
    "cosine": make_cosine_length_reward,
    "repetition": make_repetition_penalty_reward,
    "overlong": make_soft_overlong_reward,
    "search_r1": make_search_r1_reward,
    "retrieved_gold_turn": make_retrieved_gold_turn_reward,
    "retrieved_support_turn": make_retrieved_support_turn_reward,
    "judge": make_judge_reward,  # an LLM judge over an OpenAI-compatible endpoint (rewards/judge.py); build_rubric gives its params
}

REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "math": math_accuracy,
    "gsm8k": gsm8k_accuracy,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "reasoning_steps": reasoning_steps_reward,
    "cosine": make_cosine_length_reward(),
    "repetition": make_repetition_penalty_reward(),
    "overlong": make_soft_overlong_reward(),  # budget and buffer from ctx max_tokens
    "qa_em": qa_em,
    "qa_f1": qa_f1,
    "subem": subem,
    "boxed": boxed_reward,
    "search_r1": make_search_r1_reward(),
    "retrieved_gold_turn": make_retrieved_gold_turn_reward(),  # per-turn: the first search turn that retrieved a gold answer
    "retrieved_support_turn": make_retrieved_support_turn_reward(),  # per-turn: each search's share of the needed paragraphs it found first
}


def register_reward(name: str, *, factory: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a reward function (or, with factory=True, a factory taking params) under `name`."""
    table = REWARD_FACTORIES if factory else REWARD_FUNCTIONS

    def decorator(fn: Callable) -> Callable:
        if table.get(name, fn) is not fn:
            raise ValueError(f"reward '{name}' is already registered ({table[name]!r})")
        table[name] = fn
        if factory:
            REWARD_FUNCTIONS.setdefault(name, _needs_params(name))
        return fn

    return decorator


def _needs_params(name: str) -> RewardFn:
    def missing(completion: str, task: Task, **ctx: Any) -> float:
        raise ValueError(f"reward '{name}' is a factory; give it params, e.g. Rubric.from_names(['{name}'], {name}={{...}})")

    return missing


REWARD_FUNCTIONS["judge"] = _needs_params("judge")  # its URL and model come from reward.judge_* (build_rubric)


def _import_path(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward path '{path}' must look like 'package.module:function'")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"reward path '{path}': module '{module_name}' has no '{attr}'") from None
    if not callable(obj):
        raise ValueError(f"reward path '{path}' is not callable")
    return obj


def _unknown(name: str) -> ValueError:
    known = sorted(REWARD_FUNCTIONS)
    msg = f"unknown reward '{name}'; known: {', '.join(known)} (or a 'package.module:function' path)"
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        msg += f"; did you mean '{close[0]}'?"
    return ValueError(msg)


def resolve_reward(name: str, params: dict | None = None) -> RewardFn:
    """The reward function for a registered name or a 'package.module:function' path, built with params if given."""
    if params is not None:
        params = dict(params)
        if isinstance(params.get("correct_fn"), str):  # cosine's correctness test, by name
            params["correct_fn"] = resolve_reward(params["correct_fn"])
    if ":" in name:
        obj = _import_path(name)
        return _build(name, obj, params) if params is not None else obj
    if params is not None:
        if name in REWARD_FACTORIES:
            return _build(name, REWARD_FACTORIES[name], params)
        if name in REWARD_FUNCTIONS:
            raise ValueError(f"reward '{name}' takes no params (factories: {', '.join(sorted(REWARD_FACTORIES))})")
        raise _unknown(name)
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    raise _unknown(name)


def _build(name: str, factory: Callable[..., RewardFn], params: dict) -> RewardFn:
    try:
        return factory(**params)
    except TypeError as e:
        raise ValueError(f"reward '{name}': bad params {params}: {e}") from e


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"reward '{name}' returned {type(value).__name__} {value!r}, not a number or RewardResult") from None
    if not math.isfinite(x):
        raise ValueError(f"reward '{name}' returned {x}")
    return x


async def _call(name: str, fn: RewardFn, completion: str, task: Task, ctx: dict) -> Any:
    try:
        out = fn(completion, task, **ctx)
        if inspect.isawaitable(out):
            out = await out
    except Exception as e:
        e.add_note(f"in reward '{name}' (task {task.id})")
        raise
    return out


def _add_turns(name: str, task: Task, acc: list[float] | None, values: list[float], turns) -> list[float]:
    """`acc` + one function's weighted per-turn rewards; as many as the episode has turns."""
    expected = len(turns) if turns is not None else (len(acc) if acc is not None else len(values))
    if len(values) != expected:
        raise ValueError(f"reward '{name}' returned {len(values)} turn rewards for an episode of {expected} turns (task {task.id}); "
                         "give one per ctx['turns'] entry")
    return values if acc is None else [a + v for a, v in zip(acc, values)]


def _first_error(results: list) -> None:
    for r in results:
        if isinstance(r, BaseException):
            raise r


class Rubric:
    """Weighted reward functions; `await score(completion, task, **ctx)` -> RewardResult."""

    def __init__(
        self,
        names: Iterable[str | RewardFn],
        weights: Iterable[float] | None = None,
        params: dict[str, dict] | None = None,
    ) -> None:
        names = list(names)
        if not names:
            raise ValueError("a Rubric needs at least one reward")
        self.weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(names):
            raise ValueError(f"{len(names)} rewards but {len(self.weights)} weights")
        params = dict(params or {})
        self.names: list[str] = []
        self.fns: list[RewardFn] = []
        registered = all(isinstance(entry, str) and ":" not in entry for entry in names)
        for entry in names:
            if callable(entry):
                key, fn = getattr(entry, "__name__", repr(entry)), entry
                if key in params:
                    fn = _build(key, entry, params[key])
            elif isinstance(entry, str):
                key, fn = entry, resolve_reward(entry, params.get(entry))
            else:
                raise TypeError(f"reward entries are names or callables, got {entry!r}")
            if key in self.names:
                raise ValueError(f"reward '{key}' appears twice in the rubric")
            self.names.append(key)
            self.fns.append(fn)
        unused = sorted(set(params) - set(self.names))
        if unused:
            raise ValueError(f"params given for rewards not in the rubric: {unused}; rubric: {self.names}")
        # Whether a function gives per-turn rewards: True when one declares it (`fn.per_turn`), False
        # when every function is a registered one that does not, None when a user's function might.
        self.per_turn: bool | None = True if any(getattr(fn, "per_turn", False) for fn in self.fns) else (False if registered else None)

    def unscorable(self, tasks: Iterable[Task]) -> list[tuple[str, str]]:
        """(name, what) of each function that declares what a task must carry for it to score
        anything (`fn.needs = (predicate(task) -> bool, what)`) and that no task of `tasks` carries."""
        tasks = list(tasks)
        return [(name, fn.needs[1]) for name, fn in zip(self.names, self.fns)
                if getattr(fn, "needs", None) and not any(fn.needs[0](t) for t in tasks)]

    @classmethod
    def from_names(
        cls, names: Iterable[str | RewardFn], weights: Iterable[float] | None = None, **params: dict
    ) -> Rubric:
        """`Rubric.from_names(["math", "cosine"], [1, 0.5], cosine={"max_len": 512})`."""
        return cls(names, weights, params)

    async def score(self, completion: str, task: Task, **ctx: Any) -> RewardResult:
        """All parts (unweighted, by name) and total = Σ weight · part; per-turn rewards, when some
        function gives them, Σ weight · turn reward per turn (one per `ctx["turns"]`). Errors propagate,
        except `RewardUnavailable` (a judge that cannot answer): then the result's `unavailable` says
        why, its total is 0.0 and its parts are those of the other functions."""
        outs = await asyncio.gather(
            *(_call(n, fn, completion, task, ctx) for n, fn in zip(self.names, self.fns)), return_exceptions=True
        )
        unavailable = [f"{name}: {out}" for name, out in zip(self.names, outs) if isinstance(out, RewardUnavailable)]
        _first_error([out for out in outs if not isinstance(out, RewardUnavailable)])
        parts: dict[str, float] = {}
        total = 0.0
        turn_total: list[float] | None = None
        for name, weight, out in zip(self.names, self.weights, outs):
            if isinstance(out, RewardUnavailable):
                continue
            sub: dict[str, float] = {}
            turns = None
            if isinstance(out, RewardResult):
                sub, turns, out = out.parts, out.turn_rewards, out.total
            value = _as_float(name, out)
            parts[name] = value
            for k, v in sub.items():
                parts[f"{name}/{k}"] = _as_float(f"{name}/{k}", v)
            total += weight * value
            if turns is not None:
                turn_total = _add_turns(name, task, turn_total, [weight * _as_float(f"{name} (turn reward)", v) for v in turns],
                                        ctx.get("turns"))
        if unavailable:
            return RewardResult(total=0.0, parts=parts, unavailable="; ".join(unavailable))
        return RewardResult(total=total, parts=parts, turn_rewards=turn_total)

    async def score_many(self, items: Iterable[tuple]) -> list[RewardResult]:
        """Score (completion, task) or (completion, task, ctx_dict) items concurrently, in order."""
        coros = []
        for item in items:
            completion, task, *rest = item
            ctx = rest[0] if rest else {}
            coros.append(self.score(completion, task, **ctx))
        results = await asyncio.gather(*coros, return_exceptions=True)
        _first_error(results)
        return results

    def __repr__(self) -> str:
        return "Rubric(" + ", ".join(f"{n}={w:g}" for n, w in zip(self.names, self.weights)) + ")"


def build_rubric(r: RewardConfig, max_new_tokens: int) -> Rubric:
    """The rubric of `reward.*`; the length-aware rewards (cosine, overlong) measure against
    `max_new_tokens` (rollout.max_new_tokens) unless their own keys say otherwise. An unknown
    reward is a one-line ConfigError (did-you-mean)."""
    params: dict[str, dict] = {}
    if "repetition" in r.functions:
        params["repetition"] = {"ngram_size": r.repetition_ngram, "max_penalty": r.repetition_max_penalty}
    if "cosine" in r.functions:
        params["cosine"] = {"max_len": r.cosine_max_len or max_new_tokens}
    if "overlong" in r.functions:
        buffer = r.overlong_buffer or max_new_tokens // 4
        params["overlong"] = {"max_tokens": max_new_tokens, "buffer": buffer}
    if "judge" in r.functions:
        params["judge"] = _judge_params(r)
    if "search_r1" in r.functions and r.search_r1_partial != "none":
        params["search_r1"] = {"partial": r.search_r1_partial, "partial_weight": r.search_r1_partial_weight}
    try:
        return Rubric(r.functions, r.weights, params)
    except ConfigError:  # already names its key (reward.judge_cache, ...)
        raise
    except (ValueError, ImportError) as e:
        raise ConfigError(f"reward.functions: {e}") from None


def _judge_params(r: RewardConfig) -> dict:
    """`make_judge_reward`'s arguments from the `reward:` section: the templates read, the token
    taken from its environment variable (unset: ConfigError), the cache folder resolved."""
    if not r.judge_url:
        raise ConfigError("reward.functions has judge but reward.judge_url is not set; give the judge's OpenAI-compatible base URL "
                          "(e.g. http://127.0.0.1:8002/v1)")
    token = None
    if r.judge_token_env:
        token = os.environ.get(r.judge_token_env)
        if not token:
            raise ConfigError(f"reward.judge_token_env: the environment variable {r.judge_token_env} is not set; export it or drop the key")
    template = read_template(r.judge_template, "reward.judge_template", DEFAULT_TEMPLATE)
    rubric_template = read_template(r.judge_rubric_template, "reward.judge_rubric_template", DEFAULT_RUBRIC_TEMPLATE)
    cache = r.judge_cache
    return {
        "url": r.judge_url, "model": r.judge_model, "token": token, "template": template, "rubric_template": rubric_template,
        "parser": r.judge_parser, "score_range": list(r.judge_score_range), "max_tokens": r.judge_max_tokens,
        "temperature": r.judge_temperature, "concurrency": r.judge_concurrency, "retries": r.judge_retries,
        "backoff_s": r.judge_backoff_s, "timeout_s": r.judge_timeout_s,
        "cache": None if cache is False or cache == "off" else Path(cache).expanduser() if isinstance(cache, str) and cache else default_cache_dir(),
    }
