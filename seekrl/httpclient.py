"""What every seekrl HTTP client shares: idle connections closed before the server closes them,
and a request whose connection broke with no answer sent again.

A server closes an idle keep-alive connection after a few seconds (uvicorn and vLLM: 5 s). httpx
keeps one for 5 s too, so a request can go out on a pooled connection just as the server closes
it: it fails with ReadError, WriteError or RemoteProtocolError although the server is healthy.
seekrl's clients close idle connections after `KEEPALIVE_S` (2 s), and `send` re-sends a request
that broke that way, `RESENDS` times at most, before the caller treats the server as unreachable.
Every request seekrl re-sends is idempotent (a search, a generation, a judge's reply, a scoring).

    client = async_client(token=token, timeout_s=30, max_connections=64)
    r = await send(client, "POST", url, json=body, on_resend=count)   # httpx.Response
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = ["KEEPALIVE_S", "RESENDS", "dropped_errors", "limits", "timeout", "async_client", "sync_client", "send"]

KEEPALIVE_S = 2.0  # below the servers' 5 s: the client closes an idle connection first
RESENDS = 2  # a third broken connection in a row is a server that is gone


def dropped_errors() -> tuple[type[Exception], ...]:
    """The errors of a connection that broke with no answer (not refused, not timed out)."""
    import httpx

    return (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


def limits(max_connections: int, max_keepalive: int | None = None) -> httpx.Limits:
    import httpx

    return httpx.Limits(max_connections=max_connections, keepalive_expiry=KEEPALIVE_S,
                        max_keepalive_connections=max_connections if max_keepalive is None else max_keepalive)


def timeout(timeout_s: float) -> httpx.Timeout:
    """`timeout_s` for the answer, at most 10 s to connect."""
    import httpx

    return httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def async_client(*, timeout_s: float, max_connections: int, token: str | None = None, max_keepalive: int | None = None,
                 **kwargs: Any) -> httpx.AsyncClient:
    """An httpx.AsyncClient with a bearer token (when given), these limits and `KEEPALIVE_S`."""
    import httpx

    return httpx.AsyncClient(headers=_headers(token), timeout=timeout(timeout_s),
                             limits=limits(max_connections, max_keepalive), **kwargs)


def sync_client(*, timeout_s: float, token: str | None = None, max_connections: int = 8, **kwargs: Any) -> httpx.Client:
    """The synchronous counterpart of `async_client`."""
    import httpx

    return httpx.Client(headers=_headers(token), timeout=timeout(timeout_s), limits=limits(max_connections), **kwargs)


async def send(client: httpx.AsyncClient, method: str, url: str, *, on_resend: Callable[[], None] | None = None,
               **kwargs: Any) -> httpx.Response:
    """`client.request(method, url, **kwargs)`, sent again (at most `RESENDS` times) when the
    connection broke with no answer; `on_resend()` is called before each re-send. Any other error,
    and the last broken connection, reach the caller."""
    dropped = dropped_errors()
    for attempt in range(RESENDS + 1):
        try:
            return await client.request(method, url, **kwargs)
        except dropped:
            if attempt == RESENDS:
                raise
            if on_resend is not None:
                on_resend()
    raise AssertionError("unreachable")
