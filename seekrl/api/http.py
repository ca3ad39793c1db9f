"""What seekrl's HTTP clients share: one client per event loop.

An httpx.AsyncClient's pooled connections belong to the event loop that opened them; a client
used from another loop (a second `asyncio.run`, evaluation after training) fails. `PerLoop`
keeps one value (a client, or a client with its semaphore) for the loop that runs now and makes a
new one when another loop asks:

    clients = PerLoop(lambda: httpx.AsyncClient(timeout=30))
    resp = await clients.get().post(url, json=body)
    await clients.aclose()            # closes the current value's client, if any
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerLoop"]

T = TypeVar("T")


class PerLoop(Generic[T]):
    def __init__(self, make: Callable[[], T], client_of: Callable[[T], object] = lambda value: value):
        self._make, self._client_of = make, client_of
        self._loop: asyncio.AbstractEventLoop | None = None
        self.value: T | None = None

    def get(self) -> T:
        """The running loop's value, made on first use in that loop (call from a coroutine)."""
        loop = asyncio.get_running_loop()
        if self.value is None or self._loop is not loop:
            self._loop, self.value = loop, self._make()
        return self.value

    async def aclose(self) -> None:
        """Close the current value's client (`client_of(value).aclose()`) and forget it."""
        if self.value is not None:
            value, self.value = self.value, None
            await self._client_of(value).aclose()

    def forget(self) -> None:
        """Drop the current value without closing it (its loop is gone)."""
        self.value = None
