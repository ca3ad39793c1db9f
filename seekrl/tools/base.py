"""Tools: the `Tool` protocol, the `@tool` decorator, per-tool policies and the registry.

A tool is a plain typed function with a docstring (DESIGN.md, Habit 3); its JSON schema comes
from the signature and the docstring, so there is nothing to keep in sync by hand:

    @tool(timeout_s=10, max_calls=4)
    async def search(query: str, top_k: int = 3) -> str:
        '''Search the corpus and return the top passages.

        Args:
            query: what to look for.
            top_k: how many passages to return.
        '''

Types: str, int, float, bool, list[X] (X one of those), dict, Optional[X] / X | None (the
value may be null, and the parameter is not required). A parameter with a default is not
required. The first docstring paragraph is the description; the lines of an "Args:" section
("name: text" or "name (type): text", continuation lines indented further) describe the
parameters. A sync function runs in a worker thread, so its timeout still holds.

`ToolPolicy` is how the executor (executor.py) runs the tool: timeout, retries with exponential
backoff, a concurrency limit shared by all episodes, an LRU cache, a per-episode call limit.
`ToolRegistry.schemas()` gives the OpenAI function-calling list that chat templates take as
`tools=`.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Tool", "tool", "ToolPolicy", "ToolCall", "ToolResult", "FunctionTool", "ToolRegistry", "schema_from_function",
           "parse_docstring"]


@dataclass(frozen=True)
class ToolPolicy:
    """How the executor runs one tool."""

    timeout_s: float = 30.0  # per attempt
    retries: int = 0  # extra attempts after an exception or a timeout
    backoff_s: float = 0.5  # sleep before retry k (0-based): backoff_s * 2**k
    max_concurrency: int = 8  # calls in flight at once, across all episodes
    cache_size: int = 0  # LRU entries keyed by (name, sorted args); 0 = off
    max_calls: int | None = None  # calls per episode; past it the tool is not run


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments ({"type": "object", "properties", "required"})
    policy: ToolPolicy

    async def __call__(self, **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name, its arguments, and the text it came from."""

    name: str
    args: dict
    raw: str


@dataclass
class ToolResult:
    """What a call gave: `text` is what the model sees (an "Error: ..." line when `ok` is False)."""

    name: str
    text: str
    ok: bool
    error: str | None = None  # kind of failure: unknown_tool | bad_args | timeout | exception | unavailable (its server: not the model's fault) | max_calls
    cached: bool = False
    seconds: float = 0.0
    attempts: int = 0


# ------------------------------------------------------------------------------------ schemas

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def _schema_of(hint: Any) -> tuple[dict, bool]:
    """(JSON schema, nullable) of a type hint."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unions other than Optional[X] are not supported: {hint}")
        schema, _ = _schema_of(args[0])
        return schema, len(args) < len(typing.get_args(hint))
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}, False
    if origin in (list, tuple) or hint in (list, tuple):
        items = typing.get_args(hint)
        out: dict = {"type": "array"}
        if items and items[0] is not Ellipsis:
            out["items"] = _schema_of(items[0])[0]
        return out, False
    if origin is dict:
        return {"type": "object"}, False
    if hint is Any or hint is inspect.Parameter.empty:
        return {}, False
    raise TypeError(f"unsupported parameter type {hint!r}: use str, int, float, bool, list[X], dict or Optional[X]")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description = first paragraph, {parameter: description} from an "Args:" section)."""
    doc = inspect.cleandoc(doc or "")
    if not doc:
        return "", {}
    description = " ".join(doc.split("\n\n", 1)[0].split())
    params: dict[str, str] = {}
    lines = doc.splitlines()
    in_args, current, base_indent = False, None, None
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            in_args, current, base_indent = True, None, None
            continue
        if not in_args:
            continue
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        if indent < base_indent or (indent == 0 and stripped.endswith(":")):
            in_args = False  # the next section (Returns:, Raises:, ...)
            continue
        m = re.match(r"(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
        if indent == base_indent and m:
            current = m.group(1)
            params[current] = m.group(3).strip()
        elif current is not None:
            params[current] = (params[current] + " " + stripped).strip()
    return description, params


def schema_from_function(fn: Callable) -> dict:
    """The JSON schema of `fn`'s keyword arguments (see module docstring)."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    _, docs = parse_docstring(fn.__doc__)
    properties: dict[str, dict] = {}
    required: list[str] = []
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema, nullable = _schema_of(hints.get(name, p.annotation))
        if nullable and "type" in schema:
            schema = {**schema, "type": [schema["type"], "null"]}
        if name in docs:
            schema = {**schema, "description": docs[name]}
        if p.default is not p.empty:
            if p.default is None or isinstance(p.default, (str, int, float, bool, list)):
                schema = {**schema, "default": p.default}
        elif not nullable:
            required.append(name)
        properties[name] = schema
    return {"type": "object", "properties": properties, "required": required}


# ------------------------------------------------------------------------------------ @tool


@dataclass
class FunctionTool:
    """A Tool made from a typed function by `@tool`. Calling it awaits the function (sync ones in a thread).
    `counters`, when set, gives the run-level counters of what the tool calls (e.g. the retrieval
    client's re-sent requests), which ToolExecutor.metrics() reports as `tools/<name>/<counter>`."""

    fn: Callable
    name: str
    description: str
    parameters: dict
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    counters: Callable[[], dict[str, float]] | None = None

    async def __call__(self, **kwargs: Any) -> str:
        if inspect.iscoroutinefunction(self.fn):
            out = await self.fn(**kwargs)
        else:
            out = await asyncio.to_thread(self.fn, **kwargs)
            if inspect.isawaitable(out):
                out = await out
        return out if isinstance(out, str) else str(out)


def tool(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ToolPolicy | None = None,
    **policy_fields: Any,
):
    """Turn a typed function into a Tool: `@tool`, `@tool(name=..., timeout_s=..., max_calls=...)`.

    Keyword arguments other than name / description / policy are `ToolPolicy` fields.
    """
    if policy is not None and policy_fields:
        raise TypeError("give either policy=ToolPolicy(...) or policy fields, not both")
    pol = policy or ToolPolicy(**policy_fields)

    def wrap(f: Callable) -> FunctionTool:
        desc, _ = parse_docstring(f.__doc__)
        return FunctionTool(
            fn=f, name=name or f.__name__, description=description or desc, parameters=schema_from_function(f), policy=pol
        )

    return wrap(fn) if fn is not None else wrap


# ------------------------------------------------------------------------------------ registry


class ToolRegistry:
    """Tools by name; `schemas()` in the OpenAI function-calling format for chat templates."""

    def __init__(self, tools: list | None = None):
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.register(t)

    def register(self, t: Tool | Callable) -> Tool:
        if not isinstance(t, Tool):
            t = tool(t)  # a bare typed function
        if t.name in self._tools:
            raise ValueError(f"tool '{t.name}' is already registered")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self) -> list[dict]:
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in self._tools.values()
        ]
