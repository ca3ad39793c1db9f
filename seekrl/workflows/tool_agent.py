"""Multi-turn tool use (Search-R1 / DR Tulu): the model writes a call, the tool's output is inserted.

One episode, tokens in and tokens out:

    prompt_ids = chat template(task.prompt)            (hermes: with the tools' schemas)
    repeat:
        c = engine.generate(prompt_ids + completion_ids, stop=fmt.stop, max_new_tokens=budget)
        append c.token_ids (sampled: loss_mask 1, the engine's log-probs and version)
        parse the decoded turn: answer -> done ("answered")
                                calls  -> run them concurrently, insert the observation
                                invalid -> insert the format's invalid-action text
        inserted ids: loss_mask 0, logprob 0.0, version -1

The next prompt is always exactly `prompt_ids + completion_ids`: sampled ids are never decoded
and re-encoded, only observations are encoded (parsers.py says how, per format).

Trajectory layouts (`trajectory`, rollout.trajectory)
- `prefix` (default): the episode trains as one sequence, each turn's prompt being the tokens
  before it, as above. With the hermes format the observations are rendered by the chat template
  as a continuation; that is only what the template would render for the whole conversation when
  the template never rewrites an earlier turn. Thinking models' templates (Qwen3, DeepSeek-R1)
  drop earlier `<think>` blocks, so the constructor renders a two-turn probe conversation
  (`HermesFormat.history_rewrite`) and refuses prefix mode for such a template with a one-line
  ConfigError that names `rollout.trajectory=stepwise`. The text formats (search_r1, dr_tulu)
  keep the whole episode in one assistant message the template never re-renders: no check.
- `stepwise`: every turn is its own training sample (`Trajectory.steps`). With the hermes
  format each turn's prompt is the chat template's rendering of the conversation so far (the
  task's messages, each turn's decoded text as an assistant message, the tool results as tool
  messages cut to `max_obs_tokens` tokens, or the invalid-action text as a user message), i.e.
  exactly what a chat deployment would send; the text formats keep `prompt_ids +
  completion_ids`. Each turn's prompt ids are recorded (`Trajectory.append_turn`: only where
  they differ from the concatenation; `metrics["prefix_breaks"]` counts those turns). The
  concatenated `completion_ids` are still built as in prefix mode: rewards, logs and
  `max_total_tokens` read them.

Rewards see the episode's text and `ctx["turns"]`: one `TurnContext` per engine call (the
turn's text, the tools it called and what they returned), for per-turn rewards
(rewards/base.py); the rubric's per-turn rewards land in `Trajectory.turn_rewards`.

Turns and budgets
- `max_turns` tool turns (a turn is one engine call; a turn cut at its `max_new_tokens` counts),
  then one last turn generated with only the answer stop strings; if it still does not answer,
  the episode ends with "max_turns" (Search-R1: `max_turns` loop steps, then a final rollout
  with `do_search=False`). So an episode has at most `max_turns + 1` engine calls.
- `params.max_new_tokens` is the per-turn budget; `max_total_tokens` bounds
  `len(completion_ids)`, observations included. Each turn gets `min(per-turn, remaining)`
  tokens. When nothing remains the episode ends with "length"; an observation that would not
  fit is truncated to what remains (nothing already appended is ever cut).
- An observation longer than `max_obs_tokens` keeps its head, then the ids of
  `TRUNCATION_MARKER` and of the format's closing text (e.g. `</information>\\n\\n`, or the
  template's end of tool turn + next assistant header for hermes), so it is at most
  `max_obs_tokens` long. (Search-R1 cuts the ids at `max_obs_length`, closing tag included.)
- finish_reason: answered | max_turns | length | error (the engine aborted the request).

`mask_observations=False` is Search-R1's ablation that trains on the retrieved tokens: inserted
ids are appended with loss_mask 1, but their logprobs are 0.0 and versions -1 — they were never
sampled, so the engine has no behaviour log-prob for them. Such trajectories carry
`metrics["unmasked_inserted_tokens"] > 0` and the trainer must recompute old log-probs in that
mode (`train.recompute_logprobs`); the 0.0 placeholders are not log-probs.

Answer branches (`answer_branches` K > 1, rollout.answer_branches; the training rollout only:
`with_answer_branches`, never evaluation). An episode's group comparison mixes what it searched
with how it read what it found. With K > 1, each episode that ended by its last turn's decision
(answered, or max_turns) is sampled K - 1 more times from its state before that last engine call
(same history, tool results and counters; own seeds `stable_seed(seed, "branch", j)`): each
branch goes on with the usual loop, so it usually answers in one call but may search again. A
branch trains only what it sampled after that point (the shared history is masked: logprob 0.0,
version -1); its reward is its own; it joins the task's group, so the baseline is taken over all
episodes and branches. The shared history trains once, in the first episode; every row of a
set carries `Trajectory.branch_set` and the episode `shared_tokens` (the history's length), so
that the trainer credits the history with the set's mean advantage (algo.branch_credit=mean)
or the episode's own (episode). With a branch temperature (rollout.branch_temperature) the branches sample
at it and carry it (`Trajectory.temperature`), and the trainer scores their tokens there. The
history's keys and values are reused for the branches (engines/prefix_kv.py serves a prompt
from a stored key that extends it). Each row carries
`metrics["answer_branch"]` (1 for a branch): `rollout/answer_branch` is the share of branch rows,
and `metrics["branch_spread_frac"]` (1 where the rewards of the row's set, the episode and its
branches, differ): `rollout/branch_spread_frac` is the share of rows whose answers from one
history did not all score the same, the comparisons the branches add. The other `rollout/*`
means are over rows, branches included. Tree-GRPO and ARPO branch
agent rollouts likewise; this branches only the last turn (the reading of what was found).

The G episodes of a group run concurrently, and each moves to its next turn as soon as its own
tools return (no batch-wide barrier; bench/rollout_multiturn.py measures the difference).
Tool failures are observations and counted metrics (executor.py), never exceptions; engine and
reward errors propagate.

Run the tests: `python -m pytest tests/integration/test_tool_agent.py tests/unit/test_parsers.py -q`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections import Counter

from seekrl.engines.base import InferenceEngine
from seekrl.errors import ConfigError, EngineRequestError
from seekrl.models import ChatPrompts, encode_chat
from seekrl.rewards.base import TurnContext
from seekrl.rewards.rubric import Rubric
from seekrl.rollout import episode_params, stable_seed, turn_seed
from seekrl.tools.executor import EpisodeToolState, ToolExecutor
from seekrl.tools.parsers import tail_text
from seekrl.types import SamplingParams, Task, Trajectory, TrajectoryGroup

__all__ = ["ToolAgentWorkflow", "encode_chat_with_tools", "check_prefix_template", "TRUNCATION_MARKER"]

TRUNCATION_MARKER = " ...[truncated]"


@dataclasses.dataclass
class _Fork:
    """An episode's loop state at the start of a turn: where an answer branch goes on from."""

    traj: Trajectory
    turns: list[TurnContext]
    state: EpisodeToolState
    calls: Counter
    m: Counter
    tool_turns: int
    sampled: int
    messages: list[dict] | None
    turn_prompt: list[int]

    def copy(self) -> _Fork:
        t = self.traj
        traj = dataclasses.replace(t, completion_ids=list(t.completion_ids), loss_mask=list(t.loss_mask), logprobs=list(t.logprobs),
                                   versions=list(t.versions), turn_spans=[list(x) for x in t.turn_spans],
                                   turn_prompts=None if t.turn_prompts is None else list(t.turn_prompts), metrics={})
        state = EpisodeToolState(Counter(self.state.calls), Counter(self.state.errors))
        return _Fork(traj, list(self.turns), state, Counter(self.calls), Counter(self.m), self.tool_turns, self.sampled,
                     None if self.messages is None else list(self.messages), list(self.turn_prompt))


