"""OpenAI's chat / completions wire format, as seekrl's endpoints speak it: the request schemas,
the message contents they accept, the error shape, stop-string cutting and log-prob entries.

The policy server (servers/policy.py) and the per-episode agent endpoint of a rollout
(workflows/agent_endpoint.py) answer with these shapes, so the stock `openai` client reads both.
Unknown request fields are ignored (pydantic's default), as OpenAI-compatible servers do.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid

from pydantic import BaseModel, Field

from seekrl.api.guards import HTTPError, json_error

__all__ = ["MAX_N", "MAX_STOPS", "SEED_RANGE", "Sampling", "ChatRequest", "CompletionRequest", "openai_error", "message_text",
           "chat_messages", "cut_at_stop", "stop_list", "chat_logprobs", "completion_logprobs", "usage", "chat_response",
           "completion_response", "sse_chunks"]

MAX_N = 128
MAX_STOPS = 16
SEED_RANGE = {"ge": -(2**63), "le": 2**63 - 1 - MAX_N}  # seed + i must fit torch's generator


class Sampling(BaseModel):
    """Fields shared by both endpoints; null means the default, as if absent."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, **SEED_RANGE)
    stream: bool | None = None


class ChatRequest(Sampling):
    messages: list[dict] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = None


def openai_error(err: HTTPError):
    """OpenAI's error shape, plus seekrl's "detail" (the same message)."""
    kind = "authentication_error" if err.status == 401 else "server_error" if err.status >= 500 else "invalid_request_error"
    error = {"message": err.message, "type": kind, "param": err.param, "code": None}
    return json_error(err, {"error": error, "detail": err.message})


def message_text(content, i: int) -> str:
    """OpenAI content: a string, null, or a list of parts of which only text parts are supported."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise HTTPError(400, f"messages.{i}.content: only text parts are supported, got {kind!r}", "messages")
        return "".join(texts)
    raise HTTPError(400, f"messages.{i}.content must be a string or a list of text parts", "messages")


def chat_messages(messages: list[dict]) -> list[dict]:
    """The request's messages with text contents (400 on a message without a string role)."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise HTTPError(400, f"messages.{i}: every message needs a string 'role'", "messages")
        out.append({**m, "content": message_text(m.get("content"), i)})
    return out


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """`text` before the first of the stop strings (OpenAI leaves the stop string out of the text)."""
    cuts = [k for k in (text.find(s) for s in stops) if k >= 0]
    return text[: min(cuts)] if cuts else text


def stop_list(stop: str | list[str] | None) -> list[str]:
    """The request's stop strings as a list (400 past MAX_STOPS)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS:
        raise HTTPError(400, f"{len(stops)} stop strings; at most {MAX_STOPS}", "stop")
    return [s for s in stops if s]


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[float]) -> dict:
    """A chat choice's `logprobs`: the sampled tokens only (no top alternatives)."""
    return {"content": [
        {"token": tokenizer.decode([t], skip_special_tokens=False), "logprob": lp, "bytes": None, "top_logprobs": []}
        for t, lp in zip(token_ids, logprobs)
    ]}


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[float]) -> dict:
    """A legacy completion choice's `logprobs`: tokens, their log-probs and text offsets (no top alternatives)."""
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]
    offsets = [0, *itertools.accumulate(len(s) for s in tokens)][: len(tokens)]
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def chat_response(model: str, choices: list[dict], counts: dict) -> dict:
    """A `chat.completion` body."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": counts}


def completion_response(model: str, choices: list[dict], counts: dict) -> dict:
    """A `text_completion` body."""
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": counts}


def sse_chunks(body: dict, include_usage: bool = False):
    """A finished response as the server-sent events of `stream: true`: per choice one chunk with all
    its content (chat: `delta` with role, content and tool_calls; completions: `text`), then one with
    its finish_reason; the usage chunk when asked (`stream_options.include_usage`); `[DONE]`.
    The stock clients read it as a stream that arrived at once."""
    chat = body["object"] == "chat.completion"
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": body["id"], "object": kind, "created": body["created"], "model": body["model"]}

    def event(choices: list[dict], **extra) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    for c in body["choices"]:
        if chat:
            m = c["message"]
            delta = {"role": "assistant", "content": m.get("content")}
            if m.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(m["tool_calls"])]
            yield event([{"index": c["index"], "delta": delta, "logprobs": c.get("logprobs"), "finish_reason": None}])
            yield event([{"index": c["index"], "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}])
        else:
            yield event([{"index": c["index"], "text": c["text"], "logprobs": c.get("logprobs"), "finish_reason": None}])
            yield event([{"index": c["index"], "text": "", "logprobs": None, "finish_reason": c["finish_reason"]}])
    if include_usage:
        yield event([], usage=body["usage"])
    yield "data: [DONE]\n\n"
