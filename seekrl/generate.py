"""`seekrl generate`: play the tool agent loop against a chat endpoint and write the episodes.

    seekrl generate CONFIG generate.endpoint=http://127.0.0.1:8002/v1 generate.out=data/sft.jsonl
    seekrl generate CONFIG generate.endpoint=teacher      # the scripted teacher (data/teacher.py)

The loop is the text twin of workflows/tool_agent.py, for engines that take messages and give
text (any OpenAI-compatible `/v1/chat/completions`, or the scripted teacher):

    messages = task.prompt
    repeat (at most tools' max_turns tool turns, then one answer-only turn):
        text = engine.chat(messages, stop=format's stop strings)      -> trained segment
        parse text: answer -> done; calls -> run them with the real tools; invalid -> the
        format's invalid-action text                                  -> masked segment
        messages += [assistant text, user observation]

OpenAI endpoints cut the output before the stop string; the loop puts it back (the stop whose
opening tag is the last one open), so a segment always holds the whole call, as in RL.

Each finished episode is one JSON line, written and flushed as soon as it ends (so a killed run
loses nothing); when the run ends, both files are rewritten in task order (task, then sample),
so the same tasks give the same file whatever the concurrency:

    {"id", "sample", "source", "prompt": [messages], "segments": [{"text", "masked"}, ...],
     "answer", "meta", "reward", "reward_parts", "finish_reason", "metrics"}

`segments` is the completion as RL lays it out (search_r1: observations are inserted into the
assistant's own turn), so `seekrl sft` trains on exactly the tokens RL samples, with the
observations masked. Rows whose reward is below `generate.min_reward` (rejection sampling)
go to `<out>.rejected.jsonl` instead. Resumable: a rerun skips the (id, sample) pairs already
in either file and drops a torn last line. Engine errors are retried with backoff
(`generate.retries`); an episode that still fails is counted, not written, and the next
rerun tries it again. So is an episode a `judge` reward could not score (rewards/judge.py).

Reproducible: every request carries a seed derived from `train.seed`, the task id, the sample
and the turn (`seekrl.rollout.stable_seed`, as in RL rollouts). The scripted teacher draws its
flaws from it; OpenAI-compatible servers that honour `seed` (seekrl serve policy, vLLM, SGLang)
sample with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from seekrl.errors import ConfigError
from seekrl.rollout import stable_seed, turn_seed
from seekrl.schema import Range
from seekrl.types import MIN_TEMPERATURE, Task

__all__ = ["GenerateConfig", "GenerateRun", "ChatEngine", "OpenAIChatEngine", "EndpointError", "run_episode", "generate_rows", "run",
           "done_keys"]


_PROBABILITY = Range(ge=0, le=1, text="a probability in [0, 1]")


@dataclass
class GenerateConfig:
    """The `generate:` config section: `seekrl generate`'s endpoint, episodes and the scripted teacher."""

    endpoint: str = "teacher"
    """`seekrl generate`'s engine: an OpenAI-compatible base URL (http://127.0.0.1:8002/v1) or 'teacher' (the scripted teacher)."""
    model: str = "default"
    """Model name sent to the endpoint."""
    api_key_env: str | None = None
    """Environment variable holding the endpoint's API key (never the key itself)."""
    out: str | None = None
    """JSONL file the episodes are appended to (rows below min_reward go to <out>.rejected.jsonl); a rerun resumes."""
    n: int = 1
    """Episodes per task."""
    concurrency: int = 8
    """Episodes in flight at once."""
    retries: int = 3
    """Retries of a failed request (connection errors, HTTP 429 and 5xx), with exponential backoff."""
    timeout_s: Annotated[float, Range(gt=0, text="a finite number > 0 (seconds)")] = 120.0
    """Timeout of one endpoint request, in seconds."""
    temperature: Annotated[float, Range(ge=0, hint="0: greedy")] = 1.0
    """Sampling temperature sent to the endpoint."""
    min_reward: float | None = None
    """Keep only episodes whose reward is at least this (rejection sampling); none keeps all."""
    teacher_skip_search: Annotated[float, _PROBABILITY] = 0.2
    """Scripted teacher: probability of answering at once with a guess, without searching, on the half of the relations it is overconfident about."""
    teacher_stop_early: Annotated[float, _PROBABILITY] = 0.0
    """Scripted teacher: probability of guessing after the first of several needed paragraphs came back."""
    teacher_weak_query: Annotated[float, _PROBABILITY] = 0.2
    """Scripted teacher: probability of a weak first query for a paragraph (usually a miss)."""
    teacher_give_up: Annotated[float, _PROBABILITY] = 0.5
    """Scripted teacher: probability of guessing after a missed search instead of searching again."""
    teacher_quote: bool = False
    """Scripted teacher: after a paragraph it needs comes back, first quote the sentence stating the fact in `<think>` (a real dataset's task: the gold paragraphs' sentences that name the answer or the other gold title, or that its supporting facts mark)."""
    teacher_first_query: Literal["title", "question"] = "title"
    """Scripted teacher: its first search: title (the first gold paragraph's title) or question (the question itself; then the titles still missing)."""
    teacher_overconfident_kinds: list[str] | None = None
    """Scripted teacher: question kinds (meta kind, e.g. [1hop, 2hop]) whose relations it may be overconfident about; none: all."""

    def check(self) -> None:
        if self.n < 1 or self.concurrency < 1 or self.retries < 0:
            raise ConfigError("generate.n and generate.concurrency must be at least 1, generate.retries at least 0")
        if self.endpoint != "teacher" and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"generate.endpoint: '{self.endpoint}' is neither 'teacher' nor an http(s) base URL (http://127.0.0.1:8002/v1)")
        if 0 < self.temperature < MIN_TEMPERATURE:  # float32 cannot sample there: NaN log-probs
            raise ConfigError(f"generate.temperature: {self.temperature} is too small to sample with; use 0 (greedy) or at least {MIN_TEMPERATURE}")


