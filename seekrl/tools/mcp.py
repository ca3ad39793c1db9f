"""The tools of any MCP server as seekrl Tools.

    tools = await load_mcp_tools("http://127.0.0.1:8001/mcp", token="...")       # streamable HTTP
    tools = await load_mcp_tools("python -m seekrl.servers.mcp --index DIR --stdio")  # stdio
    executor = ToolExecutor(ToolRegistry(tools))

`server` is a streamable-HTTP URL (http:// or https://) or a stdio command line, split with
`shlex`: a first word ending in ".py" runs under this interpreter (`sys.executable`), and so does
a first word "python" / "python3", so a server started from a training run sees the same
environment; any other command runs as it is (`npx ...`, `uvx ...`). The child process gets this
process's environment.

Each MCP tool becomes an `MCPTool`: `name`, `description`, `parameters` (the server's
inputSchema, used as it is: the executor validates and string-coerces arguments against it, as
for local tools) and `policy` (default `ToolPolicy(timeout_s=timeout_s)`: no retries and no cache,
since a remote tool may have side effects; pass `policy=` to change that for all the server's
tools). Calling it runs `tools/call` and returns the text content blocks joined by newlines
(a resource block contributes its text, an image or binary block a short placeholder, a result
with only structured content its JSON). An error result (isError) raises `MCPToolError` with the
server's text, so the executor turns it into an error observation and counts it, like any tool
exception; an unreachable server raises `MCPConnectionError` with one line that names it.

Connections: the tools of one server share an `MCPConnection`, which keeps one fastmcp `Client`
session per event loop, opened on the first call and reused by every later call (concurrent calls
share it; the executor's `max_concurrency` bounds them). A session that died (server restarted,
child process exited) is reopened on the next call. `load_mcp_tools` closes the session it used to
list the tools, so it may run in a throwaway loop (`asyncio.run`) before training starts.
`aclose()` (on a tool or the connection) closes the session of the running loop; for stdio that
stops the child process.

fastmcp 4 API used: `Client(transport, timeout=, init_timeout=)`, `StreamableHttpTransport(url,
auth=token)` (fastmcp's BearerAuth: `Authorization: Bearer <token>` on every request),
with an `httpx_client_factory` that records HTTP error statuses for the messages (the SDK
reports a 401 only as "Server returned an error response"),
`StdioTransport(command, args, env=, keep_alive=False)`, `client.list_tools()` (mcp_types.Tool:
`.name`, `.description`, `.input_schema`) and `client.call_tool_mcp(name, args, timeout=)`
(mcp_types.CallToolResult: `.content`, `.structured_content`, `.is_error`), which returns error
results instead of raising so the server's text is kept whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from seekrl.errors import ServiceUnavailable
from seekrl.tools.base import ToolPolicy

__all__ = ["MCPConnection", "MCPConnectionError", "MCPTool", "MCPToolError", "load_mcp_tools", "result_text"]


class MCPConnectionError(ServiceUnavailable):
    """The MCP server could not be reached, refused the session, or failed to answer."""


class MCPToolError(RuntimeError):
    """The server ran the tool and it reported an error (an isError result); the message is its text."""


def _one_line(e: BaseException) -> str:
    """`Type: message` of an exception (or of the first one in an exception group), on one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    msg = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {msg}"[:400]


