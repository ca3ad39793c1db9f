"""BM25 index over a corpus of `Document`s, on bm25s (eager sparse scoring, Lucene's BM25).

Tokenization: bm25s's tokenizer (lowercase, words of 2+ characters), English stopwords and
PyStemmer's English (Snowball) stemmer -- the same analysis for documents and queries. Scores
are bm25s's defaults (method "lucene", k1=1.5, b=0.75); Search-R1's BM25 is Pyserini/Lucene
(k1=0.9, b=0.4), so scores differ in scale, not in kind.

On disk (`save(dir)`): bm25s's own files (params/vocab json + sparse matrix .npy, no pickle),
`corpus.jsonl` (Search-R1 format) and `meta.json` `{"kind": "bm25", ...}`.

    idx = BM25Index.build(read_corpus("corpus.jsonl")); idx.save("index/")
    BM25Index.load("index/").search(["who wrote hamlet"], topk=3)

JAX: bm25s imports jax at its own import when jax is installed, and runs a top-k with it. On a
GPU machine, JAX would then take 75% of the GPU memory in every process that searches (its
default preallocation), beside the policy. This module sets `JAX_PLATFORMS=cpu` before that
import, unless the user set it, and retrieves with bm25s's numpy top-k, so JAX never touches the
GPU here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before bm25s imports jax: see the module docstring
import bm25s  # noqa: E402
import numpy as np  # noqa: E402
import Stemmer  # noqa: E402

from seekrl.data.corpus import Document, read_corpus, read_index_meta, write_corpus  # noqa: E402

__all__ = ["BM25Index"]

_STOPWORDS = "en"
_STEMMER_LANG = "english"


class BM25Index:
    """Sparse lexical index: `build(docs)`, `save(dir)` / `load(dir)`, batched `search`."""

    kind = "bm25"

    def __init__(self, model: bm25s.BM25, docs: list[Document]):
        self.model = model
        self.docs = docs
        self._stemmer = Stemmer.Stemmer(_STEMMER_LANG)

    def __len__(self) -> int:
        return len(self.docs)

    def _tokenize(self, texts: Sequence[str], show_progress: bool = False) -> list[list[str]]:
        return bm25s.tokenize(
            list(texts), stopwords=_STOPWORDS, stemmer=self._stemmer, return_ids=False, show_progress=show_progress
        )

    @classmethod
    def build(cls, docs: Sequence[Document], show_progress: bool = False) -> BM25Index:
        if not docs:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        index = cls(bm25s.BM25(), list(docs))
        tokens = index._tokenize([d.contents for d in index.docs], show_progress=show_progress)
        index.model.index(tokens, show_progress=show_progress)
        return index

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save(str(path))
        write_corpus(self.docs, path / "corpus.jsonl")
        meta = {
            "kind": self.kind,
            "num_docs": len(self.docs),
            "bm25s_version": getattr(bm25s, "__version__", "unknown"),
            "stopwords": _STOPWORDS,
            "stemmer": _STEMMER_LANG,
        }
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> BM25Index:
        path = Path(path)
        meta = read_index_meta(path, cls.kind)
        model = bm25s.BM25.load(str(path), load_corpus=False)
        docs = read_corpus(path / "corpus.jsonl")
        if len(docs) != meta.get("num_docs", len(docs)):
            raise ValueError(f"{path}: corpus.jsonl has {len(docs)} documents, meta.json says {meta['num_docs']}")
        return cls(model, docs)

    def search(self, queries: Sequence[str], topk: int) -> list[list[tuple[Document, float]]]:
        """Top-`topk` documents (best first) with their BM25 scores, for each query. A query with
        no known term gets no results (like Lucene), not arbitrary zero-score documents."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        k = min(topk, len(self.docs))
        tokens = self._tokenize(queries)
        # bm25s drops tokens it does not know; a query left empty would be an error, so skip it
        vocab = self.model.vocab_dict
        known = [[t for t in q if t in vocab] for q in tokens]
        rows = [i for i, q in enumerate(known) if q]
        out: list[list[tuple[Document, float]]] = [[] for _ in queries]
        if rows:
            ids, scores = self.model.retrieve([known[i] for i in rows], k=k, show_progress=False, n_threads=1,
                                             backend_selection="numpy")
            ids, scores = np.asarray(ids), np.asarray(scores)
            for r, i in enumerate(rows):
                out[i] = [(self.docs[int(j)], float(s)) for j, s in zip(ids[r], scores[r]) if s > 0]
        return out
