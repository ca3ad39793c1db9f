"""Converters: one data-set row (a dict) into a `Task`.

Each converter is `fn(row, index, template=None, *, source=None, id_field=None) -> Task`:
- `gsm8k_row`: `question` + `answer` ending in `#### <number>`; the answer is the number
  (commas removed), the worked solution goes to `meta["solution"]`.
- `math_row`: `problem` (MATH, MATH-500, AIME) + `answer`, or the last `\\boxed{}` of
  `solution`.
- `qa_row`: open-domain QA (NQ-open, TriviaQA, PopQA, 2Wiki, MuSiQue, HotpotQA,
  FlashRAG's `golden_answers`); the answer is always a list of aliases.
- `verl_row`: verl / Search-R1 rows (`data_source`, chat `prompt`, `reward_model`). The chat
  messages in the row ARE the prompt; a template is applied only when one is given.
- `fields_row`: any row, with the question and answer named by `prompt_field` / `answer_field`.

The ground truth never goes into the prompt: templates may use other row fields as
placeholders, never the answer fields. Everything else of the row is kept in `meta`.
`detect_converter` picks a converter from the shape of a row (used by `load_tasks`).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from seekrl.data.templates import PRESETS, PromptTemplate
from seekrl.errors import DataError
from seekrl.types import Task

__all__ = [
    "CONVERTERS",
    "detect_converter",
    "gsm8k_row",
    "math_row",
    "qa_row",
    "verl_row",
    "fields_row",
]


QUESTION_KEYS = ("question", "Question", "query", "problem")
ANSWER_KEYS = ("answer", "answers", "golden_answers", "Answer")
ID_KEYS = ("id", "_id", "unique_id")
# Fields that hold (or give away) the ground truth: never substituted into a prompt.
GROUND_TRUTH_KEYS = frozenset(
    ANSWER_KEYS
    + ("answer_aliases", "solution", "reward_model", "ground_truth", "target", "question_decomposition", "rubrics")
)


# ----------------------------------------------------------------------------- helpers


def _fields(row: dict) -> str:
    return ", ".join(map(str, row)) or "(none)"


def _require(row: dict, *names: str, hint: str = "") -> tuple[str, Any]:
    """The first of `names` present (and not None) in the row, else a DataError naming them."""
    for name in names:
        if row.get(name) is not None:
            return name, row[name]
    wanted = " or ".join(repr(n) for n in names)
    raise DataError(f"missing field {wanted}; the row has fields: {_fields(row)}{hint}")


def _task_id(row: dict, index: int, source: str, id_field: str | None) -> str:
    if id_field == "index":
        return f"{source}-{index}"
    if id_field is not None:
        if row.get(id_field) is None:
            raise DataError(f"missing id field {id_field!r} (data.id_field); the row has fields: {_fields(row)}")
        return str(row[id_field])
    for key in ID_KEYS:
        if row.get(key) is not None:
            return str(row[key])
    return f"{source}-{index}"


def _as_text(value: Any) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return str(value)


def _render(template: PromptTemplate | None, question: Any, row: dict) -> list[dict]:
    """Chat messages for `question`, filling other placeholders from the row (never the answer)."""
    template = template or PRESETS["plain"]
    extra = {}
    for name in template.fields:
        if name == "question":
            continue
        if name in GROUND_TRUTH_KEYS:
            raise DataError(
                f"prompt template uses {{{name}}}, which holds the ground truth; "
                f"the answer must never be part of the prompt"
            )
        if name in row:
            extra[name] = _as_text(row[name])
    return template.render(str(question), **extra)


def _meta(row: dict, used: tuple[str, ...]) -> dict:
    return {k: v for k, v in row.items() if k not in used}


def _aliases(value: Any) -> list[str]:
    """Answer aliases from a string, a list, or a TriviaQA-style {"value", "aliases"} dict."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        out = _aliases(value.get("value")) + _aliases(value.get("aliases"))
        return out or _aliases(value.get("target"))
    if isinstance(value, (int, float)):
        return [str(value)]
    try:
        items = list(value)  # lists, tuples, numpy arrays from parquet
    except TypeError:
        return [str(value)]
    return [a for v in items for a in _aliases(v)]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(s for s in (i.strip() for i in items) if s))


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, else None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
        # unbalanced (truncated) box: try the one before it
    return None


def _check_messages(prompt: Any) -> list[dict]:
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise DataError(f"field 'prompt' must be a non-empty list of chat messages, got {type(prompt).__name__}")
    messages = []
    for m in prompt:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"each prompt message needs 'role' and 'content', got {m!r:.120}")
        messages.append({"role": str(m["role"]), "content": str(m["content"])})
    return messages


# ----------------------------------------------------------------------------- converters


def gsm8k_row(
    row: dict, index: int, template: PromptTemplate | None = None, *, source: str | None = None, id_field: str | None = None
) -> Task:
    """GSM8K: `question` + `answer` (worked solution ending `#### 72`) -> answer "72"."""
    source = source or "gsm8k"
    _, question = _require(row, "question")
    _, solution = _require(row, "answer")
    solution = str(solution)
    if "####" not in solution:
        raise DataError("GSM8K field 'answer' has no '#### <number>' final line")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise DataError("GSM8K field 'answer' is empty after '####'")
    return Task(
        id=_task_id(row, index, source, id_field),
        prompt=_render(template, question, row),
        answer=answer,
        source=source,
        meta={"solution": solution, **_meta(row, ("question", "answer"))},
    )


