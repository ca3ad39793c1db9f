"""What the engine adapters (adapters.py) share to read servers' answers, without I/O: one-line
errors (`AdapterError`), token-id and log-prob checks, weight-version spans, control answers and
the context length a server reports."""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["AdapterError", "PAUSE_MODES", "one_line", "is_int", "int_list", "logprob", "as_int", "version_label",
           "versions_from_spans", "context_of", "single", "check_mode", "check_answer"]

PAUSE_MODES = ("abort", "in_place")


class AdapterError(Exception):
    """A server's answer that cannot be read, or that says an operation failed (one line)."""


def one_line(text: Any, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise AdapterError(f"{what} is not a list of token ids: {one_line(value, 80)}")
    return list(value)


def logprob(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise AdapterError(f"{what} is not a number: {one_line(value, 80)}")
    return float(value)


def as_int(value: Any) -> int | None:
    """An int, or a string holding one (JSON labels, str()-ed RPC results); None otherwise."""
    if is_int(value):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def version_label(label: Any) -> int | None:
    """A weight-version label as seekrl's int version; None for labels such as "default"."""
    return as_int(label)


def versions_from_spans(spans: Any, n_tokens: int, what: str) -> list[int] | None:
    """Per-token versions from half-open spans [{"version", "start", "end"}] covering [0, n_tokens).
    None when a label is not an integer version (e.g. the server's initial "default")."""
    if not isinstance(spans, list):
        raise AdapterError(f"{what} is not a list of spans: {one_line(spans, 80)}")
    versions: list[int] = []
    labels_ok = True
    for span in spans:
        if not isinstance(span, dict) or not is_int(span.get("start")) or not is_int(span.get("end")):
            raise AdapterError(f"{what} has a malformed span: {one_line(span, 80)}")
        start, end = span["start"], span["end"]
        if start != len(versions) or end < start:
            raise AdapterError(f"{what} spans are not contiguous from token 0: {one_line(spans, 120)}")
        label = version_label(span.get("version"))
        labels_ok = labels_ok and label is not None
        versions.extend([label if label is not None else -1] * (end - start))
    if len(versions) != n_tokens:
        raise AdapterError(f"{what} cover {len(versions)} tokens, the answer has {n_tokens}")
    return versions if labels_ok else None


CONTEXT_KEYS = ("max_context", "max_model_len", "context_length", "context_len")


def context_of(body: Any) -> int | None:
    """The largest prompt + completion a server reports: `max_context` (seekrl), `max_model_len`
    (vLLM's /v1/models, in data[0]), `context_length` / `context_len` (SGLang); None if none."""
    if isinstance(body, dict) and isinstance(body.get("data"), list) and body["data"]:
        body = body["data"][0]
    if not isinstance(body, dict):
        return None
    for key in CONTEXT_KEYS:
        value = body.get(key)
        if is_int(value) and value > 0:
            return value
    return None


def single(body: Any, what: str) -> dict:
    """The one result of a single-prompt request (a list of one is accepted)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict):
        raise AdapterError(f"{what}: expected one JSON object, got {one_line(body, 80)}")
    return body


def check_mode(mode: str) -> None:
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode {mode!r} is not one of {', '.join(PAUSE_MODES)}")


def check_answer(call: Any, body: Any, success_required: frozenset[str]) -> None:
    """Raise AdapterError when a control answer reports an error or success=false."""
    path = call.path.split("?", 1)[0]
    if not isinstance(body, dict):
        raise AdapterError(f"{path}: expected a JSON object, got {one_line(body, 80)}")
    error = body.get("error")
    if error:
        message = error.get("message", error) if isinstance(error, dict) else error
        raise AdapterError(f"{path} failed: {one_line(message)}")
    if body.get("success") is False or (path in success_required and body.get("success") is not True):
        raise AdapterError(f"{path} failed: {one_line(body.get('message') or body)}")
