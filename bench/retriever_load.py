"""Throughput and latency of the retrieval server under concurrent loopback clients, side by side
with rank-bm25 (BM25Okapi) and bm25s called in-process on the same corpus and queries.

    python bench/retriever_load.py                         # C=8, up to 2000 requests / 30 s per row
    python bench/retriever_load.py --concurrency 1 4 16 --batch 16 --requests 1000 --seconds 20

Setup: a BM25 index (bm25s, stemmed) over the 14,903 HotpotQA dev paragraphs is saved to a
temporary folder and served by `seekrl.servers.retrieval.serve` (one uvicorn worker) in a child
process on 127.0.0.1; the client is this process (httpx.AsyncClient, C concurrent tasks, one
keep-alive connection each). Queries: HotpotQA dev questions, cycled; topk=3.
Rows:
- HTTP single: each request carries 1 query; HTTP batch: each carries `--batch` queries.
  Each row runs until `--requests` requests or `--seconds` seconds, whichever comes first.
- in-process bm25s: `BM25Index.search` on one query at a time, and on `--batch` at a time.
- in-process rank-bm25: `BM25Okapi.get_top_n` (the library's documented usage, lowercase
  whitespace tokens), one query at a time, bounded by `--baseline-queries` / `--seconds`.
Latency is per request (HTTP) or per call (in-process); q/s counts queries.
Server and client share the machine's cores (2 here), so HTTP numbers include the client's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.retrieval_recall import machine  # noqa: E402
from seekrl.data import resolve_data_dir  # noqa: E402
from seekrl.data.corpus import hotpotqa_corpus  # noqa: E402

TOPK = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(name: str, mode: str, conc: int, lat_s: list[float], queries: int, wall: float) -> dict:
    lat = np.asarray(lat_s) * 1000
    return {
        "system": name, "mode": mode, "C": conc, "requests": len(lat_s), "queries": queries,
        "req/s": len(lat_s) / wall, "q/s": queries / wall,
        "p50 ms": float(np.percentile(lat, 50)), "p99 ms": float(np.percentile(lat, 99)),
    }


async def http_load(url: str, queries: list[str], batch: int, conc: int, max_requests: int, seconds: float) -> dict:
    import httpx

    lat: list[float] = []
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient, w: int) -> None:
        nonlocal sent
        while sent < max_requests and time.perf_counter() < deadline:
            i = sent
            sent += 1
            qs = [queries[(i * batch + j) % len(queries)] for j in range(batch)]
            t0 = time.perf_counter()
            r = await client.post(url, json={"queries": qs, "topk": TOPK, "return_scores": True})
            lat.append(time.perf_counter() - t0)
            r.raise_for_status()
            assert len(r.json()["result"]) == batch

    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await client.post(url, json={"queries": queries[:batch], "topk": TOPK})  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client, w) for w in range(conc)))
        wall = time.perf_counter() - t0
    mode = "single" if batch == 1 else f"batch {batch}"
    return summary("seekrl HTTP server (bm25s)", mode, conc, lat, len(lat) * batch, wall)


def inproc(name: str, fn, queries: list[str], batch: int, max_calls: int, seconds: float) -> dict:
    lat = []
    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    i = 0
    while i < max_calls and time.perf_counter() < deadline:
        qs = [queries[(i * batch + j) % len(queries)] for j in range(batch)]
        t1 = time.perf_counter()
        fn(qs)
        lat.append(time.perf_counter() - t1)
        i += 1
    wall = time.perf_counter() - t0
    return summary(name, "single" if batch == 1 else f"batch {batch}", 1, lat, len(lat) * batch, wall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[8])
    p.add_argument("--batch", type=int, default=16, help="queries per request in the batched rows")
    p.add_argument("--requests", type=int, default=2000, help="at most this many requests per HTTP row")
    p.add_argument("--seconds", type=float, default=30.0, help="at most this long per row")
    p.add_argument("--baseline-queries", type=int, default=300, help="at most this many rank-bm25 queries")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    rows = [json.loads(line) for line in open(resolve_data_dir() / "hotpotqa/dev_distractor.jsonl")]
    queries = [r["question"] for r in rows]
    docs = hotpotqa_corpus()
    from seekrl.retrieval.bm25 import BM25Index

    index = BM25Index.build(docs)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        index.save(tmp)
        port = free_port()
        code = f"from seekrl.servers.retrieval import serve; serve({tmp!r}, port={port})"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, **quiet)
        try:
            import httpx

            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            else:
                raise SystemExit("server did not start")
            for conc in args.concurrency:
                for batch in (1, args.batch):
                    row = http_load(url + "/retrieve", queries, batch, conc, args.requests, args.seconds)
                    results.append(asyncio.run(row))
                    print(results[-1], file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    search = lambda qs: index.search(qs, TOPK)  # noqa: E731
    results.append(inproc("bm25s in-process", search, queries, 1, args.requests, args.seconds))
    results.append(inproc("bm25s in-process", search, queries, args.batch, args.requests, args.seconds))

    from rank_bm25 import BM25Okapi

    t0 = time.perf_counter()
    okapi = BM25Okapi([d.contents.lower().split() for d in docs])
    okapi_build = time.perf_counter() - t0
    contents = [d.contents for d in docs]
    results.append(inproc("rank-bm25 BM25Okapi in-process",
                          lambda qs: [okapi.get_top_n(q.lower().split(), contents, n=TOPK) for q in qs],
                          queries, 1, args.baseline_queries, args.seconds))
    for r in results:
        print(r, file=sys.stderr)

    cols = ["system", "mode", "C", "requests", "queries", "q/s", "req/s", "p50 ms", "p99 ms"]
    print(f"\nHotpotQA dev questions against {len(docs):,} paragraphs, topk={TOPK}; rank-bm25 index build "
          f"{okapi_build:.1f}s\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    cmd = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    print(f"\ncommand: `{cmd}`  \nmachine: {machine()}  \ndate: {datetime.date.today().isoformat()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": results, "command": cmd}, indent=2))


if __name__ == "__main__":
    main()
