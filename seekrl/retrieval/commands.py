"""The function behind `seekrl index build` (`seekrl serve retriever` is servers/retrieval.py).

    build_index("hotpotqa", "indexes/hotpotqa-bm25", kind="bm25")
    build_index("corpus.jsonl", "indexes/wiki-dense", kind="dense", dense_kind="hnsw")

`corpus` is a Search-R1 corpus jsonl path or a builtin name: "hotpotqa" (14,903 paragraphs of
HotpotQA dev) or "2wiki" (the gold paragraphs of the 2WikiMultihopQA dev sample), converted
from the shared data folder ($SEEKRL_DATA_DIR) on the fly. Bad input raises ValueError with
one line that says what to change.
"""

from __future__ import annotations

import time
from pathlib import Path

from seekrl.data.corpus import Document, hotpotqa_corpus, read_corpus, twowiki_corpus

__all__ = ["build_index", "load_corpus_arg", "BUILTIN_CORPORA"]

BUILTIN_CORPORA = {"hotpotqa": hotpotqa_corpus, "2wiki": twowiki_corpus}


def load_corpus_arg(corpus: str) -> list[Document]:
    """A builtin corpus name or a jsonl path -> documents."""
    if corpus in BUILTIN_CORPORA:
        try:
            return BUILTIN_CORPORA[corpus]()
        except FileNotFoundError as e:
            raise ValueError(f"builtin corpus {corpus!r}: {e}") from None
    path = Path(corpus)
    if not path.is_file():
        names = ", ".join(repr(n) for n in BUILTIN_CORPORA)
        raise ValueError(f"corpus {corpus!r} is neither a file nor a builtin corpus ({names})")
    docs = read_corpus(path)
    if not docs:
        raise ValueError(f"corpus {corpus!r} holds no documents")
    return docs


def build_index(corpus: str, out: str, kind: str = "bm25", dense_kind: str = "flat") -> None:
    """Build a BM25 or dense index over `corpus` and save it in the folder `out`."""
    if kind not in ("bm25", "dense"):
        raise ValueError(f"index kind must be 'bm25' or 'dense', got {kind!r}")
    if dense_kind not in ("flat", "hnsw"):
        raise ValueError(f"dense index kind must be 'flat' or 'hnsw', got {dense_kind!r}")
    out_path = Path(out)
    if out_path.exists() and not out_path.is_dir():
        raise ValueError(f"output {out!r} exists and is not a folder")
    if out_path.is_dir() and any(out_path.iterdir()) and not (out_path / "meta.json").is_file():
        raise ValueError(f"output folder {out!r} is not empty and holds no index; choose an empty or new folder")
    from rich.console import Console

    console = Console(stderr=True)
    docs = load_corpus_arg(corpus)
    console.print(f"[bold]index build[/bold]: {len(docs):,} documents from {corpus} -> {out} ({kind}"
                  + (f", {dense_kind}" if kind == "dense" else "") + ")")
    t0 = time.perf_counter()
    if kind == "bm25":
        from seekrl.retrieval.bm25 import BM25Index

        index = BM25Index.build(docs, show_progress=True)
    else:
        from seekrl.retrieval.dense import DenseIndex

        index = DenseIndex.build(docs, kind=dense_kind, show_progress=True)
    index.save(out_path)
    console.print(f"done in {time.perf_counter() - t0:.1f}s: {out_path / 'meta.json'}")