class EndpointError(RuntimeError):
    """The endpoint refused or kept failing a request."""


class ChatEngine(Protocol):
    async def chat(self, messages: list[dict], *, stop=(), max_tokens: int = 256, temperature: float = 1.0,
                   seed: int | None = None) -> tuple[str, str]:
        """The next assistant turn: (text, finish_reason "stop" | "length"); `seed`, when given,
        makes the draw reproducible."""
        ...


class OpenAIChatEngine:
    """`/chat/completions` of an OpenAI-compatible server (seekrl serve policy, vLLM, SGLang, ...)."""

    def __init__(self, base_url: str, model: str = "default", api_key: str | None = None, *, timeout_s: float = 120.0,
                 retries: int = 3, backoff_s: float = 0.5, concurrency: int = 8):
        import httpx

        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.retries, self.backoff_s = model, retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout_s, limits=limits)
        self.requests = self.retried = 0

    async def chat(self, messages, *, stop=(), max_tokens=256, temperature=1.0, seed=None):
        import httpx

        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random()))
            self.requests += 1
            try:
                r = await self.client.post(self.url, json=body)
            except httpx.HTTPError as e:  # connection refused, timeout, reset: retry
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:  # a bad request does not get better by retrying
                raise EndpointError(f"{self.url} answered HTTP {r.status_code}: {r.text[:300]}")
            choice = r.json()["choices"][0]
            return choice["message"].get("content") or "", choice.get("finish_reason") or "stop"
        raise EndpointError(f"{self.url} failed {self.retries + 1} times; last: {last}")

    async def aclose(self) -> None:
        await self.client.aclose()


def _restore_stop(text: str, finish: str, stop) -> str:
    """Put back the stop string an OpenAI server cut off: the one whose opening tag is open last."""
    if finish != "stop" or not stop or any(text.endswith(s) for s in stop):
        return text
    best, at = None, -1
    for s in stop:
        if not (s.startswith("</") and s.endswith(">")):
            continue  # not a closing tag: nothing tells that it was cut
        # the opening tag may carry attributes: <call_tool name="search"> closes with </call_tool>
        opens = [m.start() for m in re.finditer("<" + re.escape(s[2:-1]) + r"[\s>]", text)]
        k = opens[-1] if opens else -1
        if k > at and s not in text[k:]:
            best, at = s, k
    return text + best if best else text


async def run_episode(task: Task, engine: ChatEngine, fmt, executor, *, max_turns: int = 4, max_tokens: int = 256,
                      temperature: float = 1.0, seed: int | None = None) -> dict:
    """One episode (module docstring): segments, finish reason and counts, without the reward.
    With `seed`, turn t asks the engine for seed + t."""
    from seekrl.tools.executor import EpisodeToolState

    messages = [dict(m) for m in task.prompt]
    segments: list[dict] = []
    state = EpisodeToolState()
    m = {"turns": 0, "tool_calls": 0, "valid_actions": 0, "invalid_actions": 0, "tool_errors": 0}
    finish = None
    for turn in range(max_turns + 1):
        final = turn == max_turns
        stop = fmt.answer_stop if final else fmt.stop
        kw = {} if seed is None else {"seed": turn_seed(seed, turn)}
        text, why = await engine.chat(messages, stop=stop, max_tokens=max_tokens, temperature=temperature, **kw)
        text = _restore_stop(text, why, stop)
        segments.append({"text": text, "masked": False})
        m["turns"] += 1
        parsed = fmt.parse(text)
        if parsed.answer is not None and not parsed.calls:
            m["valid_actions"] += 1
            finish = "answered"
            break
        if final:
            finish = "max_turns"
            break
        if parsed.invalid or not parsed.calls:
            m["invalid_actions"] += 1
            obs = fmt.invalid_text
        else:
            m["valid_actions"] += 1
            results = await executor.run_many(parsed.calls, state)
            m["tool_calls"] += len(results)
            m["tool_errors"] += sum(not r.ok for r in results)
            obs = fmt.observation_text(results)
        segments.append({"text": obs, "masked": True})
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]
    return {"segments": segments, "finish_reason": finish, "metrics": m}


