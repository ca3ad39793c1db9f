"""Rewards from an LLM judge (`judge` in the rubric), and rubric items scored one by one (DR Tulu).

    reward:
      functions: [judge]
      judge_url: http://127.0.0.1:8002/v1        # seekrl serve policy, vLLM, SGLang, a hosted API
      judge_model: Qwen/Qwen3-8B
      judge_token_env: JUDGE_API_KEY             # the bearer token, from the environment

The judge is asked through any OpenAI-compatible `/v1/chat/completions` (rewards/judge_client.py:
retries with backoff, a concurrency limit, an on-disk cache). Per completion:

- **A task with rubric items** (a `rubrics` field of the data row, kept in `task.meta`; a
  `rubrics` key of a dict answer, as verl rows carry it in `reward_model.ground_truth`, also as a
  JSON string; or an answer that is a list of items, for rows with no other answer:
  `data.prompt_field=question data.answer_field=rubrics`): each
  item is one question to the judge, with the rubric template (`reward.judge_rubric_template`,
  `{rubric}` the item's text). The reward is the weighted mean of the item scores,
  Σ weight · score / Σ weight. Parts: `judge/rubric_items` (how many items) and `judge/item_<k>`
  (item k's score, in the row's order), logged as `reward/judge/...` and in each trajectory's
  `reward_parts`. Items are `{"text": ..., "weight": ...}` (`description` or `criterion` may stand
  for `text`, as DR Tulu's and RaR's rows name it; a `title` is put before the text; weight 1 when
  absent, otherwise a finite number > 0), or plain strings (weight 1); the field may hold them as
  a JSON string (parquet). A malformed item is a DataError naming the task.
- **Any other task:** one question, with `reward.judge_template` (default: is the response
  correct given the reference answer). The reward is the score.

Templates are text with placeholders `{name}`, filled in from the task and the completion:

    {question}    task.meta["question"] when the row kept one, else the last user message of the prompt
    {prompt}      every prompt message, as "role: content" lines
    {gold}        the gold answer(s): aliases joined by " | ", other values as JSON
    {response}    the final answer: the last <answer>...</answer> of the completion, else the whole completion
    {completion}  the whole completion text
    {rubric}      the rubric item's text (the rubric template only)
    {<field>}     any other field of the row (task.meta): text as it is, other values as JSON

`{{name}}` is a literal `{name}`; braces around anything that is not a name (JSON examples) are
kept as they are. A template names a file when it holds no `{` at all, else it is the text.
A placeholder the task lacks is a DataError naming the task (the step stops).

The score is read from the reply (`<think>...</think>` blocks removed first) by
`reward.judge_parser`:

    last_number   the last number in the reply (default; "Score: 7")
    first_number  the first number
    json          the last JSON object with a "score" key ({"score": 7})
    yes_no        the first word yes (1.0) or no (0.0); the score range does not apply
    match:REGEX   1.0 when the regular expression matches the reply, else 0.0 (a verdict: match:\\bCORRECT\\b)
    re:REGEX      group 1 of the last match is the number

A number is normalised from `reward.judge_score_range` [lo, hi] (default [0, 10]) to [0, 1]:
(x - lo) / (hi - lo); a number outside the range, or no number, is an unreadable reply, retried.

A judge that cannot answer (refused, timeout, 5xx, unreadable replies after the retries) raises
`RewardUnavailable`: the trajectory's status becomes `reward_unavailable` (left out of the update
and counted, never scored 0); rubric items are all or nothing. A trajectory whose status is
already not ok (`ctx["status"]`: an engine or tool failure, left out anyway) is not sent to the
judge: it gets 0.0 and no parts.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from seekrl.errors import ConfigError, DataError
from seekrl.rewards.base import RewardResult
from seekrl.rewards.judge_client import JudgeCache, JudgeClient
from seekrl.rewards.qa import extract_answer
from seekrl.types import Task

__all__ = ["make_judge_reward", "make_parser", "rubric_items", "has_rubric", "render", "template_fields", "read_template",
           "DEFAULT_TEMPLATE", "DEFAULT_RUBRIC_TEMPLATE", "PARSERS", "default_cache_dir"]

DEFAULT_TEMPLATE = """You are grading a response to a question against the reference answer.

