"""How a config section is declared, read from YAML / the command line, and checked.

A section is a dataclass that lives next to the module that reads it (`TrainConfig` in
train/config.py, `EngineConfig` in engines/config.py, ...); seekrl/config.py puts them
together. Every field has a docstring (the string literal under it, which `seekrl config
--reference` prints) and a type that says which values it takes:

    @dataclass
    class TrainConfig:
        lr: Annotated[float, Range(ge=0, hint="e.g. 1e-6 for a real model")] = 1e-6
        \"\"\"Policy learning rate (AdamW).\"\"\"
        schedule: Literal["constant", "cosine"] = "constant"
        \"\"\"constant | cosine (after warmup).\"\"\"

        def check(self) -> None:          # optional: rules between this section's own fields
            ...

- `coerce(key, value, hint)` turns a YAML or command-line value into the field's type (an int
  where a float is asked, one item where a list is, YAML's true/false where the Literal names
  "true"/"false"), or raises a one-line ConfigError ("train.steps: expected an integer, got 1.5").
- `check_fields(name, section)` checks each value: a Literal's choices (with a did-you-mean; each
  item of a list of Literals too), a `Range`, and that every float, in lists too, is finite.
  Then `section.check()` runs.

Checking reads values and never changes them; the derived defaults (engine.kind from
engine.urls, ...) are resolved by seekrl/config.py before the checks, in one visible step.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import types
import typing
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

from seekrl.errors import ConfigError

__all__ = ["ConfigError", "Range", "coerce", "check_fields", "field_docs", "did_you_mean", "choices", "section_hints",
           "is_subsection", "apply_fields"]


@dataclass(frozen=True)
class Range:
    """Bounds of a number field: `Annotated[float, Range(ge=0)]`. `text` is how the error says them
    ("must be {text}, got {value}"); by default "a finite number >= 0 (hint)" for floats, "at least
    1" / ">= 0 (hint)" for integers, and "in [lo, hi]" when both ends are bounded. A float's range
    text that starts with "a finite number" also reports nan and inf; other floats report them
    with the plain "must be a finite number" of every float."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    hint: str = ""
    text: str = ""

    def contains(self, v: float) -> bool:
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))

    def describe(self, is_float: bool) -> str:
        if self.text:
            return self.text
        lo = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        hi = ("]", self.le) if self.le is not None else (")", self.lt) if self.lt is not None else None
        hint = f" ({self.hint})" if self.hint else ""

        def num(x: float) -> str:
            return f"{x:g}" if isinstance(x, float) else str(x)

        if lo and hi:
            return f"in {lo[0]}{num(lo[1])}, {num(hi[1])}{hi[0]}{hint}"
        op, bound = ((">=" if lo[0] == "[" else ">"), lo[1]) if lo else (("<=" if hi[0] == "]" else "<"), hi[1])
        if not is_float and op == ">=" and bound == 1 and not hint:
            return "at least 1"
        return f"{'a finite number ' if is_float else ''}{op} {num(bound)}{hint}"


def did_you_mean(name: str, options, prefix: str = "", list_known: bool = True) -> str:
    """'; did you mean X?' for a close option, else the known options (or nothing)."""
    close = difflib.get_close_matches(str(name), list(options), n=1)
    if close:
        return f"; did you mean '{prefix}{close[0]}'?"
    return f"; known: {', '.join(sorted(options))}" if list_known else ""


def _base(hint: Any) -> tuple[Any, tuple]:
    """(the type under Annotated, its metadata)."""
    if typing.get_origin(hint) is Annotated:
        base, *meta = typing.get_args(hint)
        return base, tuple(meta)
    return hint, ()


def choices(hint: Any) -> tuple | None:
    """The allowed values of a Literal field (also `Literal[...] | None`), or None."""
    base, _ = _base(hint)
    if typing.get_origin(base) is Literal:
        return typing.get_args(base)
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        for arg in typing.get_args(base):
            if typing.get_origin(arg) is Literal:
                return typing.get_args(arg)
    return None


def item_choices(hint: Any) -> tuple | None:
    """The allowed values of each item of a list-of-Literal field (also `list[Literal[...]] | None`), or None."""
    base, _ = _base(hint)
    for arg in (base, *typing.get_args(base)) if typing.get_origin(base) in (typing.Union, types.UnionType) else (base,):
        if typing.get_origin(arg) is list and typing.get_origin(typing.get_args(arg)[0]) is Literal:
            return typing.get_args(typing.get_args(arg)[0])
    return None


def section_hints(cls: type) -> dict[str, Any]:
    """Field name -> annotation (Annotated kept) of a section dataclass."""
    return typing.get_type_hints(cls, include_extras=True)


