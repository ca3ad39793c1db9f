"""Retrieval corpora in Search-R1's jsonl format, and converters from the multi-hop QA sets.

A corpus file holds one document per line, `{"id": str, "contents": "\\"Title\\"\\ntext"}`,
exactly as Search-R1's wiki-18.jsonl: the first line of `contents` is the title in double
quotes, the rest is the passage text. `Document.title` / `Document.text` split it back.

Converters (from the files in ../shared/data, see its README):
- `hotpotqa_corpus`: the distinct paragraphs of HotpotQA dev (distractor setting) plus
  extra_contexts.jsonl. A paragraph's text is its sentences joined with "" -- HotpotQA's own
  concatenation: every sentence after the first already starts with its separating space.
  Deduplicated by (title, text) this gives 14,903 documents; joining with " " would merge 135
  paragraphs that differ only in whitespace (14,768), so "" keeps the published paragraphs.
- `twowiki_corpus`: the gold paragraphs of the 2WikiMultihopQA dev sample
  (`golden_context` entries "Title\\n text"), deduplicated the same way.

Ids are the 0-based position in the corpus, as strings (Search-R1's wiki-18 uses the same).

The input files are looked up per file as the builtin data sets are (`locate_data_file`): the
`data_dir` argument alone, else $SEEKRL_DATA_DIR, then ./../shared/data and <repo root>/../shared/data
(no hub fallback); when none has one, a one-line FileNotFoundError names the dirs tried.

    python -c "from seekrl.data.corpus import *; write_corpus(hotpotqa_corpus(), 'hotpotqa.jsonl')"
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seekrl.data.loaders import DATA_DIR_ENV, builtin_rows, locate_data_file
from seekrl.errors import DataError

__all__ = [
    "Document",
    "read_corpus",
    "read_index_meta",
    "write_corpus",
    "corpus_text_rows",
    "hotpotqa_corpus",
    "twowiki_corpus",
    "hotpotqa_gold_titles",
    "twowiki_gold_titles",
    "HOTPOTQA_FILES",
    "TWOWIKI_FILE",
]

HOTPOTQA_FILES = ("hotpotqa/dev_distractor.jsonl", "hotpotqa/extra_contexts.jsonl")
TWOWIKI_FILE = "2wikimultihopqa/dev500_gold_context.json"


@dataclass(frozen=True)
class Document:
    """One retrievable passage: `contents` is '"Title"\\ntext' (Search-R1's wiki-18 format)."""

    id: str
    contents: str

    @classmethod
    def from_title_text(cls, id: str, title: str, text: str) -> Document:
        return cls(id=str(id), contents=f'"{title}"\n{text}')

    @property
    def title(self) -> str:
        """The first line, without its surrounding double quotes."""
        first = self.contents.split("\n", 1)[0]
        return first[1:-1] if len(first) >= 2 and first[0] == '"' and first[-1] == '"' else first

    @property
    def text(self) -> str:
        """Everything after the first line ('' for a title-only document)."""
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) == 2 else ""

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "contents": self.contents}


def _iter_corpus(path: Path) -> Iterator[Document]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected an object with 'id' and 'contents', got {type(row).__name__}")
            if "contents" not in row:
                raise ValueError(f"{where}: missing 'contents' (Search-R1 corpus rows are {{'id', 'contents'}})")
            if not isinstance(row["contents"], str):
                raise ValueError(f"{where}: 'contents' must be a string, got {type(row['contents']).__name__}")
            doc_id = row.get("id", lineno - 1)
            if not isinstance(doc_id, (str, int)):
                raise ValueError(f"{where}: 'id' must be a string or an integer, got {type(doc_id).__name__}")
            yield Document(id=str(doc_id), contents=row["contents"])


def read_corpus(path: str | os.PathLike) -> list[Document]:
    """Read a Search-R1 corpus jsonl. Blank lines are skipped; a missing id becomes the 0-based
    line number; errors name file:line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    return list(_iter_corpus(path))


def write_corpus(docs: Iterable[Document], path: str | os.PathLike) -> Path:
    """Write documents as Search-R1 corpus jsonl (one `{"id", "contents"}` per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d.to_dict(), ensure_ascii=False) + "\n")
    return path