Question:
{question}

Reference answer (any of these, separated by " | "):
{gold}

Response:
{response}

Does the response give the same answer as the reference? Wording may differ; extra correct detail is fine, a different or missing answer is wrong.
Give a score from 0 (wrong) to 10 (correct). End your reply with a line "Score: N"."""

DEFAULT_RUBRIC_TEMPLATE = """You are grading a response against one criterion of a rubric.

Question:
{question}

Response:
{response}

Criterion:
{rubric}

How well does the response meet this criterion? Judge this criterion only.
Give a score from 0 (not at all) to 10 (fully). End your reply with a line "Score: N"."""

PARSERS = ("last_number", "first_number", "json", "yes_no", "match:REGEX", "re:REGEX")
BUILTIN_FIELDS = ("question", "prompt", "gold", "response", "completion", "rubric")

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}|\{(\w+)\}")
# a number, not the part of a word ("Qwen3") or the denominator of "7/10"
_NUMBER = re.compile(r"(?<![\w./])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")


# ---- templates -------------------------------------------------------------------------------
def template_fields(template: str) -> set[str]:
    """The placeholders of a template (not the `{{escaped}}` ones)."""
    return {m.group(2) for m in _PLACEHOLDER.finditer(template) if m.group(2)}


def render(template: str, fields: dict[str, str], task_id: str = "?", key: str = "reward.judge_template") -> str:
    """The template with its placeholders filled in; a missing one is a DataError naming the task."""

    def fill(m: re.Match) -> str:
        if m.group(1):
            return "{" + m.group(1) + "}"
        name = m.group(2)
        if name not in fields:
            raise DataError(f"{key} uses {{{name}}}, which task {task_id} does not have; fields: {', '.join(sorted(fields))}")
        return fields[name]

    return _PLACEHOLDER.sub(fill, template)


def read_template(value: str | None, key: str, default: str) -> str:
    """A template setting: none -> `default`; a value without `{` -> the file it names; else the text."""
    if value is None:
        return default
    if "{" in value:
        return value
    path = Path(value).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}: '{value}' is neither a template (it has no {{placeholder}}) nor a readable file "
                          f"({type(e).__name__}: {e})") from None
    if "{" not in text:
        raise ConfigError(f"{key}: the template in {path} has no placeholder; use e.g. {{question}}, {{gold}}, {{response}}")
    return text


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _gold_text(answer: Any) -> str:
    if isinstance(answer, dict) and "target" in answer:
        answer = answer["target"]
    if isinstance(answer, dict):
        return _as_text({k: v for k, v in answer.items() if k != "rubrics"})
    if isinstance(answer, (list, tuple)):
        return " | ".join(str(a) for a in answer)
    return "" if answer is None else str(answer)


def task_fields(completion: str, task: Task) -> dict[str, str]:
    """What a template may use (module docstring), without `{rubric}`."""
    fields = {k: _as_text(v) for k, v in (task.meta or {}).items() if isinstance(k, str) and k.isidentifier()}
    users = [m.get("content") for m in task.prompt if m.get("role") == "user"]
    question = task.meta.get("question") if isinstance((task.meta or {}).get("question"), str) else None
    if question is None:
        question = _as_text(users[-1]) if users else ""
    answer = extract_answer(completion)
    fields.update(
        question=question,
        prompt="\n".join(f"{m.get('role')}: {_as_text(m.get('content'))}" for m in task.prompt),
        gold=_gold_text(task.answer),
        response=(answer if answer is not None else completion).strip(),
        completion=completion,
    )
    fields.pop("rubric", None)
    return fields


# ---- rubric items ----------------------------------------------------------------------------
def _raw_rubric(task: Task) -> Any:
    raw = (task.meta or {}).get("rubrics")
    if raw is not None:
        return raw
    answer = task.answer
    if isinstance(answer, str) and answer.lstrip().startswith("{"):
        try:
            answer = json.loads(answer)
        except ValueError:
            return None
    if isinstance(answer, dict):
        return answer.get("rubrics")
    if isinstance(answer, (list, tuple)) and answer and all(isinstance(a, dict) for a in answer):
        return answer  # the rubric is the answer field (data.answer_field=rubrics)
    return None


def has_rubric(task: Task) -> bool:
    """Whether the task carries rubric items (`rubric_items`), without checking them."""
    return bool(_raw_rubric(task))


def rubric_items(task: Task) -> list[tuple[str, float]]:
    """The task's rubric items as (text, weight) (module docstring); [] when it has none."""
    raw = _raw_rubric(task)
    if raw is None:
        return []
    where = f"task {task.id}: rubrics"
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise DataError(f"{where}: a string that is not JSON ({e})") from None
    if not isinstance(raw, (list, tuple)):
        raise DataError(f"{where}: expected a list of items, got {type(raw).__name__}")
    items = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            text, weight = item, 1.0
        elif isinstance(item, dict):
            text = next((item[k] for k in ("text", "description", "criterion") if isinstance(item.get(k), str)), None)
            if text is None:
                raise DataError(f"{where}[{i}]: no text; give {{\"text\": ..., \"weight\": ...}} (got keys {sorted(item)})")
            if isinstance(item.get("title"), str) and item["title"].strip():
                text = f"{item['title'].strip()}: {text}"
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
                raise DataError(f"{where}[{i}]: weight must be a finite number > 0, got {weight!r}")
        else:
            raise DataError(f"{where}[{i}]: expected an object {{\"text\", \"weight\"}} or a string, got {type(item).__name__}")
        if not text.strip():
            raise DataError(f"{where}[{i}]: the text is empty")
        items.append((text, float(weight)))
    return items


