"""Old home of the MCP search server; it lives in seekrl/servers/mcp.py now.

Kept so `from seekrl.tools.mcp_server import make_mcp_server` and
`python -m seekrl.tools.mcp_server --index DIR [--stdio]` (configs may name it) still work.
"""

from __future__ import annotations

from seekrl.servers.mcp import MAX_TOPK, TOKEN_ENV, main, make_mcp_server, serve_mcp

__all__ = ["make_mcp_server", "serve_mcp", "TOKEN_ENV", "MAX_TOPK", "main"]

if __name__ == "__main__":
    main()