def corpus_text_rows(docs: list[Document], per_row: int = 4, passes: int = 1, seed: int = 0) -> list[dict]:
    """Plain-text rows `{"text": ...}` (the language-modeling rows of `seekrl sft`) from a corpus:
    each row is `per_row` passages ("Title\ntext", blank line between), in a seeded random order
    that differs on each of `passes` passes, so a passage meets different neighbours."""
    if per_row < 1 or passes < 1:
        raise ValueError(f"corpus_text_rows needs per_row >= 1 and passes >= 1, got {per_row} and {passes}")
    passages = [f"{d.title}\n{d.text}" for d in docs]
    rng = random.Random(f"corpus-text-{seed}")
    rows = []
    for _ in range(passes):
        order = rng.sample(passages, len(passages))
        rows += [{"text": "\n\n".join(order[i:i + per_row])} for i in range(0, len(order), per_row)]
    return rows


def read_index_meta(path: str | os.PathLike, kind: str | None = None) -> dict:
    """An index folder's meta.json (corpus.jsonl sits beside it), checked for the expected `kind`."""
    meta_path = Path(path) / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"not an index folder: {meta_path} does not exist (build one with `seekrl index build`)"
        )
    meta = json.loads(meta_path.read_text())
    if kind is not None and meta.get("kind") != kind:
        raise ValueError(f"{meta_path}: kind is {meta.get('kind')!r}, expected {kind!r}")
    return meta


def _dedup(pairs: Iterable[tuple[str, str]]) -> list[Document]:
    seen: set[tuple[str, str]] = set()
    docs: list[Document] = []
    for title, text in pairs:
        if (title, text) in seen:
            continue
        seen.add((title, text))
        docs.append(Document.from_title_text(str(len(docs)), title, text))
    return docs


def _data_file(data_dir: str | os.PathLike | None, rel: str) -> Path:
    """`rel` in the first data dir that has it -- `data_dir` alone when given, else
    $SEEKRL_DATA_DIR, then ../shared/data (as the builtin data sets; no hub fallback) -- else a
    one-line FileNotFoundError naming the dirs tried."""
    path, tried = locate_data_file(rel, data_dir)
    if path is None:
        raise FileNotFoundError(
            f"data file {rel} not found: tried {', '.join(tried)}; "
            f"set {DATA_DIR_ENV}=<folder holding {rel}> or pass data_dir"
        )
    return path


def hotpotqa_corpus(data_dir: str | os.PathLike | None = None) -> list[Document]:
    """Distinct (title, text) paragraphs of HotpotQA dev_distractor + extra_contexts (14,903).

    When no data dir has dev_distractor.jsonl, the paragraphs of the builtin `hotpotqa` rows from
    the Hugging Face hub (data/loaders.py's order; the hub's distractor validation split)."""
    if locate_data_file(HOTPOTQA_FILES[0], data_dir)[0] is None:
        try:
            rows = [row for _, row in builtin_rows("hotpotqa", "dev", data_dir)]
        except DataError as e:
            raise FileNotFoundError(str(e)) from None
        return _dedup((title, "".join(sentences)) for row in rows for title, sentences in row["context"])

    def pairs() -> Iterator[tuple[str, str]]:
        for rel in HOTPOTQA_FILES:
            path = _data_file(data_dir, rel)
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                        for title, sentences in row["context"]:
                            yield title, "".join(sentences)
                    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                        raise ValueError(f"{path}:{lineno}: not a HotpotQA row with 'context' ({e})") from None

    return _dedup(pairs())


def twowiki_corpus(data_dir: str | os.PathLike | None = None) -> list[Document]:
    """Distinct gold paragraphs of the 2WikiMultihopQA dev sample ("Title\\n text" entries)."""
    path = _data_file(data_dir, TWOWIKI_FILE)
    rows = json.loads(path.read_text(encoding="utf-8"))

    def pairs() -> Iterator[tuple[str, str]]:
        for i, row in enumerate(rows):
            for entry in row.get("golden_context") or []:
                title, _, text = entry.partition("\n")
                if not title.strip():
                    raise ValueError(f"{path}: row {i} has a golden_context entry without a title line")
                yield title.strip(), text.strip()

    return _dedup(pairs())


def hotpotqa_gold_titles(row: dict) -> list[str]:
    """Titles of a HotpotQA question's gold paragraphs, in order, without repeats: from
    `supporting_facts` ([[title, sentence_id], ...]), or `supporting_titles` when it is null."""
    facts = row.get("supporting_facts")
    titles = [t for t, _ in facts] if facts is not None else list(row.get("supporting_titles") or [])
    return list(dict.fromkeys(titles))


def twowiki_gold_titles(row: dict) -> list[str]:
    """Titles of a 2WikiMultihopQA question's gold paragraphs (first line of each golden_context)."""
    return list(dict.fromkeys(e.partition("\n")[0].strip() for e in row.get("golden_context") or []))
