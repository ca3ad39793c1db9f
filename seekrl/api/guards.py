"""The request policy every seekrl HTTP server shares: bearer token, bounded JSON bodies, counters.

The policy server (servers/policy.py), the retrieval server (servers/retrieval.py), the engine
server (servers/engine.py), the MCP server (servers/mcp.py) and the agent endpoint of a rollout
(workflows/agent_endpoint.py) bind 127.0.0.1 by default, take an
optional bearer token (from the command line or an environment variable, so the secret can stay
out of argv), and bound what a request may send. One `Guard` per server holds that policy:

    guard = Guard(token=token, max_body_bytes=1_000_000, max_depth=32)
    payload = await guard.json_body(request)      # 401 / 413 / 400 as HTTPError, else the JSON
    req = await guard.validated_body(request, PydanticModel)   # the same, then the schema (400)
    guard.count(status)                            # once per answered request
    result = await cancel_on_disconnect(request, engine.generate(...))   # ClientGone if the client left

    return await guard.answer(request, handler, error_response)   # all of the above for one route:
    # HTTPError -> error_response(err), ClientGone -> "cancelled", a crash -> a one-line 500; counted
    add_status_routes(app, guard, error_response, info)   # GET /health (open), GET /server_info (token)

Every refusal is an `HTTPError` with a one-line message; each server maps it to its own response
shape (Search-R1's `{"detail"}`, OpenAI's `{"error": {...}, "detail"}`), so bad input is never a
500 with a traceback: not JSON, not UTF-8, NaN / Infinity, nesting deeper than `max_depth`
(checked without recursion, so 100,000 nested lists answer 400 at once), or a string holding a
lone surrogate ("\\ud800", which no UTF-8 encoder, tokenizer or JSON response can carry).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

__all__ = [
    "LOOPBACK",
    "HTTPError",
    "Guard",
    "ClientGone",
    "cancel_on_disconnect",
    "check_json",
    "parse_json",
    "bearer_token",
    "check_token",
    "token_matches",
    "json_error",
    "openapi_body",
    "add_status_routes",
    "validation_message",
    "resolve_token",
    "check_port",
    "check_temperature",
    "one_line",
]

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MESSAGE_LIMIT = 1000  # characters of an error message sent back


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), cut to `limit`."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


class HTTPError(Exception):
    """A request to refuse: status, a one-line message naming the problem, the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None):
        message = one_line(message, MESSAGE_LIMIT)
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class ClientGone(Exception):
    """The client disconnected before its answer was ready; the work for it was cancelled."""


