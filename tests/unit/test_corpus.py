"""seekrl.data.corpus: the Search-R1 corpus format and the HotpotQA / 2Wiki converters."""

from __future__ import annotations

import json

import pytest

from seekrl.data import resolve_data_dir
from seekrl.data.corpus import (
    Document,
    hotpotqa_corpus,
    hotpotqa_gold_titles,
    read_corpus,
    twowiki_corpus,
    twowiki_gold_titles,
    write_corpus,
)

DATA = resolve_data_dir()
needs_hotpot = pytest.mark.skipif(not (DATA / "hotpotqa").is_dir(), reason=f"shared data not found at {DATA}")
needs_2wiki = pytest.mark.skipif(not (DATA / "2wikimultihopqa").is_dir(), reason=f"shared data not found at {DATA}")


def test_document_title_text_split():
    d = Document("7", '"Ed Wood"\nEdward Davis Wood Jr. was an American filmmaker.\nSecond line.')
    assert d.title == "Ed Wood"
    assert d.text == "Edward Davis Wood Jr. was an American filmmaker.\nSecond line."
    assert Document.from_title_text("7", "Ed Wood", "x") == Document("7", '"Ed Wood"\nx')
    # unquoted title line (some corpora), title-only document
    assert Document("1", "Plain\nbody").title == "Plain"
    assert Document("1", '"Only"').text == ""
    # a title that itself contains quotes keeps them
    assert Document.from_title_text("2", 'The "Boss"', "t").title == 'The "Boss"'


def test_write_read_round_trip(tmp_path):
    docs = [Document.from_title_text(str(i), f"T{i}", f"text {i} \u00e9") for i in range(3)]
    path = write_corpus(docs, tmp_path / "c.jsonl")
    assert read_corpus(path) == docs
    assert json.loads(path.read_text().splitlines()[0]) == {"id": "0", "contents": '"T0"\ntext 0 \u00e9'}


