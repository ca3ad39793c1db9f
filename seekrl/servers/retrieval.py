"""HTTP retrieval server speaking Search-R1's API (search_r1/search/retrieval_server.py).

    POST /retrieve  {"queries": [str, ...], "topk": int | null, "return_scores": bool}
      return_scores true:  {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}
      return_scores false: {"result": [[{"id", "contents"}, ...], ...]}
    GET /health     {"status": "ok"} (no token)
    GET /server_info  documents, limits, counters (token): requests, rejected (4xx), errors (5xx),
                      cancelled, searches, queries

Search-R1's own clients (`requests.post(url, json=payload).json()['result']`, then
`doc_item['document']['contents']`) work unchanged. Unknown payload keys are ignored, as there.
All queries of a request go to the index in one batched call.

Departures from Search-R1's server, all opt-in or error paths only:
- `topk` null (or absent) means `default_topk` (3, Search-R1's launch default); `topk` < 1 is
  a 422 (Search-R1 treats 0 as "default"); `topk` > `max_topk` is a 400 (not clamped, so a
  client never silently gets fewer documents than it asked for).
- Optional bearer token (401 with a JSON message when missing or wrong), request body limit
  (413), at most `max_queries` queries per request (400), readable one-line 422s for bad
  payloads and 400s for bodies that are not JSON / UTF-8, nest deeper than `max_depth` or hold a
  lone surrogate: api/guards.py's `Guard`, shared with the policy server.
- A failing search is a 500 `{"detail": ...}`, counted in /server_info's "errors" and logged.
- A client that disconnects before its answer has its search cancelled (counted as "cancelled";
  a search already running in LocalRetriever's thread finishes there, unread).

    seekrl serve retriever --index DIR      (or: from seekrl.servers.retrieval import serve)
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from seekrl.api.guards import (
    ClientGone,
    Guard,
    HTTPError,
    add_status_routes,
    cancel_on_disconnect,
    check_port,
    json_error,
    openapi_body,
    resolve_token,
)
from seekrl.retrieval.retriever import LocalRetriever, Retriever, SearchIndex, load_index

__all__ = ["QueryRequest", "make_app", "serve", "serve_retriever", "DEFAULT_TOPK", "TOKEN_ENV"]

log = logging.getLogger(__name__)

DEFAULT_TOPK = 3
TOKEN_ENV = "SEEKRL_RETRIEVER_TOKEN"


class QueryRequest(BaseModel):
    """Search-R1's request body (same field names, types and defaults)."""

    queries: list[str]
    topk: int | None = Field(default=None, ge=1)
    return_scores: bool = False


def _error(err: HTTPError) -> JSONResponse:
    """FastAPI's (and Search-R1's) error shape: {"detail": message}."""
    return json_error(err, {"detail": err.message})


def _result(results, return_scores: bool) -> list:
    if return_scores:
        return [[{"document": d.to_dict(), "score": s} for d, s in hits] for hits in results]
    return [[d.to_dict() for d, _ in hits] for hits in results]


def make_app(
    retriever_or_index: Retriever | SearchIndex,
    token: str | None = None,
    max_topk: int = 50,
    max_body_bytes: int = 1_000_000,
    max_queries: int = 256,
    default_topk: int = DEFAULT_TOPK,
    max_depth: int = 32,
) -> FastAPI:
    """A FastAPI app serving `retriever_or_index` (an async Retriever, or a BM25/dense index that
    is wrapped in a LocalRetriever) on Search-R1's /retrieve API."""
    if not callable(getattr(retriever_or_index, "search", None)):
        raise TypeError(f"make_app needs a Retriever or an index with .search, got {type(retriever_or_index).__name__}")
    if inspect.iscoroutinefunction(retriever_or_index.search):
        retriever = retriever_or_index
    else:
        retriever = LocalRetriever(retriever_or_index)
    docs = getattr(getattr(retriever, "index", None), "docs", None)
    guard = Guard(token=token, max_body_bytes=max_body_bytes, max_depth=max_depth)
    guard.stats.update(searches=0, queries=0)

    app = FastAPI(title="seekrl retriever", summary="Search-R1 compatible /retrieve API")
    app.state.retriever = retriever
    app.state.guard = guard
    app.state.stats = guard.stats

    def info() -> dict:
        limits = {"max_topk": max_topk, "default_topk": default_topk, "max_queries": max_queries}
        return {"documents": len(docs) if docs is not None else None, "limits": limits}

    add_status_routes(app, guard, _error, info)

    async def search(request: Request, queries: list[str], topk: int) -> list:
        """One batched search; a failure is a 500 naming it, a gone client a ClientGone."""
        guard.stats["searches"] += 1
        guard.stats["queries"] += len(queries)
        try:
            return await cancel_on_disconnect(request, retriever.search(queries, topk))
        except ClientGone:
            raise
        except Exception as e:  # a server stays up; the client gets the reason
            log.exception("retrieval failed for %d queries", len(queries))
            raise HTTPError(500, f"retrieval failed: {type(e).__name__}: {e}") from None

    async def handle(request: Request) -> JSONResponse:
        # 1. auth before reading any of the body, 2. its size, 3. JSON, 4. the schema
        shape = ' {"queries": [...], "topk": int, "return_scores": bool}'
        req = await guard.validated_body(request, QueryRequest, status=422, shape=shape)
        topk = req.topk if req.topk is not None else default_topk
        if topk > max_topk:
            raise HTTPError(400, f"topk={topk} is over this server's limit of {max_topk}", "topk")
        if len(req.queries) > max_queries:
            raise HTTPError(400, f"{len(req.queries)} queries in one request; this server's limit is {max_queries}", "queries")
        results = await search(request, req.queries, topk) if req.queries else []
        return JSONResponse({"result": _result(results, req.return_scores)})

    @app.post("/retrieve", openapi_extra=openapi_body(QueryRequest))
    async def retrieve(request: Request):
        return await guard.answer(request, handle, _error)

    return app


def serve(
    index_dir: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    **app_kwargs,
) -> None:
    """Load the index in `index_dir` and serve it with uvicorn until interrupted."""
    import uvicorn

    index = load_index(index_dir)
    app = make_app(index, token=token, **app_kwargs)
    log.info("serving %s (%d documents) on http://%s:%d/retrieve", index_dir, len(index.docs), host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")


def serve_retriever(index: str, host: str = "127.0.0.1", port: int = 8000, token: str | None = None) -> None:
    """`seekrl serve retriever`: the index folder `index` on Search-R1's POST /retrieve API (blocks
    until Ctrl-C). Without `token`, $SEEKRL_RETRIEVER_TOKEN is used when set (keeps the secret out of argv)."""
    if not (Path(index) / "meta.json").is_file():
        raise ValueError(f"{index!r} is not an index folder (no meta.json); build one with `seekrl index build`")
    check_port(port)
    token = resolve_token(token, TOKEN_ENV, host, "the retriever")
    serve(index, host=host, port=port, token=token)


def run_from_args(args: argparse.Namespace) -> None:
    serve_retriever(args.index, host=args.host, port=args.port, token=args.token)
