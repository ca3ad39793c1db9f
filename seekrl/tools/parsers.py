"""Tool-call formats: how a turn's text becomes calls or an answer, and results become tokens.

Each format has `name`, `stop` (the stop strings of a tool turn), `answer_stop` (those of the
last, tool-less turn), `parse(turn_text) -> Parsed`, `observation(results, tokenizer) -> ids`,
`invalid_observation(tokenizer) -> ids` and `tail` (the text that closes an observation, kept
when the workflow truncates a long one). The text formats' `answer_open` is the text that opens an
answer (answer branches from it: rollout.branch_from=answer; hermes has none). The text formats (search_r1, dr_tulu) also have
`observation_text(results)` and `invalid_text`: the same observations as text, for the loop
that talks to chat endpoints (seekrl/generate.py). Observation ids are encoded with
`tokenizer.encode(text, add_special_tokens=False)`; they are inserted tokens. The turn's own
ids were sampled and are never re-encoded: `parse` only reads their decoded text.

- `search_r1` (Search-R1, Jin et al. 2025; their `search_r1/llm_agent/generation.py`,
  `postprocess_predictions` / `execute_predictions`): the first `<(search|answer)>(.*?)</\\1>`
  of the turn (re.DOTALL) is the action and its stripped content the query or the answer. The
  observation is `"\\n\\n<information>{result.strip()}</information>\\n\\n"`, an invalid action
  gets `INVALID_SEARCH_R1`, verbatim. Departure: an empty query is invalid here (Search-R1
  sends it to the retriever).
- `dr_tulu`: `<call_tool name="search" k="v">query</call_tool>`; the attributes are the
  arguments (besides `name`), the stripped body is the "query" argument (the "url" argument
  of the tools in `BODY_ARGS`: `<call_tool name="fetch_page">https://...</call_tool>`). Observation
  `"\\n<tool_output>{text}</tool_output>\\n"`, answer in `<answer>...</answer>`.
- `hermes`: the chat template's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks, several per turn; the turn ends at end-of-turn (EOS), so `stop = ()`. A turn with no
  call is the answer (the `<answer>` content if present, else the whole text). The observation
  is the chat template's own rendering of the tool messages, as a continuation:

      base = template(dummy + [assistant "<S>"])                 (no generation prompt)
      full = template(dummy + [assistant "<S>"] + tool_msgs, add_generation_prompt=True)
      text = full[full.index("<S>") + len("<S>"):]
      text = text.removeprefix(eos_token) if the sampled turn ended with EOS
      ids  = tokenizer.encode(text, add_special_tokens=False)

  i.e. everything the template writes after the assistant's content: its end-of-turn (only
  if the model did not sample it), the tool turn(s), and the next assistant header. The
  conversation so far is never re-rendered or re-encoded; the dummy conversation only gives
  the template the context it needs (same `tools=` as the prompt). `history_rewrite(tokenizer)`
  tells whether that equals the template's rendering of the whole conversation: templates
  that drop earlier `<think>` blocks (thinking models) do not, and need the stepwise layout
  (workflows/tool_agent.py).

A malformed call (unclosed tag, empty query, bad JSON, unknown attribute format) and a turn with
neither call nor answer give `Parsed(invalid=True, reason=...)`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from seekrl.tools.base import ToolCall, ToolResult

__all__ = ["get_format", "FORMATS", "Parsed", "SearchR1Format", "DrTuluFormat", "HermesFormat", "tail_text",
           "INVALID_SEARCH_R1", "BODY_ARGS"]

# dr_tulu: the argument a <call_tool> body fills, for tools whose main argument is not "query"
BODY_ARGS: dict[str, str] = {"fetch_page": "url"}

INVALID_SEARCH_R1 = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


@dataclass
class Parsed:
    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    invalid: bool = False
    reason: str | None = None


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class SearchR1Format:
    name = "search_r1"
    stop: tuple[str, ...] = ("</search>", "</answer>")
    answer_stop: tuple[str, ...] = ("</answer>",)
    answer_open = "<answer>"  # what opens an answer (rollout.branch_from=answer branches after it)
    tail = "</information>\n\n"
    invalid_text = INVALID_SEARCH_R1
    answer_requires_stop = False
    _ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

    def parse(self, text: str) -> Parsed:
        m = self._ACTION.search(text)
        if m is None:
            for tag in ("search", "answer"):
                if f"<{tag}>" in text:
                    return Parsed(invalid=True, reason=f"unclosed <{tag}> tag")
            return Parsed(invalid=True, reason="no <search> or <answer>")
        content = m.group(2).strip()
        if m.group(1) == "answer":
            return Parsed(answer=content)
        if not content:
            return Parsed(invalid=True, reason="empty query")
        return Parsed(calls=[ToolCall("search", {"query": content}, m.group(0))])

    def observation_text(self, results: list[ToolResult]) -> str:
        return "".join(f"\n\n<information>{r.text.strip()}</information>\n\n" for r in results)

    def observation(self, results: list[ToolResult], tokenizer, *, closed: bool = True) -> list[int]:
        return _encode(tokenizer, self.observation_text(results))

    def invalid_observation(self, tokenizer, *, closed: bool = True) -> list[int]:
        return _encode(tokenizer, self.invalid_text)


class DrTuluFormat:
    name = "dr_tulu"
    stop: tuple[str, ...] = ("</call_tool>", "</answer>")
    answer_stop: tuple[str, ...] = ("</answer>",)
    answer_open = "<answer>"
    tail = "</tool_output>\n"
    invalid_text = (
        "\nMy previous action is invalid. To use a tool, write "
        '<call_tool name="TOOL">query</call_tool>. To give the final answer, '
        "put it between <answer> and </answer>. Let me try again.\n"
    )
    answer_requires_stop = False
    _CALL = re.compile(r"<call_tool\b([^>]*)>(.*?)</call_tool>", re.DOTALL)
    _ATTR = re.compile(r'\s*([A-Za-z_][\w-]*)\s*=\s*"([^"]*)"\s*')

    def _attrs(self, s: str) -> dict | None:
        out, pos = {}, 0
        while pos < len(s):
            m = self._ATTR.match(s, pos)
            if m is None or m.end() == pos:
                return None if s[pos:].strip() else out
            out[m.group(1)] = m.group(2)
            pos = m.end()
        return out

    def parse(self, text: str) -> Parsed:
        call, ans = self._CALL.search(text), _ANSWER.search(text)
        if ans is not None and (call is None or ans.start() < call.start()):
            return Parsed(answer=ans.group(1).strip())
        if call is None:
            if "<call_tool" in text:
                return Parsed(invalid=True, reason="unclosed <call_tool> tag")
            if "<answer>" in text:
                return Parsed(invalid=True, reason="unclosed <answer> tag")
            return Parsed(invalid=True, reason="no <call_tool> or <answer>")
        calls = []
        for m in self._CALL.finditer(text):
            attrs = self._attrs(m.group(1))
            if attrs is None:
                return Parsed(invalid=True, reason=f"unknown attribute format: {m.group(1).strip()!r}")
            name = attrs.pop("name", "").strip()
            if not name:
                return Parsed(invalid=True, reason="<call_tool> without a name attribute")
            query = m.group(2).strip()
            if not query:
                return Parsed(invalid=True, reason="empty query")
            calls.append(ToolCall(name, {**attrs, BODY_ARGS.get(name, "query"): query}, m.group(0)))
        return Parsed(calls=calls)

    def observation_text(self, results: list[ToolResult]) -> str:
        return "".join(f"\n<tool_output>{r.text.strip()}</tool_output>\n" for r in results)

    def observation(self, results: list[ToolResult], tokenizer, *, closed: bool = True) -> list[int]:
        return _encode(tokenizer, self.observation_text(results))

    def invalid_observation(self, tokenizer, *, closed: bool = True) -> list[int]:
        return _encode(tokenizer, self.invalid_text)


class HermesFormat:
    """JSON tool calls in `<tool_call>` blocks, observations rendered by the chat template."""

    name = "hermes"
    stop: tuple[str, ...] = ()
    answer_stop: tuple[str, ...] = ()
    answer_requires_stop = True  # a turn cut at max_new_tokens is not an answer
    invalid_text = (
        "My previous action is invalid. To call a tool, write "
        '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> with valid JSON. Let me try again.'
    )
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _SENTINEL = "\x00SEEKRL\x00"  # never produced by a model; marks where the assistant's content ends

    def __init__(self, tools: list[dict] | None = None):
        self.tools = tools  # the OpenAI schemas given to the chat template (same as the prompt's)

    def parse(self, text: str) -> Parsed:
        opens = text.count("<tool_call>")
        if opens == 0:
            m = _ANSWER.search(text)
            answer = m.group(1).strip() if m else text.strip()
            if not answer:
                return Parsed(invalid=True, reason="empty turn")
            return Parsed(answer=answer)
        if opens != text.count("</tool_call>"):
            return Parsed(invalid=True, reason="unclosed <tool_call> tag")
        calls = []
        for m in self._CALL.finditer(text):
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError as e:
                return Parsed(invalid=True, reason=f"bad JSON in <tool_call>: {e.msg}")
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
                return Parsed(invalid=True, reason='a tool call needs {"name": str, "arguments": {...}}')
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):  # some models write the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return Parsed(invalid=True, reason="arguments is a string that is not JSON")
            if not isinstance(args, dict):
                return Parsed(invalid=True, reason="arguments must be a JSON object")
            calls.append(ToolCall(obj["name"], args, m.group(0)))
        return Parsed(calls=calls)

    # -------------------------------------------------------------------------- rendering

    def _render(self, tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
        kw = {"tools": self.tools} if self.tools else {}
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kw)

    def continuation_text(self, tokenizer, new_messages: list[dict], *, closed: bool = True) -> str:
        """The template's text after an assistant turn's content, up to the next assistant header."""
        s = self._SENTINEL
        dummy = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": s}]
        full = self._render(tokenizer, dummy + new_messages, add_generation_prompt=True)
        cut = full.find(s)
        if cut < 0:
            raise ValueError("the chat template does not render the assistant's content verbatim")
        text = full[cut + len(s) :]
        eos = getattr(tokenizer, "eos_token", None)
        if closed and eos and text.startswith(eos):
            text = text[len(eos) :]
        return text

    def observation(self, results: list[ToolResult], tokenizer, *, closed: bool = True) -> list[int]:
        msgs = [{"role": "tool", "name": r.name, "content": r.text} for r in results]
        return _encode(tokenizer, self.continuation_text(tokenizer, msgs, closed=closed))

    def invalid_observation(self, tokenizer, *, closed: bool = True) -> list[int]:
        return _encode(tokenizer, self.continuation_text(tokenizer, [{"role": "user", "content": self.invalid_text}], closed=closed))

    def history_rewrite(self, tokenizer) -> str | None:
        """Whether the template re-renders an earlier turn differently once the conversation goes on.

        The workflow's prefix layout continues a turn's prompt with the sampled tokens and the
        `continuation_text` of what follows; that is the template's own rendering only if
        render(conversation + [assistant A] + next) == render(conversation) + A + continuation.
        Two probes, A holding a `<think>` block: followed by a tool result, and by a user message
        (the invalid-action turn). None when both hold; else where the renderings part, in a few words.
        """
        user = [{"role": "user", "content": "What is the capital of France?"}]
        think = "<think>\nThe capital is asked for; search first.\n</think>\n\n"
        call = '<tool_call>{"name": "search", "arguments": {"query": "capital of France"}}</tool_call>'
        probes = ((think + call, [{"role": "tool", "name": "search", "content": "Paris is the capital of France."}]),
                  (think + "Paris.", [{"role": "user", "content": self.invalid_text}]))
        first = self._render(tokenizer, user, add_generation_prompt=True)
        for content, after in probes:
            want = first + content + self.continuation_text(tokenizer, after, closed=False)
            got = self._render(tokenizer, [*user, {"role": "assistant", "content": content}, *after], add_generation_prompt=True)
            if got != want:
                i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                tag = want.rfind("<", max(0, i - 16), i + 1)  # from the tag the renderings part in
                i = tag if tag >= 0 else i
                return f"the assistant turn {want[i:i + 24]!r}... is rendered as {got[i:i + 24]!r}..."
        return None

    def tail_for(self, tokenizer) -> str:
        """The text after a tool message's content: the end of the tool turn and the next header."""
        s = self._SENTINEL
        text = self.continuation_text(tokenizer, [{"role": "tool", "name": "t", "content": s}])
        return text[text.find(s) + len(s) :]


def tail_text(fmt, tokenizer) -> str:
    """The closing text of `fmt`'s observations (kept when an observation is truncated)."""
    fn = getattr(fmt, "tail_for", None)
    return fn(tokenizer) if fn is not None else getattr(fmt, "tail", "")


FORMATS = {"search_r1": SearchR1Format, "dr_tulu": DrTuluFormat, "hermes": HermesFormat}


def get_format(name: str, **kwargs):
    """A new format object by name (`hermes` takes `tools=` schemas)."""
    try:
        cls = FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format '{name}'; known: {', '.join(FORMATS)}") from None
    return cls(**kwargs)
