"""Retrieval for search agents: BM25 (bm25s) and dense (sentence-transformers + faiss) indices over
a Search-R1 corpus (seekrl/data/corpus.py), and the async Retriever API (in-process or HTTP). The
Search-R1 compatible `POST /retrieve` server is seekrl/servers/retrieval.py.

Heavy dependencies (bm25s, faiss, sentence-transformers) load only when the module that needs
them is imported: `from seekrl.retrieval.bm25 import BM25Index`, etc.
"""

from seekrl.retrieval.retriever import HTTPRetriever, LocalRetriever, Retriever, RetrieverError, load_index

__all__ = ["Retriever", "LocalRetriever", "HTTPRetriever", "RetrieverError", "load_index"]