def math_row(
    row: dict, index: int, template: PromptTemplate | None = None, *, source: str | None = None, id_field: str | None = None
) -> Task:
    """MATH / MATH-500 / AIME: `problem` + `answer`, else the last \\boxed{} of `solution`."""
    source = source or "math"
    qkey, question = _require(row, "problem", "question")
    answer = row.get("answer")
    if answer is None or str(answer).strip() == "":
        _, solution = _require(row, "answer", "solution")
        answer = _last_boxed(str(solution))
        if answer is None:
            raise DataError("no 'answer' field and no \\boxed{...} in field 'solution'")
    return Task(
        id=_task_id(row, index, source, id_field),
        prompt=_render(template, question, row),
        answer=str(answer).strip(),
        source=source,
        meta=_meta(row, (qkey, "answer")),
    )


def qa_row(
    row: dict, index: int, template: PromptTemplate | None = None, *, source: str | None = None, id_field: str | None = None
) -> Task:
    """Open-domain QA: the question and a list of answer aliases (NQ, TriviaQA, PopQA, ...)."""
    source = source or "qa"
    qkey, question = _require(row, "question", "Question", "query")
    akey, value = _require(row, *ANSWER_KEYS)
    answers = _unique(_aliases(value) + _aliases(row.get("answer_aliases")))
    if not answers:
        raise DataError(f"field {akey!r} holds no answer text (got {value!r:.80})")
    return Task(
        id=_task_id(row, index, source, id_field),
        prompt=_render(template, question, row),
        answer=answers,
        source=source,
        meta=_meta(row, (qkey, akey, "answer_aliases")),
    )


def verl_row(
    row: dict, index: int, template: PromptTemplate | None = None, *, source: str | None = None, id_field: str | None = None
) -> Task:
    """verl / Search-R1 rows: the chat `prompt` as is, `reward_model.ground_truth` as answer.

    Ground truth: Search-R1's `{"target": [...]}` becomes the alias list; a string that is
    exactly `", ".join(extra_info["answer"])` (how some exporters flatten an alias list)
    becomes that list; anything else is kept as it is. With a template, the prompt is
    re-rendered from `question` / `extra_info.question` / the last user message.
    """
    source = str(row.get("data_source") or source or "verl")
    _, prompt = _require(row, "prompt")
    _, reward_model = _require(row, "reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DataError(f"field 'reward_model' needs a 'ground_truth', got {reward_model!r:.120}")
    messages = _check_messages(prompt)
    extra = row.get("extra_info") or {}
    truth = reward_model["ground_truth"]
    if isinstance(truth, dict) and "target" in truth:
        answer: Any = _unique(_aliases(truth["target"]))
    elif isinstance(truth, str) and isinstance(extra, dict) and isinstance(extra.get("answer"), (list, tuple)):
        listed = [str(a) for a in extra["answer"]]
        answer = listed if ", ".join(listed) == truth else truth
    elif isinstance(truth, (str, int, float, dict)):
        answer = truth
    else:
        answer = _aliases(truth)  # numpy array / tuple from parquet -> list
    if template is not None:
        question = row.get("question") or (extra.get("question") if isinstance(extra, dict) else None)
        if question is None:
            users = [m["content"] for m in messages if m["role"] == "user"]
            question = users[-1] if users else messages[-1]["content"]
        messages = _render(template, question, row)
    meta = _meta(row, ("prompt", "reward_model", "data_source"))
    meta["reward_style"] = reward_model.get("style")
    return Task(id=_task_id(row, index, source, id_field), prompt=messages, answer=answer, source=source, meta=meta)


def fields_row(
    row: dict,
    index: int,
    template: PromptTemplate | None = None,
    *,
    source: str | None = None,
    id_field: str | None = None,
    prompt_field: str | None = None,
    answer_field: str | None = None,
) -> Task:
    """Any row: the question from `prompt_field`, the answer (as is) from `answer_field`.

    A prompt field that holds chat messages is used as the prompt directly.
    """
    source = source or "data"
    hint = " (set data.prompt_field=... and data.answer_field=...)"
    pkey, question = _require(row, *((prompt_field,) if prompt_field else QUESTION_KEYS), hint=hint)
    akey, answer = _require(row, *((answer_field,) if answer_field else ANSWER_KEYS), hint=hint)
    if isinstance(question, (list, tuple)) and question and isinstance(question[0], dict):
        prompt = _check_messages(question)
        if template is not None:
            raise DataError(f"field {pkey!r} already holds chat messages; do not also give a template")
    else:
        prompt = _render(template, question, row)
    if not isinstance(answer, (str, int, float, dict, list)):
        answer = _aliases(answer)
    return Task(
        id=_task_id(row, index, source, id_field),
        prompt=prompt,
        answer=answer,
        source=source,
        meta=_meta(row, (pkey, akey)),
    )


CONVERTERS: dict[str, Callable[..., Task]] = {
    "gsm8k": gsm8k_row,
    "math": math_row,
    "qa": qa_row,
    "verl": verl_row,
    "fields": fields_row,
}


def detect_converter(row: dict, prompt_field: str | None = None, answer_field: str | None = None) -> str:
    """The converter name for a row's shape; DataError naming the fields found if none fits."""
    if prompt_field or answer_field:
        return "fields"
    if isinstance(row.get("prompt"), (list, tuple)) and "reward_model" in row:
        return "verl"
    if "question" in row and isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return "gsm8k"
    if "problem" in row and ("answer" in row or "solution" in row):
        return "math"
    if any(k in row for k in ("question", "Question", "query")) and any(k in row for k in ANSWER_KEYS):
        return "qa"
    raise DataError(
        f"cannot tell what kind of row this is; it has fields: {_fields(row)}. Known shapes: "
        f"verl (prompt list + reward_model), gsm8k (question + answer with '####'), math "
        f"(problem + answer/solution), qa (question + answer/answers). Otherwise name the "
        f"fields: data.prompt_field=<field> data.answer_field=<field> "
        f"(or data.converter={'|'.join(CONVERTERS)})"
    )
