"""Old home of the retrieval server; it lives in seekrl/servers/retrieval.py now.

Kept so `from seekrl.retrieval.server import make_app, serve` still works.
"""

from __future__ import annotations

from seekrl.servers.retrieval import DEFAULT_TOPK, QueryRequest, make_app, serve

__all__ = ["QueryRequest", "make_app", "serve", "DEFAULT_TOPK"]