# ---- score parsers ---------------------------------------------------------------------------
def make_parser(spec: str, score_range: tuple[float, float] | list[float] = (0.0, 10.0)):
    """`parse(reply) -> float in [0, 1]` for a `reward.judge_parser` value (module docstring);
    ValueError for a spec it does not know. The parser raises ValueError on a reply it cannot read."""
    lo, hi = (float(x) for x in score_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"the score range must be two finite numbers [lo, hi] with lo < hi, got {list(score_range)}")

    def scaled(x: float, reply: str) -> float:
        if not (math.isfinite(x) and lo <= x <= hi):
            raise ValueError(f"score {x:g} is outside [{lo:g}, {hi:g}] in {_short(reply)}")
        return (x - lo) / (hi - lo)

    if spec in ("last_number", "first_number"):
        pick = -1 if spec == "last_number" else 0

        def number(reply: str) -> float:
            found = _NUMBER.findall(_visible(reply))
            if not found:
                raise ValueError(f"no number in {_short(reply)}")
            return scaled(float(found[pick]), reply)

        return number
    if spec == "json":
        def from_json(reply: str) -> float:
            for blob in reversed(_JSON_OBJECT.findall(_visible(reply))):
                try:
                    obj = json.loads(blob)
                except ValueError:
                    continue
                value = obj.get("score") if isinstance(obj, dict) else None
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return scaled(float(value), reply)
                if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
                    return scaled(float(value), reply)
            raise ValueError(f'no JSON object with a numeric "score" in {_short(reply)}')

        return from_json
    if spec == "yes_no":
        def yes_no(reply: str) -> float:
            m = _YES_NO.search(_visible(reply))
            if m is None:
                raise ValueError(f"neither yes nor no in {_short(reply)}")
            return 1.0 if m.group(1).lower() == "yes" else 0.0

        return yes_no
    if spec.startswith(("match:", "re:")):
        kind, _, pattern = spec.partition(":")
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"'{spec}': not a regular expression ({e})") from None
        if kind == "match":
            return lambda reply: 1.0 if rx.search(_visible(reply)) else 0.0
        if rx.groups < 1:
            raise ValueError(f"'{spec}': the regular expression needs a group around the number, e.g. re:Score: *(\\d+)")

        def regex(reply: str) -> float:
            found = [m.group(1) for m in rx.finditer(_visible(reply)) if m.group(1) is not None]
            if not found:
                raise ValueError(f"'{pattern}' does not match {_short(reply)}")
            try:
                return scaled(float(found[-1]), reply)
            except ValueError:
                raise ValueError(f"'{pattern}' captured {found[-1]!r}, not a number in range, in {_short(reply)}") from None

        return regex
    raise ValueError(f"unknown parser '{spec}'; one of {', '.join(PARSERS)}")


