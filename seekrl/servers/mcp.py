"""Local search as an MCP server, so DR-Tulu-style `<call_tool name="search">` runs fully offline.

    seekrl serve mcp --index indexes/hotpotqa-bm25            (streamable HTTP, 127.0.0.1:8001/mcp)
    python -m seekrl.servers.mcp --index DIR [--stdio] [--port 8001] [--topk 3]

One tool, `search(query: str, topk: int = 3) -> str`, over an index folder written by
`seekrl index build` (BM25 or dense, opened with `load_index`). It returns exactly the text the
in-process search tool gives (`seekrl.tools.search.format_passages`: Search-R1's
`Doc 1(Title: ...) text` lines; "No results." when nothing matches), so a policy trained against the MCP server and one
trained against the local tool see the same observations.

Built with fastmcp 4 (`FastMCP`, `@server.tool`, `run(transport="http" | "stdio")`); the
endpoint is `http://HOST:PORT/mcp`. Bearer token (HTTP only): the MCP SDK's bearer middleware
reads `Authorization: Bearer <token>` (scheme in any case, as RFC 7235 has it) and answers 401
without it; `GuardTokenVerifier` compares the token in constant time with api/guards.py's
`token_matches`, as the policy and retrieval servers do. Without `token`, $SEEKRL_MCP_TOKEN is
used when set, which keeps the secret out of argv. stdio needs no token: only the process that
started the server can talk to it. Request bodies are parsed by fastmcp, not by a `Guard`, but
they are bounded as the other servers' are: `BodyLimit` (ASGI middleware on the HTTP app) answers
413 with one line of JSON past `max_body_bytes` (--max-body-mb, default 1 MB), the declared
Content-Length first, then the bytes received (chunked uploads too).

A failing search (bad `topk`, an index error) is an MCP error result (isError), which the
client (seekrl.tools.mcp) turns into a counted tool error.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from seekrl.api.guards import check_port, resolve_token, token_matches
from seekrl.retrieval.retriever import LocalRetriever, load_index
from seekrl.servers.flags import index_flags
from seekrl.tools.search import format_passages

__all__ = ["make_mcp_server", "serve_mcp", "token_verifier", "BodyLimit", "body_limit", "TOKEN_ENV", "MAX_TOPK",
           "MAX_BODY_BYTES", "main"]

TOKEN_ENV = "SEEKRL_MCP_TOKEN"
MAX_TOPK = 50  # a request for more passages is an error, not silently clamped
MAX_BODY_BYTES = 1_000_000  # as the retrieval and policy servers


class BodyLimit:
    """ASGI middleware: an HTTP request body over `max_body_bytes` is answered 413 (one line of JSON,
    as the other servers' Guard does) before the app sees it. The declared Content-Length is checked
    first; otherwise the body is read (bounded) and handed on to the app whole."""

    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES):
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = int(max_body_bytes)

    async def _reject(self, send, message: str) -> None:
        import json

        body = json.dumps({"error": {"code": 413, "message": message}, "detail": message}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > limit:
            return await self._reject(send, f"request body of {declared} bytes is over the limit of {limit} bytes")
        if scope.get("method") in ("GET", "HEAD", "DELETE", "OPTIONS"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._reject(send, f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # http.disconnect, for the app's streaming answers

        return await self.app(scope, replay, send)


def body_limit(max_body_bytes: int = MAX_BODY_BYTES) -> list:
    """The middleware list that bounds an MCP HTTP app's bodies: `server.http_app(middleware=body_limit(n))`."""
    from starlette.middleware import Middleware

    return [Middleware(BodyLimit, max_body_bytes=max_body_bytes)]

log = logging.getLogger(__name__)


def token_verifier(token: str):
    """A fastmcp TokenVerifier accepting exactly `token` (constant-time compare)."""
    from fastmcp.server.auth import AccessToken, TokenVerifier

    class GuardTokenVerifier(TokenVerifier):
        async def verify_token(self, presented: str) -> AccessToken | None:
            if not token_matches(presented, token):
                return None
            return AccessToken(token=presented.strip(), client_id="seekrl", scopes=[])

    return GuardTokenVerifier()


def make_mcp_server(index_dir: str | os.PathLike, topk: int = 3, name: str = "seekrl-search", token: str | None = None):
    """A `FastMCP` server with one `search` tool over the index in `index_dir` (loaded now).

    `topk` is the tool's default number of passages; `token` makes the HTTP transport require
    `Authorization: Bearer <token>` (see `token_verifier`).
    """
    from fastmcp import FastMCP
    from fastmcp.exceptions import ToolError

    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be in 1..{MAX_TOPK}, got {topk}")
    retriever = LocalRetriever(load_index(index_dir))
    server = FastMCP(name, auth=token_verifier(token) if token else None)

    async def search(query: str, topk: int = topk) -> str:
        """Search the knowledge base and return the most relevant passages, one per line.

        Args:
            query: what to look for, in a few words.
            topk: how many passages to return.
        """
        if not query.strip():
            raise ToolError("search: the query is empty")  # ToolError: an expected error, logged without a traceback
        if not 1 <= topk <= MAX_TOPK:
            raise ToolError(f"search: topk must be in 1..{MAX_TOPK}, got {topk}")
        hits = (await retriever.search([query], topk))[0]
        return format_passages(hits) if hits else "No results."

    server.tool(search)
    return server


def serve_mcp(
    index_dir: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8001,
    transport: str = "http",
    token: str | None = None,
    topk: int = 3,
    name: str = "seekrl-search",
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Serve the index folder over MCP until interrupted: streamable HTTP at
    `http://host:port/mcp` (bodies over `max_body_bytes` answered 413), or stdio
    (`transport="stdio"`, for a client that starts this process)."""
    if transport not in ("http", "stdio"):
        raise ValueError(f"transport must be 'http' or 'stdio', got {transport!r}")
    if max_body_bytes < 1:
        raise ValueError(f"--max-body-mb must be > 0, got {max_body_bytes / 1e6:g}")
    if not (Path(index_dir) / "meta.json").is_file():
        raise ValueError(f"{str(index_dir)!r} is not an index folder (no meta.json); build one with `seekrl index build`")
    check_port(port)
    if transport == "stdio":  # no network, no token
        server = make_mcp_server(index_dir, topk=topk, name=name)
        server.run(transport="stdio", show_banner=False, log_level="warning")  # stdout is the protocol: no banner
        return
    token = resolve_token(token, TOKEN_ENV, host, "MCP")
    server = make_mcp_server(index_dir, topk=topk, name=name, token=token)
    log.info("serving %s over MCP on http://%s:%d/mcp", index_dir, host, port)
    server.run(transport="http", host=host, port=port, show_banner=False, log_level="warning",
               middleware=body_limit(max_body_bytes))


def run_from_args(args: argparse.Namespace) -> None:
    serve_mcp(args.index, host=args.host, port=args.port, transport="stdio" if args.stdio else "http", token=args.token,
              topk=args.topk, max_body_bytes=int(args.max_body_mb * 1e6))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m seekrl.servers.mcp", description="Serve a seekrl index as an MCP search tool.")
    index_flags(p, "mcp")
    args = p.parse_args(argv)
    try:
        run_from_args(args)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")


if __name__ == "__main__":
    main()