def test_read_errors_name_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "0", "contents": "\\"A\\"\\na"}\n\n{"id": "1", "contents": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: invalid JSON"):
        read_corpus(p)
    p.write_text('{"id": "0", "text": "no contents"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: missing 'contents'"):
        read_corpus(p)
    p.write_text('["a", "b"]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: expected an object"):
        read_corpus(p)
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        read_corpus(tmp_path / "missing.jsonl")


def test_read_missing_id_is_line_position(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"contents": "\\"A\\"\\na"}\n{"id": 5, "contents": "\\"B\\"\\nb"}\n')
    assert [d.id for d in read_corpus(p)] == ["0", "5"]


@needs_hotpot
def test_hotpotqa_corpus_has_14903_distinct_paragraphs():
    docs = hotpotqa_corpus()
    assert len(docs) == 14_903
    assert len({(d.title, d.text) for d in docs}) == 14_903
    assert [d.id for d in docs[:3]] == ["0", "1", "2"]
    # the first paragraph of the first dev question, sentences joined with "" (they carry their spaces)
    first = json.loads((DATA / "hotpotqa/dev_distractor.jsonl").open().readline())
    title, sentences = first["context"][0]
    assert docs[0].title == title and docs[0].text == "".join(sentences)
    assert docs[0].contents == f'"{title}"\n' + "".join(sentences)


@needs_hotpot
def test_hotpotqa_gold_titles_from_facts_or_supporting_titles():
    assert hotpotqa_gold_titles({"supporting_facts": [["A", 0], ["B", 2], ["A", 1]]}) == ["A", "B"]
    assert hotpotqa_gold_titles({"supporting_facts": None, "supporting_titles": ["X", "Y"]}) == ["X", "Y"]
    rows = [json.loads(line) for line in (DATA / "hotpotqa/dev_distractor.jsonl").open()]
    assert sum(r["supporting_facts"] is None for r in rows) == 302
    titles = {d.title for d in hotpotqa_corpus()}
    for r in rows:  # every gold paragraph is in the corpus
        gold = hotpotqa_gold_titles(r)
        assert gold and all(t in titles for t in gold), r["_id"]


@needs_2wiki
def test_twowiki_corpus():
    docs = twowiki_corpus()
    rows = json.loads((DATA / "2wikimultihopqa/dev500_gold_context.json").read_text())
    entries = {tuple(s.strip() for s in e.partition("\n")[::2]) for r in rows for e in r["golden_context"]}
    assert len(docs) == len(entries) > 500
    d = next(d for d in docs if d.title == "Panam Paduthum Padu")
    assert d.text.startswith("Panam Paduthum Padu is a 1954 Indian Tamil")  # leading space stripped
    assert twowiki_gold_titles(rows[0])[:2] == ["Panam Paduthum Padu", "Secret Enemies"]


def test_corpus_text_rows_group_passages_and_reshuffle_each_pass():
    from seekrl.data.corpus import corpus_text_rows

    docs = [Document.from_title_text(str(i), f"T{i}", f"text {i}.") for i in range(10)]
    rows = corpus_text_rows(docs, per_row=4, passes=2, seed=3)
    assert [len(r["text"].split("\n\n")) for r in rows] == [4, 4, 2, 4, 4, 2]
    first, second = (sorted(p for r in rows[k:k + 3] for p in r["text"].split("\n\n")) for k in (0, 3))
    assert first == second == sorted(f"T{i}\ntext {i}." for i in range(10))  # each passage once per pass
    assert rows[:3] != rows[3:]  # a new order on the second pass
    assert corpus_text_rows(docs, per_row=4, passes=2, seed=3) == rows  # seeded
    with pytest.raises(ValueError, match="per_row >= 1"):
        corpus_text_rows(docs, per_row=0)


def test_corpus_files_per_file_lookup_and_one_line_error(tmp_path, monkeypatch):
    from seekrl.data import DATA_DIR_ENV, loaders

    env_dir, shared = tmp_path / "env", tmp_path / "shared"
    (env_dir / "hotpotqa").mkdir(parents=True)
    (shared / "hotpotqa").mkdir(parents=True)
    monkeypatch.setattr(loaders, "_candidate_dirs", lambda: [shared])
    monkeypatch.setenv(DATA_DIR_ENV, str(env_dir))
    row = {"context": [["T", ["One.", " Two."]]]}
    (env_dir / "hotpotqa/dev_distractor.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(FileNotFoundError) as err:  # extra_contexts.jsonl is nowhere
        hotpotqa_corpus()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("data file hotpotqa/extra_contexts.jsonl not found: tried ")
    assert f"${DATA_DIR_ENV}={env_dir} (no hotpotqa/extra_contexts.jsonl)" in msg
    assert f"{shared} (no hotpotqa/extra_contexts.jsonl)" in msg and DATA_DIR_ENV + "=<folder" in msg
    # the env dir lacks extra_contexts.jsonl: it comes from the shared dir, the dev file from env
    extra = {"context": [["U", ["Three."]], ["T", ["One.", " Two."]]]}
    (shared / "hotpotqa/extra_contexts.jsonl").write_text(json.dumps(extra) + "\n")
    assert [(d.title, d.text) for d in hotpotqa_corpus()] == [("T", "One. Two."), ("U", "Three.")]
    # data_dir given: only it
    with pytest.raises(FileNotFoundError) as err:
        twowiki_corpus(data_dir=tmp_path / "none")
    assert f"data_dir={tmp_path / 'none'} (no such folder)" in str(err.value)
    assert str(shared) not in str(err.value)


def test_hotpotqa_corpus_from_the_hub_when_no_dir_has_it(tmp_path, monkeypatch):
    import sys
    import types

    from seekrl.data import DATA_DIR_ENV, loaders

    monkeypatch.setattr(loaders, "_candidate_dirs", lambda: [tmp_path / "shared"])
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "env"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    hub_row = {"id": "q1", "question": "Q?", "answer": "yes", "type": "comparison", "level": "easy",
               "supporting_facts": {"title": ["T"], "sent_id": [0]},
               "context": {"title": ["T", "U"], "sentences": [["One.", " Two."], ["Three."]]}}
    calls = []

    def load_dataset(path, name=None, *, split=None):
        calls.append((path, name, split))
        return [dict(hub_row)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert [(d.title, d.text) for d in hotpotqa_corpus()] == [("T", "One. Two."), ("U", "Three.")]
    assert calls == [("hotpotqa/hotpot_qa", "distractor", "validation")]

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(FileNotFoundError) as err:
        hotpotqa_corpus()
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "env") in msg and str(tmp_path / "shared") in msg and "hub" in msg