def result_text(result) -> str:
    """The text a `CallToolResult` gives the model (see module docstring)."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            mime = getattr(block, "mime_type", None) or getattr(getattr(block, "resource", None), "mime_type", None)
            parts.append(f"[{kind or 'unknown'} content{f' ({mime})' if mime else ''} omitted]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _stdio_argv(server: str) -> list[str]:
    argv = shlex.split(server)
    if not argv:
        raise ValueError("MCP server: empty command line")
    if argv[0].endswith(".py"):
        argv = [sys.executable, *argv]
    elif argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


@dataclass
class _Slot:  # the session of one event loop
    lock: asyncio.Lock
    client: Any = None


class MCPConnection:
    """One MCP server: a fastmcp `Client` session per event loop, opened lazily, reused (module docstring)."""

    def __init__(self, server: str, *, token: str | None = None, timeout_s: float = 30.0):
        server = server.strip()
        self.server = server
        self.is_http = server.startswith(("http://", "https://"))
        self.argv = None if self.is_http else _stdio_argv(server)
        if token and not self.is_http:
            raise ValueError(f"MCP server {server!r}: a token is only sent over HTTP, not to a stdio command")
        self.token = token
        self.timeout_s = timeout_s
        self._slots: dict[asyncio.AbstractEventLoop, _Slot] = {}
        self._http_error: str | None = None  # the last HTTP error status seen (for messages)

    def __repr__(self) -> str:  # never shows the token
        return f"MCPConnection({self.server!r})"

    def _new_client(self):
        from fastmcp import Client

        if self.is_http:
            from fastmcp.client.transports import StreamableHttpTransport

            transport = StreamableHttpTransport(self.server, auth=self.token or None, httpx_client_factory=self._http_client)
        else:
            from fastmcp.client.transports import StdioTransport

            transport = StdioTransport(self.argv[0], self.argv[1:], env=dict(os.environ), keep_alive=False)
        return Client(transport, timeout=self.timeout_s, init_timeout=self.timeout_s)

    def _http_client(self, headers=None, auth=None, timeout=None, **kwargs):
        """fastmcp's default httpx client, plus a hook that keeps the last HTTP error status:
        the MCP SDK reports a 401 or a 404 only as "Server returned an error response"."""
        import httpx2

        async def record(response) -> None:
            if response.status_code >= 400:
                self._http_error = f"HTTP {response.status_code} {response.reason_phrase}".strip()

        timeout = timeout or httpx2.Timeout(30.0, read=300.0)
        return httpx2.AsyncClient(headers=headers, auth=auth, timeout=timeout, event_hooks={"response": [record]}, **kwargs)

    async def client(self):
        """The connected session of the running event loop (opened now if there is none, or it died)."""
        loop = asyncio.get_running_loop()
        slot = self._slots.get(loop)
        if slot is None:
            self._slots = {lp: s for lp, s in self._slots.items() if not lp.is_closed()}  # forget dead loops
            slot = self._slots[loop] = _Slot(asyncio.Lock())
        if slot.client is not None and slot.client.is_connected():
            return slot.client
        async with slot.lock:
            if slot.client is not None and slot.client.is_connected():
                return slot.client
            if slot.client is not None:  # the session died: start a fresh one
                old, slot.client = slot.client, None
                with suppress(Exception):
                    await old.close()
            client = self._new_client()
            self._http_error = None
            try:
                await asyncio.wait_for(client.__aenter__(), timeout=self.timeout_s + 5)
            except asyncio.CancelledError:
                raise
            except asyncio.TimeoutError:
                with suppress(Exception):
                    await client.close()
                raise MCPConnectionError(f"cannot connect to MCP server {self.server}: no answer in {self.timeout_s:g} s") from None
            except Exception as e:
                with suppress(Exception):
                    await client.close()
                raise MCPConnectionError(f"cannot connect to MCP server {self.server}: {_one_line(e)}{self._hint(e)}") from e
            slot.client = client
            return client

    def _hint(self, e: BaseException) -> str:
        if not self.is_http:
            return f" (command: {shlex.join(self.argv)}; its stderr says why)"
        err = self._http_error
        if err is None:
            return ""
        if err.startswith(("HTTP 401", "HTTP 403")):
            return f" ({err}: a missing or wrong bearer token)"
        if err.startswith("HTTP 404"):
            return f" ({err}: is the path right? fastmcp serves /mcp)"
        return f" ({err})"

    async def list_tools(self) -> list:
        client = await self.client()
        try:
            return await client.list_tools()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise MCPConnectionError(f"MCP server {self.server}: tools/list failed: {_one_line(e)}") from e

    async def call_tool(self, name: str, args: dict) -> str:
        """Run `name` on the server; its text (see `result_text`), or MCPToolError for an error result."""
        client = await self.client()
        try:
            result = await client.call_tool_mcp(name, args, timeout=self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise MCPConnectionError(f"MCP server {self.server}: call to '{name}' failed: {_one_line(e)}") from e
        text = result_text(result)
        if result.is_error:
            raise MCPToolError(text.strip() or f"'{name}' reported an error")
        return text

    async def aclose(self) -> None:
        """Close the running loop's session (stops a stdio server); the next call opens a new one."""
        slot = self._slots.pop(asyncio.get_running_loop(), None)
        if slot is not None and slot.client is not None:
            with suppress(Exception):
                await slot.client.close()


@dataclass
class MCPTool:
    """One tool of an MCP server, behind the seekrl `Tool` protocol."""

    name: str
    description: str
    parameters: dict  # the server's inputSchema
    policy: ToolPolicy
    connection: MCPConnection = field(repr=False)

    async def __call__(self, **kwargs: Any) -> str:
        return await self.connection.call_tool(self.name, kwargs)

    async def aclose(self) -> None:
        await self.connection.aclose()


async def load_mcp_tools(
    server: str, *, token: str | None = None, policy: ToolPolicy | None = None, timeout_s: float = 30.0
) -> list[MCPTool]:
    """The tools of the MCP server at `server` (an http(s) URL or a stdio command line), sharing one connection."""
    conn = MCPConnection(server, token=token, timeout_s=timeout_s)
    try:
        listed = await conn.list_tools()
    finally:
        await conn.aclose()  # the first call opens the session of the loop it runs in
    pol = policy or ToolPolicy(timeout_s=timeout_s)
    schema = {"type": "object", "properties": {}}
    return [MCPTool(t.name, t.description or "", dict(t.input_schema or schema), pol, conn) for t in listed]