def _visible(reply: str) -> str:
    """The reply without its thinking: complete <think> blocks removed, an unclosed one cut off."""
    text = _THINK.sub(" ", reply)
    cut = text.find("<think>")
    return text if cut < 0 else text[:cut]


def _short(reply: str) -> str:
    text = " ".join(reply.split())
    return repr(text if len(text) <= 120 else "..." + text[-117:])


# ---- the reward ------------------------------------------------------------------------------
def make_judge_reward(url: str, model: str = "default", *, token: str | None = None, template: str | None = None,
                      rubric_template: str | None = None, parser: str = "last_number",
                      score_range: tuple[float, float] | list[float] = (0.0, 10.0), max_tokens: int = 512,
                      temperature: float = 0.0, concurrency: int = 16, retries: int = 3, backoff_s: float = 1.0,
                      timeout_s: float = 60.0, cache: str | Path | None = None):
    """The `judge` reward (module docstring): `await judge(completion, task, **ctx) -> RewardResult`.
    `template` / `rubric_template` are the texts (none: the defaults); `cache` a folder (none: no
    cache). The function's `client` is its JudgeClient (counters in `client.stats`)."""
    template = DEFAULT_TEMPLATE if template is None else template
    rubric_template = DEFAULT_RUBRIC_TEMPLATE if rubric_template is None else rubric_template
    if "rubric" in template_fields(template):
        raise ValueError("the judge template uses {rubric}, which only the rubric template (judge_rubric_template) has")
    if "rubric" not in template_fields(rubric_template):
        raise ValueError("the rubric template must show the item: put {rubric} in it")
    parse = make_parser(parser, score_range)
    client = JudgeClient(url, model, token=token, concurrency=concurrency, retries=retries, backoff_s=backoff_s, timeout_s=timeout_s,
                         max_tokens=max_tokens, temperature=temperature, cache=None if cache is None else JudgeCache(cache))

    async def judge(completion: str, task: Task, **ctx: Any) -> RewardResult:
        if ctx.get("status", "ok") != "ok":  # left out of the update anyway: do not pay for it
            return RewardResult(0.0)
        fields = task_fields(completion, task)
        items = rubric_items(task)
        if not items:
            prompt = render(template, fields, task.id, "reward.judge_template")
            return RewardResult(await client.ask([{"role": "user", "content": prompt}], parse))
        prompts = [render(rubric_template, {**fields, "rubric": text}, task.id, "reward.judge_rubric_template") for text, _ in items]
        scores = await asyncio.gather(*(client.ask([{"role": "user", "content": p}], parse) for p in prompts), return_exceptions=True)
        for s in scores:  # every item was asked (answers are cached); the first failure decides
            if isinstance(s, BaseException):
                raise s
        total = sum(w * s for (_, w), s in zip(items, scores)) / sum(w for _, w in items)
        parts = {"rubric_items": float(len(items)), **{f"item_{k}": float(s) for k, s in enumerate(scores)}}
        return RewardResult(total, parts)

    judge.client = client
    return judge


def default_cache_dir() -> Path:
    """Where the judge's cache lives unless reward.judge_cache says: $XDG_CACHE_HOME/seekrl/judge (~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seekrl" / "judge"
