"""The Retriever protocol and its two implementations: in-process and over HTTP.

    Retriever.search(queries: list[str], topk: int) -> list[list[tuple[Document, float]]]  (async)

`LocalRetriever(index)` runs a BM25/dense index's (synchronous, CPU-bound) batched search in a
worker thread, so the event loop that drives rollouts keeps going. `HTTPRetriever(url)` talks to
any server speaking Search-R1's `POST /retrieve` API (ours in server.py, or Search-R1's own
retrieval_server.py): it always asks for `return_scores: true` and reads
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`.
`load_index(dir)` opens an index folder written by `BM25Index.save` / `DenseIndex.save`.

    retriever = HTTPRetriever("http://127.0.0.1:8000/retrieve")
    results = await retriever.search(["capital of France"], topk=3)
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from seekrl.api.http import PerLoop
from seekrl.data.corpus import Document, read_index_meta
from seekrl.errors import ServiceUnavailable
from seekrl.httpclient import async_client, send

__all__ = ["Retriever", "SearchIndex", "LocalRetriever", "HTTPRetriever", "RetrieverError", "RetrieverUnavailable", "load_index"]

Results = list[list[tuple[Document, float]]]


class RetrieverError(RuntimeError):
    """A retrieval server answered with an error or an unreadable response."""


class RetrieverUnavailable(RetrieverError, ServiceUnavailable):
    """The retrieval server could not be reached, or answered 5xx."""


@runtime_checkable
class Retriever(Protocol):
    async def search(self, queries: list[str], topk: int) -> Results: ...


@runtime_checkable
class SearchIndex(Protocol):
    """What BM25Index and DenseIndex provide: a synchronous, batched search."""

    docs: list[Document]

    def search(self, queries: Sequence[str], topk: int) -> Results: ...


class LocalRetriever:
    """An in-process index behind the async Retriever API (search runs in a worker thread)."""

    def __init__(self, index: SearchIndex):
        self.index = index

    async def search(self, queries: list[str], topk: int) -> Results:
        return await asyncio.to_thread(self.index.search, list(queries), topk)


def _parse_document(item: dict, where: str) -> Document:
    if not isinstance(item, dict):
        raise RetrieverError(f"{where}: expected a document object, got {type(item).__name__}")
    if "contents" in item:
        return Document(id=str(item.get("id", "")), contents=str(item["contents"]))
    if "title" in item or "text" in item:  # Pyserini-style {"title", "text"} documents
        return Document.from_title_text(str(item.get("id", "")), str(item.get("title", "")), str(item.get("text", "")))
    raise RetrieverError(f"{where}: document has neither 'contents' nor 'title'/'text': {sorted(item)}")


def parse_response(body: object, num_queries: int) -> Results:
    """Parse Search-R1's /retrieve response (with or without scores; 0.0 when absent)."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise RetrieverError(f"response is not {{'result': [...]}}: {str(body)[:200]}")
    result = body["result"]
    if len(result) != num_queries:
        raise RetrieverError(f"response has {len(result)} result lists for {num_queries} queries")
    out: Results = []
    for i, hits in enumerate(result):
        if not isinstance(hits, list):
            raise RetrieverError(f"result[{i}] is not a list")
        row = []
        for j, hit in enumerate(hits):
            where = f"result[{i}][{j}]"
            if isinstance(hit, dict) and "document" in hit:
                row.append((_parse_document(hit["document"], where), float(hit.get("score", 0.0))))
            else:
                row.append((_parse_document(hit, where), 0.0))
        out.append(row)
    return out


class HTTPRetriever:
    """Client of a Search-R1-compatible `POST /retrieve` endpoint.

    `url` is the full endpoint (".../retrieve"); a bare "http://host:port" gets "/retrieve"
    appended. `token` is sent as `Authorization: Bearer <token>`. One httpx.AsyncClient is kept
    per event loop (connection pooling); `aclose()` releases it. A request whose connection broke
    with no answer (a pooled connection the server closed) is sent again, twice at most
    (seekrl/httpclient.py), and counted in `stats["resent"]`.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0, max_connections: int = 64):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.token = token
        self.timeout = timeout
        self.max_connections = max_connections
        self.stats = {"resent": 0}
        self._clients = PerLoop(self._new_client)

    def _new_client(self):
        return async_client(token=self.token, timeout_s=self.timeout, max_connections=self.max_connections)

    def _resent(self) -> None:
        self.stats["resent"] += 1

    async def search(self, queries: list[str], topk: int) -> Results:
        import httpx

        if not queries:
            return []
        payload = {"queries": list(queries), "topk": topk, "return_scores": True}
        try:
            resp = await send(self._clients.get(), "POST", self.url, json=payload, on_resend=self._resent)
        except httpx.HTTPError as e:
            raise RetrieverUnavailable(f"retrieval request to {self.url} failed: {type(e).__name__}: {e}") from e
        if resp.status_code >= 500:
            raise RetrieverUnavailable(f"retrieval server {self.url} answered {resp.status_code}: {resp.text[:300]}")
        if resp.status_code != 200:
            raise RetrieverError(f"retrieval server {self.url} answered {resp.status_code}: {resp.text[:300]}")
        try:
            body = resp.json()
        except json.JSONDecodeError as e:
            raise RetrieverError(f"retrieval server {self.url} sent invalid JSON: {e}") from e
        return parse_response(body, len(queries))

    async def aclose(self) -> None:
        await self._clients.aclose()

    async def __aenter__(self) -> HTTPRetriever:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def load_index(path: str | os.PathLike, **kwargs) -> SearchIndex:
    """Open an index folder, choosing the class from meta.json's "kind" ("bm25" | "dense").
    Extra keyword arguments go to the class's `load` (e.g. `ef_search=` for dense)."""
    kind = read_index_meta(path).get("kind")
    if kind == "bm25":
        from seekrl.retrieval.bm25 import BM25Index

        return BM25Index.load(path, **kwargs)
    if kind == "dense":
        from seekrl.retrieval.dense import DenseIndex

        return DenseIndex.load(path, **kwargs)
    raise ValueError(f"{Path(path) / 'meta.json'}: unknown index kind {kind!r} (expected 'bm25' or 'dense')")
