"""Old home of the servers' shared checks; they live in seekrl/servers/guards.py now.

Kept so `from seekrl.serving import ...` still works. `expected_authorization` / `check_bearer` /
`read_json_body` are the old function-style API over the same checks a `Guard` makes (the
bearer scheme is case-insensitive now, and bodies get the depth / surrogate checks).
"""

from __future__ import annotations

from typing import Any

from seekrl.servers.guards import (
    LOOPBACK,
    Guard,
    HTTPError,
    check_port,
    check_token,
    resolve_token,
    validation_message,
)

__all__ = [
    "LOOPBACK",
    "HTTPError",
    "expected_authorization",
    "check_bearer",
    "read_json_body",
    "validation_message",
    "resolve_token",
    "check_port",
]


def expected_authorization(token: str | None) -> bytes | None:
    """The Authorization header a request must carry, or None when no token is set."""
    return f"Bearer {token}".encode() if token else None


def check_bearer(headers, expected: bytes | None) -> None:
    """Raise 401 unless `headers` carry the bearer token of `expected` (from expected_authorization)."""
    check_token(headers, expected.decode().partition(" ")[2] if expected else None)


async def read_json_body(request, max_body_bytes: int) -> Any:
    """The request's JSON body: 413 past `max_body_bytes`, 400 if not JSON (no auth check)."""
    return await Guard(max_body_bytes=max_body_bytes).json_body(request)