def _read_keys(path: Path) -> set[tuple[str, int]]:
    """(id, sample) of the complete rows of `path`; a torn last line is cut off the file."""
    if not path.is_file():
        return set()
    keys, good = set(), 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not raw.endswith(b"\n"):
                break
            keys.add((str(row["id"]), int(row.get("sample", 0))))
            good += len(raw)
    if good < path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good)
    return keys


def _sort_rows(path: Path, order: dict) -> None:
    """Rewrite `path` with its rows in `order`'s order of (id, sample) (rows of other tasks last,
    as they were); atomic, and untouched when already in order."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.is_file() else []

    def rank(item):
        k, line = item
        row = json.loads(line)
        return order.get((str(row["id"]), int(row.get("sample", 0))), len(order) + k)

    ranked = sorted(enumerate(lines), key=rank)
    if [k for k, _ in ranked] == list(range(len(lines))):
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line for _, line in ranked), encoding="utf-8")
    tmp.replace(path)


def done_keys(out: str | os.PathLike) -> set[tuple[str, int]]:
    """The (task id, sample) pairs already written to `out` or its rejected file."""
    out = Path(out)
    return _read_keys(out) | _read_keys(out.with_name(out.stem + ".rejected.jsonl"))


@dataclass
class GenerateRun:
    """What `seekrl generate` runs on, assembled by seekrl.build.build_generate."""

    settings: GenerateConfig
    tasks: list[Task]
    engine: ChatEngine  # an OpenAI-compatible endpoint, or the scripted teacher
    fmt: Any  # the text tool-call format (tools/parsers.py)
    executor: Any  # ToolExecutor
    rubric: Any  # Scorer
    max_turns: int = 4  # rollout.max_turns
    max_tokens: int = 256  # rollout.max_new_tokens, per turn
    progress: bool = True
    seed: int | None = 0  # train.seed (None: no seeds sent)


async def generate_rows(g: GenerateRun) -> dict:
    """Run `generate.n` episodes per task (skipping finished ones) and append them to
    `generate.out`, then put it and its rejected file in task order; returns counts. `g.seed`
    None sends no seeds."""
    from tqdm import tqdm

    s = g.settings
    tasks, engine, fmt, executor, rubric, n, seed = g.tasks, g.engine, g.fmt, g.executor, g.rubric, s.n, g.seed
    out = Path(s.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_keys(out)
    todo = [(t, s) for t in tasks for s in range(n) if (t.id, s) not in done]
    counts = {"written": 0, "rejected": 0, "failed": 0, "already_done": len(tasks) * n - len(todo), "reward_sum": 0.0,
              "tool_calls": 0, "tool_errors": 0, "answered": 0}
    sem = asyncio.Semaphore(s.concurrency)
    first_error: list[str] = []
    bar = tqdm(total=len(todo), desc="generate", unit="episode", disable=not g.progress)
    with open(out, "a", encoding="utf-8") as kept, open(out.with_name(out.stem + ".rejected.jsonl"), "a", encoding="utf-8") as rej:

        async def one(task: Task, sample: int) -> None:
            async with sem:
                try:
                    ep = await run_episode(task, engine, fmt, executor, max_turns=g.max_turns, max_tokens=g.max_tokens,
                                           temperature=s.temperature,
                                           seed=None if seed is None else stable_seed(seed, task.id, sample))
                except EndpointError as e:
                    counts["failed"] += 1
                    first_error[:] = first_error or [str(e)]
                    bar.update(1)
                    return
            text = "".join(s["text"] for s in ep["segments"])
            r = await rubric.score(text, task, finish_reason=ep["finish_reason"])
            if r.unavailable:  # the judge could not score it: failed (not written, so a rerun scores it again), not rejected
                counts["failed"] += 1
                first_error[:] = first_error or [r.unavailable]
                bar.update(1)
                return
            row = {"id": task.id, "sample": sample, "source": task.source, "prompt": task.prompt, **ep,
                   "answer": task.answer, "meta": task.meta, "reward": r.total, "reward_parts": r.parts}
            keep = s.min_reward is None or r.total >= s.min_reward
            f = kept if keep else rej
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            f.flush()
            counts["written" if keep else "rejected"] += 1
            counts["reward_sum"] += r.total
            counts["tool_calls"] += ep["metrics"]["tool_calls"]
            counts["tool_errors"] += ep["metrics"]["tool_errors"]
            counts["answered"] += ep["finish_reason"] == "answered"
            bar.update(1)

        await asyncio.gather(*(one(t, s) for t, s in todo))
    bar.close()
    order = {(str(t.id), s): i for i, (t, s) in enumerate((t, s) for t in tasks for s in range(n))}
    for path in (out, out.with_name(out.stem + ".rejected.jsonl")):
        _sort_rows(path, order)
    finished = counts["written"] + counts["rejected"]
    counts["mean_reward"] = counts.pop("reward_sum") / max(1, finished)
    if first_error:
        counts["first_error"] = first_error[0]
    return counts


def run(g: GenerateRun) -> dict:
    """`seekrl generate`: the episodes of `generate.*` into `generate.out`; returns counts."""

    async def go():
        try:
            return await generate_rows(g)
        finally:
            if hasattr(g.engine, "aclose"):
                await g.engine.aclose()

    return asyncio.run(go())