def _check_branches(k: int, trajectory: str) -> None:
    if k < 1 or (k > 1 and trajectory != "prefix"):
        raise ValueError(f"answer_branches must be >= 1, and 1 unless trajectory='prefix' (got {k}, {trajectory!r})")


def encode_chat_with_tools(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """`encode_chat` with the tools' schemas given to the chat template (`tools=`)."""
    return encode_chat(tokenizer, messages, tools=tools)


class ToolAgentWorkflow:
    def __init__(
        self,
        tokenizer,
        params: SamplingParams,
        rubric: Rubric,
        fmt,
        executor: ToolExecutor,
        *,
        max_turns: int = 4,
        max_obs_tokens: int = 512,
        max_total_tokens: int = 2048,
        mask_observations: bool = True,
        tools_schema_in_prompt: bool | None = None,  # None: only for the hermes format
        trajectory: str = "prefix",  # prefix | stepwise (module docstring)
        answer_branches: int = 1,  # samples of each episode's last turn (module docstring; rollout.answer_branches)
    ):
        if max_turns < 0 or max_obs_tokens < 1 or max_total_tokens < 1:
            raise ValueError("max_turns must be >= 0, max_obs_tokens and max_total_tokens >= 1")
        if trajectory not in ("prefix", "stepwise"):
            raise ValueError(f"trajectory must be 'prefix' or 'stepwise', got {trajectory!r}")
        _check_branches(answer_branches, trajectory)
        if trajectory == "stepwise" and not mask_observations:
            raise ValueError("the stepwise layout puts observations in the next turn's prompt: they cannot be trained on (mask_observations=False)")
        self.tokenizer = tokenizer
        self.params = params
        self.rubric = rubric
        self.fmt = fmt
        self.executor = executor
        self.max_turns = max_turns
        self.max_obs_tokens = max_obs_tokens
        self.max_total_tokens = max_total_tokens
        self.mask_observations = mask_observations
        if tools_schema_in_prompt is None:
            tools_schema_in_prompt = fmt.name == "hermes"
        self.tools = executor.registry.schemas() if tools_schema_in_prompt and len(executor.registry) else None
        if self.tools and getattr(fmt, "tools", None) is None and hasattr(fmt, "tools"):
            fmt.tools = self.tools  # render observations with the same template context as the prompt
        self.eos_ids = {i for i in [tokenizer.eos_token_id] if i is not None}
        self._marker_ids = list(tokenizer.encode(TRUNCATION_MARKER, add_special_tokens=False))
        self._tail_ids = list(tokenizer.encode(tail_text(fmt, tokenizer), add_special_tokens=False))
        self._prompts = ChatPrompts(tokenizer, self.tools)
        self.trajectory = trajectory
        self.answer_branches = answer_branches
        self.branch_temperature: float | None = None  # with_answer_branches: the branches' own temperature
        self.branch_from = "turn"  # with_answer_branches: "turn" (the last turn again) | "answer" (only the answer's text)
        renders_turns = hasattr(fmt, "history_rewrite")  # hermes: observations rendered by the chat template
        self.rerender = trajectory == "stepwise" and renders_turns
        if trajectory == "prefix" and renders_turns:
            check_prefix_template(tokenizer, fmt)

    def prompt_ids(self, task: Task) -> list[int]:
        return self._prompts(task)

    def close(self) -> None:
        """Nothing to release (the tool executor's clients belong to the run)."""

    def metrics(self) -> dict[str, float]:
        """The tools' run-level counters (`tools/<name>/<counter>`), in every step's metrics."""
        return self.executor.metrics()

    def with_answer_branches(self, k: int, temperature: float | None = None, branch_from: str = "turn") -> ToolAgentWorkflow:
        """This workflow (same tools, rubric, format) sampling `k` versions of each episode's last
        turn (`branch_from="turn"`) or of its answer's text only (`"answer"`: after the format's
        `answer_open`, module docstring), the branches at `temperature` (None: the episode's); the
        run's training rollout uses it, its evaluation the workflow itself."""
        _check_branches(k, self.trajectory)
        if temperature is not None and not temperature > 0:
            raise ValueError(f"a branch temperature must be > 0 (got {temperature})")
        if branch_from not in ("turn", "answer"):
            raise ValueError(f"branch_from must be 'turn' or 'answer', got {branch_from!r}")
        if branch_from == "answer" and not getattr(self.fmt, "answer_open", None):
            raise ValueError(f"branch_from='answer' needs a format whose answer opens with a tag (search_r1, dr_tulu), not {self.fmt.name}")
        out = copy.copy(self)
        out.answer_branches, out.branch_temperature, out.branch_from = k, temperature, branch_from
        return out

    async def run(self, task: Task, engine: InferenceEngine, n: int, params: SamplingParams | None = None) -> TrajectoryGroup:
        params = params or self.params
        prompt_ids = self.prompt_ids(task)
        sets = await asyncio.gather(*(self._branched(task, engine, prompt_ids, p) for p in episode_params(params, task, n)))
        done = [d for ds in sets for d in ds]
        trajs = [t for t, _ in done]
        results = await self.rubric.score_many(
            (
                t.text,
                task,
                {"num_tokens": int(t.metrics["sampled_tokens"]), "max_tokens": self.max_total_tokens, "finish_reason": t.finish_reason,
                 "turns": turns, "status": t.status},
            )
            for t, turns in done
        )
        for t, r in zip(trajs, results):
            t.reward, t.reward_parts, t.turn_rewards = r.total, r.parts, r.turn_rewards
            if r.unavailable and t.status == "ok":  # the judge could not score it: left out of the update, counted, not scored 0
                t.status = "reward_unavailable"
        if self.answer_branches > 1:  # rollout/branch_spread_frac: rows of an episode's set (it and its branches) whose rewards differ
            for j, ds in enumerate(sets):
                spread = float(len(ds) > 1 and len({t.reward for t, _ in ds}) > 1)
                for t, _ in ds:
                    t.metrics["branch_spread_frac"] = spread
                    t.branch_set = j  # algo.branch_credit: the set's shared history is credited with the set's mean advantage
        return TrajectoryGroup(task=task, trajectories=trajs)

    async def _branched(self, task: Task, engine: InferenceEngine, prompt_ids: list[int],
                        params: SamplingParams) -> list[tuple[Trajectory, list[TurnContext]]]:
        """One episode, then (answer_branches > 1, the episode ok and ended by its last turn's
        decision: answered or max_turns) answer_branches - 1 more episodes that go on from its
        state before its last engine call, each trained only on what it sampled after that point."""
        traj, turns, last = await self._episode(task, engine, prompt_ids, params)
        out = [(traj, turns)]
        if self.answer_branches > 1:
            traj.metrics["answer_branch"] = 0.0  # rollout/answer_branch: the share of a step's rows that are branches
        if self.answer_branches < 2 or last is None or traj.status != "ok" or traj.finish_reason not in ("answered", "max_turns"):
            return out
        opening: list[int] = []  # branch_from="answer": the episode's last-turn tokens up to its answer's opening tag, copied
        if self.branch_from == "answer":
            opening = self._answer_opening(traj)
            if opening is None:  # its last turn opened no answer: nothing to read again
                return out
        seeds = [None if params.seed is None else stable_seed(params.seed, "branch", j) for j in range(1, self.answer_branches)]
        t = self.branch_temperature
        branch = [dataclasses.replace(params, seed=s, **({} if t is None else {"temperature": t})) for s in seeds]
        more = await asyncio.gather(*(self._episode(task, engine, prompt_ids, p, last, opening) for p in branch))
        shared = len(last.traj.completion_ids) + len(opening)
        traj.shared_tokens = shared
        for b, b_turns, _ in more:
            b.temperature = t  # scored at it by the trainer (None: the run's temperature)
            b.loss_mask[:shared] = [0] * shared  # the shared part trains once, in the first episode
            b.logprobs[:shared] = [0.0] * shared
            b.versions[:shared] = [-1] * shared
            b.metrics["answer_branch"] = 1.0
            out.append((b, b_turns))
        return out

    def _answer_opening(self, traj: Trajectory) -> list[int] | None:
        """The shortest head of the episode's last turn whose text contains the format's
        `answer_open` (e.g. `<answer>`), or None when the turn opened no answer."""
        start, end = traj.turn_spans[-1]
        ids = traj.completion_ids[start:end]
        opened = lambda j: self.fmt.answer_open in self.tokenizer.decode(ids[:j], skip_special_tokens=True)  # noqa: E731
        if not opened(len(ids)):
            return None
        lo, hi = 1, len(ids)  # a head that contains the tag stays so when longer: bisect for the shortest
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if opened(mid) else (mid + 1, hi)
        return ids[:lo]

    def truncate_observation(self, ids: list[int], limit: int) -> tuple[list[int], bool]:
        """At most `limit` ids: the head, the marker, the format's closing text (see module docstring)."""
        if len(ids) <= limit:
            return ids, False
        keep = limit - len(self._marker_ids) - len(self._tail_ids)
        if keep < 1:
            return ids[:limit], True
        return ids[:keep] + self._marker_ids + self._tail_ids, True

    def clip_text(self, text: str) -> str:
        """A tool result cut to at most `max_obs_tokens` tokens, marker included (a re-rendered tool message)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(ids) <= self.max_obs_tokens:
            return text
        keep = max(0, self.max_obs_tokens - len(self._marker_ids))
        return self.tokenizer.decode(ids[:keep], skip_special_tokens=True) + TRUNCATION_MARKER

    async def episode(self, task: Task, engine: InferenceEngine, prompt_ids: list[int], params: SamplingParams) -> Trajectory:
        """One episode (module docstring). Returns the trajectory without its reward."""
        return (await self._episode(task, engine, prompt_ids, params))[0]

    async def _episode(self, task: Task, engine: InferenceEngine, prompt_ids: list[int], params: SamplingParams,
                       fork: _Fork | None = None, opening: list[int] = ()) -> tuple[Trajectory, list[TurnContext], _Fork | None]:
        """One episode and what its turns did (the rewards' `ctx["turns"]`), and its state before
        its last engine call (None when it made none); from `fork`, the episode goes on from that
        state instead (answer branches), its first turn from `opening` (tokens given, not sampled:
        rollout.branch_from=answer)."""
        fmt, tok = self.fmt, self.tokenizer
        stepwise = self.trajectory == "stepwise"
        keep_fork = self.answer_branches > 1 and fork is None  # a branch is not branched again
        if fork is None:
            traj = Trajectory(task=task, prompt_ids=prompt_ids, completion_ids=[], loss_mask=[], logprobs=[], versions=[],
                              turn_prompts=[] if stepwise else None)
            m = Counter({k: 0 for k in ("turns", "tool_calls", "valid_actions", "invalid_actions", "tool_errors", "obs_tokens", "truncated_obs", "unmasked_inserted_tokens")})
            fork = _Fork(traj, [], EpisodeToolState(), Counter(), m, 0, 0, list(task.prompt) if self.rerender else None, prompt_ids)
        else:
            fork = fork.copy()
        last: _Fork | None = None
        traj, turns, state, calls, m = fork.traj, fork.turns, fork.state, fork.calls, fork.m
        messages = fork.messages  # stepwise: the conversation so far, re-rendered for each turn (fork.turn_prompt its rendering)
        finish = None
        while finish is None:
            remaining = self.max_total_tokens - len(traj.completion_ids)
            if remaining <= 0:
                finish = "length"
                break
            final = fork.tool_turns >= self.max_turns
            p = dataclasses.replace(
                params, stop=fmt.answer_stop if final else fmt.stop, max_new_tokens=min(params.max_new_tokens, remaining),
                seed=turn_seed(params.seed, m["turns"]),
            )
            given, opening = list(opening), ()  # a branch's copied answer opening: its first turn only
            if given:
                p = dataclasses.replace(p, max_new_tokens=min(params.max_new_tokens, remaining) - len(given))
            context = fork.turn_prompt if messages is not None else prompt_ids + traj.completion_ids + given
            if keep_fork:
                last = fork.copy()
            try:
                c = await engine.generate(context, p) if p.max_new_tokens > 0 else None
            except EngineRequestError:  # this request failed on the engine's side: not the policy's doing
                traj.status, finish = "engine_error", "error"
                break
            if c is None:  # no room after the opening: the episode ends as a cut turn would
                finish = "length"
                break
            if given:  # the opening sits in this turn, inserted (trained once, in the episode it was copied from)
                start = len(traj.completion_ids)
                traj.append(given, sampled=False)
                traj.append(list(c.token_ids), sampled=True, logprobs=list(c.logprobs), version=c.token_versions())
                traj.turn_spans.append([start, len(traj.completion_ids)])
            else:
                traj.append_turn(list(c.token_ids), logprobs=list(c.logprobs), version=c.token_versions(), prompt_ids=context if stepwise else None)
            m["turns"] += 1
            fork.sampled += len(c.token_ids)
            text = tok.decode(given + list(c.token_ids), skip_special_tokens=True)
            turns.append(TurnContext(text))
            if c.finish_reason == "abort":
                finish = "error"
                break
            parsed = fmt.parse(text)
            if parsed.answer is not None and not parsed.calls:
                if c.finish_reason == "length" and fmt.answer_requires_stop:
                    parsed = dataclasses.replace(parsed, answer=None, invalid=True, reason="turn cut at max_new_tokens")
                else:
                    m["valid_actions"] += 1
                    finish = "answered"
                    break
            if len(traj.completion_ids) >= self.max_total_tokens:
                finish = "length"
                break
            if final:
                finish = "max_turns"
                break
            fork.tool_turns += 1
            closed = bool(c.token_ids) and c.token_ids[-1] in self.eos_ids
            if parsed.invalid or not parsed.calls:
                m["invalid_actions"] += 1
                obs = fmt.invalid_observation(tok, closed=closed)
                said = [{"role": "user", "content": getattr(fmt, "invalid_text", "")}]
            else:
                m["valid_actions"] += 1
                results = await self.executor.run_many(parsed.calls, state)
                turns[-1] = TurnContext(text, tuple(r.name for r in results), tuple(r.text for r in results))
                for r in results:
                    calls[r.name if r.name in self.executor.registry else "unknown"] += 1
                    m["tool_errors"] += int(not r.ok)
                if any(r.error == "unavailable" for r in results):  # a tool's server is down: nothing to learn here
                    traj.status, finish = "tool_unavailable", "error"
                    break
                obs = fmt.observation(results, tok, closed=closed)
                said = [{"role": "tool", "name": r.name, "content": self.clip_text(r.text)} for r in results] if messages is not None else []
            obs, cut = self.truncate_observation(list(obs), self.max_obs_tokens)
            room = self.max_total_tokens - len(traj.completion_ids)
            if len(obs) > room:
                obs, cut = obs[:room], True
            m["truncated_obs"] += int(cut)
            m["obs_tokens"] += len(obs)
            turns[-1] = dataclasses.replace(turns[-1], shown=tok.decode(obs, skip_special_tokens=True))
            if self.mask_observations:
                traj.append(obs, sampled=False)
            else:
                traj.append(obs, sampled=True, logprobs=[0.0] * len(obs), version=-1)
                m["unmasked_inserted_tokens"] += len(obs)
            if messages is not None:  # stepwise: the next prompt is the template's rendering of the conversation
                messages += [{"role": "assistant", "content": text}, *said]
                fork.turn_prompt = encode_chat_with_tools(tok, messages, self.tools)
        m["tool_calls"] = sum(calls.values())
        if stepwise:
            m["prefix_breaks"] = sum(p is not None for p in traj.turn_prompts)
        traj.metrics = {k: float(v) for k, v in m.items()}
        traj.metrics.update({f"tool_calls/{k}": float(v) for k, v in calls.items()})
        traj.metrics["response_len"] = float(len(traj.completion_ids))
        traj.metrics["sampled_tokens"] = float(fork.sampled)
        traj.finish_reason = finish
        traj.text = tok.decode(traj.completion_ids, skip_special_tokens=True)
        return traj, turns, last


def check_prefix_template(tokenizer, fmt) -> None:
    """Refuse the prefix layout when the chat template rewrites earlier turns (module docstring)."""
    try:
        rewrite = fmt.history_rewrite(tokenizer)
    except Exception as e:  # a template that cannot render the probe conversation
        raise ConfigError(f"tools.format={fmt.name}: the chat template cannot render a tool conversation: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}") from e
    if rewrite is not None:
        raise ConfigError(f"the chat template rewrites earlier turns when it renders the next one ({rewrite}), so "
                          "rollout.trajectory=prefix would train on a context the model never sees at deployment; "
                          "set rollout.trajectory=stepwise")
