"""Recall of gold paragraphs on HotpotQA dev: BM25 (bm25s) vs dense (MiniLM + faiss), one run.

    python bench/retrieval_recall.py                               # all 1,225 dev questions
    python bench/retrieval_recall.py --limit 300 --dense-kind hnsw
    python bench/retrieval_recall.py --dense-index /tmp/hotpotqa-dense   # reuse (or cache) the embeddings

Corpus: the 14,903 distinct paragraphs of HotpotQA dev (seekrl.data.corpus.hotpotqa_corpus);
queries: the dev questions as they are (no rewriting). Gold paragraphs: the titles in
`supporting_facts` (or `supporting_titles`, 302 rows); a retrieved paragraph counts when its
title is a gold title. For k in 1, 3, 5:
- recall@k: per question, the fraction of its gold titles found in the top k, averaged;
- all@k: the share of questions with every gold title in the top k (2 gold titles per question,
  so all@1 is 0 by construction).

Embedding the corpus with all-MiniLM-L6-v2 on CPU takes minutes (reported as "embed s");
`--dense-index DIR` loads a dense index saved there, or builds it once and saves it there.
A flat index saved there also serves `--dense-kind hnsw` (the vectors are reused, not re-embedded).
Prints a markdown table, the command, machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seekrl.data import resolve_data_dir  # noqa: E402
from seekrl.data.corpus import hotpotqa_corpus, hotpotqa_gold_titles  # noqa: E402

KS = (1, 3, 5)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}; "
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) at the end")


def score(results, golds) -> dict[str, float]:
    out = {}
    for k in KS:
        fracs, alls = [], []
        for hits, gold in zip(results, golds):
            top = {d.title for d, _ in hits[:k]}
            found = sum(t in top for t in gold)
            fracs.append(found / len(gold))
            alls.append(found == len(gold))
        out[f"recall@{k}"] = sum(fracs) / len(fracs)
        out[f"all@{k}"] = sum(alls) / len(alls)
    return out


def dense_index(docs, args):
    from seekrl.retrieval.dense import DenseIndex, load_encoder

    t0 = time.perf_counter()
    encoder = load_encoder()
    load_s = time.perf_counter() - t0
    cache = Path(args.dense_index) if args.dense_index else None
    embed_s = None
    if cache and (cache / "meta.json").is_file():
        index = DenseIndex.load(cache, encoder=encoder)
        if [d.contents for d in index.docs] != [d.contents for d in docs]:
            raise SystemExit(f"{cache} indexes a different corpus; remove it or pick another folder")
        print(f"loaded dense index from {cache} ({index.faiss_kind})", file=sys.stderr)
        if index.faiss_kind != args.dense_kind:
            if index.faiss_kind != "flat":
                raise SystemExit(f"{cache} holds a {index.faiss_kind} index; only a flat one converts")
            emb_ND = index.index.reconstruct_n(0, len(docs))
            index = DenseIndex.from_embeddings(docs, emb_ND, kind=args.dense_kind, encoder=encoder)
    else:
        t0 = time.perf_counter()
        index = DenseIndex.build(docs, kind="flat", encoder=encoder, show_progress=True)
        embed_s = time.perf_counter() - t0
        if cache:
            index.save(cache)
        if args.dense_kind != "flat":
            emb_ND = index.index.reconstruct_n(0, len(docs))
            index = DenseIndex.from_embeddings(docs, emb_ND, kind=args.dense_kind, encoder=encoder)
    if args.dense_kind == "hnsw":
        index.ef_search = args.ef_search
    return index, load_s, embed_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=None, help="first N dev questions (default: all 1,225)")
    p.add_argument("--dense-kind", choices=["flat", "hnsw"], default="flat")
    p.add_argument("--ef-search", type=int, default=128, help="hnsw efSearch")
    p.add_argument("--dense-index", default=None, help="folder to load the dense index from, or to save it to")
    p.add_argument("--no-dense", action="store_true", help="BM25 only")
    p.add_argument("--out", default=None, help="also write the numbers as JSON")
    args = p.parse_args()

    rows = [json.loads(line) for line in open(resolve_data_dir() / "hotpotqa/dev_distractor.jsonl")]
    rows = rows[: args.limit] if args.limit else rows
    questions = [r["question"] for r in rows]
    golds = [hotpotqa_gold_titles(r) for r in rows]
    docs = hotpotqa_corpus()
    kmax = max(KS)
    table: dict[str, dict] = {}

    from seekrl.retrieval.bm25 import BM25Index

    t0 = time.perf_counter()
    bm25 = BM25Index.build(docs)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = bm25.search(questions, topk=kmax)
    search_s = time.perf_counter() - t0
    table["BM25 (bm25s, stemmed)"] = {**score(res, golds), "index s": build_s, "embed s": None,
                                      "search ms/q": 1000 * search_s / len(questions)}

    if not args.no_dense:
        index, _, embed_s = dense_index(docs, args)
        t0 = time.perf_counter()
        res = index.search(questions, topk=kmax)
        search_s = time.perf_counter() - t0
        ef = f", ef={args.ef_search}" if args.dense_kind == "hnsw" else ""
        name = f"dense (MiniLM-L6, {args.dense_kind}{ef})"
        table[name] = {**score(res, golds), "index s": None, "embed s": embed_s,
                       "search ms/q": 1000 * search_s / len(questions)}

    cols = [f"recall@{k}" for k in KS] + [f"all@{k}" for k in KS[1:]] + ["index s", "embed s", "search ms/q"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) and v <= 1 else f"{v:.1f}"  # noqa: E731
    print(f"\nHotpotQA dev: {len(questions)} questions, {len(docs):,} paragraphs, gold = supporting titles\n")
    print("| retriever | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, r in table.items():
        print(f"| {name} | " + " | ".join(fmt(r[c]) for c in cols) + " |")
    print("\n`embed s`: embedding the corpus ('-' = loaded from --dense-index); `search ms/q`: batched "
          "search of all questions (dense includes encoding the questions).")
    cmd = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    print(f"\ncommand: `{cmd}`  \nmachine: {machine()}  \ndate: {datetime.date.today().isoformat()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"questions": len(questions), "table": table, "command": cmd}, indent=2))


if __name__ == "__main__":
    main()