# --- auth ----------------------------------------------------------------------------------------


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization` header value, or None if it is not a bearer credential.

    The scheme is case-insensitive (RFC 7235 section 2.1): "Bearer T", "bearer T", "BEARER T"."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def token_matches(presented: str, token: str) -> bool:
    """`presented` is `token` (surrounding spaces aside), compared in constant time."""
    return secrets.compare_digest(presented.strip().encode(), token.encode())


def check_token(headers, token: str | None) -> None:
    """Raise 401 unless `headers` carry `Authorization: Bearer <token>` (constant-time compare)."""
    if not token:
        return
    given = headers.get("authorization", "")
    if not given:
        raise HTTPError(401, "missing bearer token: send the header 'Authorization: Bearer <token>'")
    presented = bearer_token(given)
    if presented is None:
        raise HTTPError(401, "the Authorization header must be 'Bearer <token>'")
    if not token_matches(presented, token):
        raise HTTPError(401, "invalid bearer token")


# --- JSON ----------------------------------------------------------------------------------------


def _reject_constant(name: str):
    raise HTTPError(400, f"request body is not valid JSON: {name} is not a JSON number")


def _has_lone_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate_error(path: tuple, s: str) -> HTTPError:
    where = ".".join(str(p) for p in path) or "body"
    bad = next(c for c in s if 0xD800 <= ord(c) <= 0xDFFF)
    return HTTPError(400, f"{where}: string holds a lone surrogate \\u{ord(bad):04x}, which is not valid Unicode", where)


def check_json(value: Any, max_depth: int = 32) -> None:
    """Raise 400 if `value` nests containers deeper than `max_depth` or holds a lone surrogate
    in any string (keys included). Iterative: no recursion, whatever the depth."""
    too_deep = HTTPError(400, f"JSON nested deeper than {max_depth} levels")
    stack: list[tuple[Any, int, tuple]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            if _has_lone_surrogate(node):
                raise _surrogate_error(path, node)
            continue
        if depth > max_depth:
            raise too_deep
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(key, str) and _has_lone_surrogate(key):
                raise _surrogate_error(path, key)
            if isinstance(child, (str, list, dict)):
                stack.append((child, depth + 1, (*path, key)))


def parse_json(body: bytes, max_depth: int = 32) -> Any:
    """Strict UTF-8 JSON (no NaN / Infinity), at most `max_depth` deep, without lone surrogates."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"request body is not valid UTF-8: {e}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:  # the C decoder recurses once per level
        raise HTTPError(400, f"JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"request body is not valid JSON: {e}") from None
    if isinstance(value, (str, list, dict)):
        check_json(value, max_depth)
    return value


# --- the guard -----------------------------------------------------------------------------------


class Guard:
    """One server's request policy: bearer token, body size, JSON depth, error counters.

    `stats` counts answered requests: "requests" (every one passed to `count`), "rejected" (4xx
    sent), "errors" (5xx sent) and "cancelled" (the client left; bumped by the caller). A server
    may add its own keys (tokens, queries, ...) to the same dict."""

    def __init__(self, *, token: str | None = None, max_body_bytes: int = 1_000_000, max_depth: int = 32):
        if max_body_bytes < 1 or max_depth < 1:
            raise ValueError(f"max_body_bytes and max_depth must be >= 1, got {max_body_bytes}, {max_depth}")
        self.token = token or None
        self.max_body_bytes = max_body_bytes
        self.max_depth = max_depth
        self.stats: dict[str, int] = {"requests": 0, "rejected": 0, "errors": 0, "cancelled": 0}

    def check_auth(self, request) -> None:
        """Raise 401 unless the request carries `Authorization: Bearer <token>` (any case of
        "Bearer"; the token compared in constant time). No token set: everyone passes."""
        check_token(request.headers, self.token)

    async def read_body(self, request) -> bytes:
        """The raw body, 413 past `max_body_bytes`: the declared Content-Length first, then the
        bytes actually received (so chunked uploads are bounded too)."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"request body of {declared} bytes is over the limit of {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HTTPError(413, f"request body is over the limit of {limit} bytes")
        return bytes(body)

    async def json_body(self, request) -> Any:
        """Auth, then the body (bounded), then strict JSON: 401 / 413 / 400 as HTTPError."""
        self.check_auth(request)
        return parse_json(await self.read_body(request), self.max_depth)

    async def validated_body(self, request, schema: type[BaseModel], *, status: int = 400, shape: str = ""):
        """`json_body`, then `schema.model_validate`: a JSON object or `status` with one line
        (`shape` is appended to "body must be a JSON object", e.g. ' {"queries": [...]}')."""
        payload = await self.json_body(request)
        if not isinstance(payload, dict):
            raise HTTPError(status, f"invalid request: body must be a JSON object{shape}")
        try:
            return schema.model_validate(payload)
        except ValidationError as e:
            raise HTTPError(status, validation_message(e)) from None

    def count(self, status: int) -> None:
        """Count one answered request: "requests" always, "rejected" for 4xx, "errors" for 5xx."""
        self.stats["requests"] += 1
        if 400 <= status < 500:
            self.stats["rejected"] += 1
        elif status >= 500:
            self.stats["errors"] += 1

    def limits(self) -> dict:
        """The configured limits, for a server's /server_info (never the token itself)."""
        return {"auth": self.token is not None, "max_body_bytes": self.max_body_bytes, "max_depth": self.max_depth}

    async def answer(self, request, handler, error_response):
        """Run `handler(request)` and count the outcome. An HTTPError becomes
        `error_response(err)`; a ClientGone is counted as cancelled (the answer is sent to
        nobody: 499, nginx's "client closed request"). Any other exception is logged and
        answered as a one-line 500 naming only its type (never a traceback)."""
        try:
            response = await handler(request)
        except HTTPError as e:
            self.count(e.status)
            return error_response(e)
        except ClientGone:
            self.stats["cancelled"] += 1
            self.stats["requests"] += 1
            return error_response(HTTPError(499, "client closed the request"))
        except Exception as e:
            log.exception("%s %s failed", request.method, request.url.path)
            self.count(500)
            return error_response(HTTPError(500, f"internal server error: {type(e).__name__}"))
        self.count(getattr(response, "status_code", 200))
        return response


# --- FastAPI / Starlette glue shared by the servers ------------------------------------------------


def json_error(err: HTTPError, body: dict):
    """A JSONResponse of `body` with `err.status` (and `WWW-Authenticate: Bearer` on a 401)."""
    from starlette.responses import JSONResponse

    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(body, status_code=err.status, headers=headers)


def openapi_body(schema: type[BaseModel]) -> dict:
    """`openapi_extra` declaring a JSON body that the handler reads by hand (auth and limits first)."""
    content = {"application/json": {"schema": schema.model_json_schema()}}
    return {"requestBody": {"required": True, "content": content}}


def add_status_routes(app, guard: Guard, error_response, info: Callable[[], dict]) -> None:
    """GET /health: `{"status": "ok"}`, no token, nothing else (a load balancer's probe).
    GET /server_info: token required; `info()` plus the guard's "limits" and "stats"."""
    from starlette.responses import JSONResponse

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def server_info(request):
        async def handler(request):
            guard.check_auth(request)
            body = info()
            body = {**body, "limits": {**guard.limits(), **body.get("limits", {})}, "stats": dict(guard.stats)}
            return JSONResponse(body)

        return await guard.answer(request, handler, error_response)

    app.add_route("/health", health, methods=["GET"])
    app.add_route("/server_info", server_info, methods=["GET"])


# --- disconnects ---------------------------------------------------------------------------------


async def cancel_on_disconnect(request, coro, poll_s: float = 0.05):
    """Await `coro`; if the client disconnects first, cancel it (counted by the caller) and raise ClientGone.

    Call it after the body has been read: the disconnect is seen by polling
    `request.is_disconnected()` every `poll_s` seconds. If the handler itself is cancelled, so is `coro`."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.wait({task})  # let the cancellation reach the engine before answering
                raise ClientGone("the client disconnected")
    finally:
        if not task.done():
            task.cancel()


# --- what servers print and read at start-up -----------------------------------------------------


def validation_message(err: ValidationError) -> str:
    """A pydantic error as one line: 'invalid request: queries.0: Input should be a valid string'."""
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()]
    return one_line("invalid request: " + "; ".join(parts), MESSAGE_LIMIT)


def resolve_token(token: str | None, env_var: str, host: str, what: str) -> str | None:
    """The token to require: the given one, else `$env_var`; warn when serving beyond loopback without one."""
    token = token or os.environ.get(env_var) or None
    if host not in LOOPBACK and not token:
        log.warning("serving %s on %s without a token; set --token or $%s", what, host, env_var)
    return token


def check_temperature(value: float | None, param: str = "temperature") -> None:
    """400 for 0 < temperature < MIN_TEMPERATURE: float32 cannot sample there (NaN log-probs, a 500 when encoded)."""
    from seekrl.types import MIN_TEMPERATURE

    if value is not None and 0 < value < MIN_TEMPERATURE:
        raise HTTPError(400, f"{param}={value} is too small to sample with; send 0 for greedy decoding or at least "
                             f"{MIN_TEMPERATURE}", param)


def check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