def is_subsection(hint: Any) -> bool:
    """A field that is itself a dataclass of fields (`algo.teacher`: keys `algo.teacher.path`, ...)."""
    base, _ = _base(hint)
    return isinstance(base, type) and dataclasses.is_dataclass(base)


def apply_fields(where: str, target: Any, values: Any) -> None:
    """Set the fields of the dataclass `target` from a mapping (a subsection written in YAML as
    `teacher: {path: ...}`), coercing each; unknown keys get a did-you-mean."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping of key: value (e.g. {{{names(type(target))[0]}: ...}}), got {values!r}")
    hints = section_hints(type(target))
    for key, value in values.items():
        if str(key) not in hints:
            raise ConfigError(f"unknown key '{where}.{key}'{did_you_mean(str(key), hints, where + '.')}")
        setattr(target, str(key), coerce(f"{where}.{key}", value, hints[str(key)]))


def coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` as the annotation's type (module docstring); raises ConfigError."""
    hint, _ = _base(hint)
    origin = typing.get_origin(hint)
    if is_subsection(hint):
        if isinstance(value, hint):
            return value
        out = hint()
        apply_fields(key, out, value)
        return out
    if origin is Literal:
        options = typing.get_args(hint)
        if isinstance(value, bool) and str(value).lower() in options:  # YAML reads true/false as booleans
            return str(value).lower()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and str(value) in options:
            return str(value)
        if isinstance(value, str):
            return value  # the choice is checked with the other values (check_fields)
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, options))}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        shaped: list[ConfigError] = []  # errors of the types that take values of this shape (a list, a mapping)
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(key, value, arg)
            except ConfigError as e:
                if (isinstance(value, list) and typing.get_origin(arg) is list) or (isinstance(value, dict) and is_subsection(arg)):
                    shaped.append(e)
        if len(shaped) == 1:  # `data.train[1].wieght: unknown key ...` says more than "expected str or list"
            raise shaped[0]
        names = " or ".join("null" if a is type(None) else getattr(a, "__name__", str(a)) for a in args)
        raise ConfigError(f"{key}: expected {names}, got {value!r} ({type(value).__name__})")
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]  # a single item on the command line: reward.functions=math
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}; write it as [a, b]")
        return [coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def check_fields(name: str, section: Any) -> None:
    """Every field of `section` within its Literal choices and Range, every float finite; then
    `section.check()` when it has one. Raises a one-line ConfigError; changes nothing."""
    for key, hint in section_hints(type(section)).items():
        value = getattr(section, key)
        where = f"{name}.{key}"
        if is_subsection(hint):
            check_fields(where, value)
            continue
        options = choices(hint)
        if options is not None and value is not None and value not in options:
            # the options are listed already: only a close match adds something
            raise ConfigError(f"{where}: '{value}' is not one of {', '.join(map(str, options))}"
                              f"{did_you_mean(value, [str(o) for o in options], list_known=False)}")
        item_options = item_choices(hint)
        for i, v in enumerate(value if item_options is not None and isinstance(value, list) else []):
            if v not in item_options:
                raise ConfigError(f"{where}[{i}]: '{v}' is not one of {', '.join(map(str, item_options))}"
                                  f"{did_you_mean(v, [str(o) for o in item_options], list_known=False)}")
        base, meta = _base(hint)
        bounds = next((m for m in meta if isinstance(m, Range)), None)
        nullable = type(None) in typing.get_args(base)
        is_float = float in (base, *typing.get_args(base))
        items = value if isinstance(value, list) else [value]
        for i, v in enumerate(items):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            at = where + (f"[{i}]" if isinstance(value, list) else "")
            text = bounds.describe(is_float) if bounds else ""
            finite = not isinstance(v, float) or math.isfinite(v)
            if not finite and not (bounds and text.startswith("a finite number")):
                raise ConfigError(f"{at}: must be a finite number{' or null' if nullable and not isinstance(value, list) else ''}, got {v}")
            if bounds and (not finite or not bounds.contains(v)):
                raise ConfigError(f"{at}: must be {text}, got {v}")
    check = getattr(section, "check", None)
    if check is not None:
        check()


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a section dataclass (read from its source); a subsection's
    fields are listed as `sub.key`."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)  # type: ignore[attr-defined]
    hints = section_hints(cls)
    for key in list(docs):
        if is_subsection(hints[key]):
            del docs[key]
            docs.update({f"{key}.{k}": v for k, v in field_docs(_base(hints[key])[0]).items()})
    return docs


def names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
