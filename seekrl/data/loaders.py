"""Load data sets into `Task`s: files (jsonl, json, parquet), HF datasets, builtin names.

    load_tasks("gsm8k")                       # builtin name -> <data dir>/gsm8k/train.jsonl
    load_tasks("gsm8k:test", template=get_template("gsm8k"))
    load_tasks("data/nq_search/train.parquet")          # verl / Search-R1 rows, prompt as is
    load_tasks("my.jsonl", prompt_field="q", answer_field="a")
    load_tasks("hf:openai/gsm8k:test")        # datasets.load_dataset (needs the hub or a cache)
    load_tasks("saved_dataset_dir:train")     # a folder written by Dataset(Dict).save_to_disk

A builtin name:split is one file (`BUILTINS`), looked up in this order, the first hit wins:

1. the `data_dir` argument, when given (then no other folder);
2. `$SEEKRL_DATA_DIR`, when set -- a folder there that lacks the file falls through to 3;
3. `./../shared/data`, then `<repo root>/../shared/data`;
4. the Hugging Face hub (`HUB_SOURCES`: hub id, config, split), through `datasets.load_dataset`,
   when `datasets` is installed and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are not set; its rows
   are normalised to the local schema (`_hub_row`) and go through the same converter.

When none has it the DataError is one line naming every place tried and how to point at the
data. `resolve_data_dir` still gives the single folder of 1-3 (the first that exists);
`locate_data_file` does the per-file lookup of 1-3 (the retrieval corpora use it too).

Errors are `DataError`s that name the file and the 1-based line (jsonl) or row (other
formats), and say what to change.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from seekrl.data.converters import CONVERTERS, detect_converter, fields_row
from seekrl.data.templates import PromptTemplate, get_template
from seekrl.errors import DataError
from seekrl.types import Task

__all__ = [
    "builtin_rows",
    "BUILTINS",
    "HUB_SOURCES",
    "read_rows",
    "load_tasks",
    "resolve_data_dir",
    "locate_data_file",
    "DATA_DIR_ENV",
]

DATA_DIR_ENV = "SEEKRL_DATA_DIR"

# name -> (converter, default split, {split: path relative to the data dir})
BUILTINS: dict[str, tuple[str, str, dict[str, str]]] = {
    "gsm8k": ("gsm8k", "train", {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}),
    "math500": ("math", "test", {"test": "math500/test.jsonl"}),
    "aime24": ("math", "test", {"test": "aime2024/aime24.jsonl"}),
    "nq_open": ("qa", "dev", {"dev": "nq_open/NQ-open.dev.jsonl"}),
    "nq_open_verl": ("verl", "dev", {"dev": "nq_open/NQ-open.dev.verl-format.sample200.jsonl"}),
    "bamboogle": ("verl", "test", {"test": "bamboogle/test.verl-format.jsonl"}),
    "hotpotqa": ("qa", "dev", {"dev": "hotpotqa/dev_distractor.jsonl"}),
    "2wiki": ("qa", "dev", {"dev": "2wikimultihopqa/dev500_gold_context.json"}),
    "triviaqa": ("qa", "test", {"test": "triviaqa/sample500.json"}),
    "popqa": ("qa", "test", {"test": "popqa/sample500.json"}),
    "musique": ("qa", "dev", {"dev": "musique/dev_answerable.json"}),
}

# name -> (hub id, config or None, {builtin split: hub split}): the public hub copy of the same
# rows, used when no data dir has the file. Not for the samples (triviaqa, popqa, 2wiki: 500-row
# samples the hub does not hold; 2wiki's golden_context is FlashRAG's), nor musique's answerable
# dev subset, nor the verl exports.
HUB_SOURCES: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "gsm8k": ("openai/gsm8k", "main", {"train": "train", "test": "test"}),
    "math500": ("HuggingFaceH4/MATH-500", None, {"test": "test"}),
    "aime24": ("HuggingFaceH4/aime_2024", None, {"test": "train"}),
    "nq_open": ("google-research-datasets/nq_open", None, {"dev": "validation"}),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", {"dev": "validation"}),
}

HF_OFFLINE_ENVS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")

FORMATS = ("jsonl", "json", "parquet", "hf_disk", "hf")


# ----------------------------------------------------------------------------- data dir


def _candidate_dirs() -> list[Path]:
    repo_root = Path(__file__).resolve().parents[2]  # seekrl/data/loaders.py -> repo root
    return [Path.cwd() / ".." / "shared" / "data", repo_root / ".." / "shared" / "data"]


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The argument, else $SEEKRL_DATA_DIR, else the first existing default (or the first default).

    One folder for callers that want one; builtin files are looked up per file
    (`locate_data_file`), so a $SEEKRL_DATA_DIR lacking a file falls through to the defaults."""
    if data_dir:
        return Path(data_dir)
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    candidates = _candidate_dirs()
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    return candidates[0]


def _data_dirs(data_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """(label for messages, folder) in lookup order: the argument alone, else $SEEKRL_DATA_DIR
    (when set) and then the ../shared/data defaults (duplicates dropped)."""
    if data_dir:
        return [(f"data_dir={data_dir}", Path(data_dir))]
    dirs: list[tuple[str, Path]] = []
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        dirs.append((f"${DATA_DIR_ENV}={env}", Path(env)))
    seen = {Path(env).resolve()} if env else set()
    for c in _candidate_dirs():
        c = c.resolve()
        if c not in seen:
            seen.add(c)
            dirs.append((str(c), c))
    return dirs


def locate_data_file(rel: str, data_dir: str | os.PathLike | None = None) -> tuple[Path | None, list[str]]:
    """(the first `<dir>/<rel>` that is a file, or None; what was tried, one phrase per folder).

    The folders are those of `_data_dirs`: `data_dir` alone when given, else $SEEKRL_DATA_DIR
    and then ./../shared/data and <repo root>/../shared/data."""
    tried = []
    for label, folder in _data_dirs(data_dir):
        path = folder / rel
        if path.is_file():
            return path, tried
        tried.append(f"{label} ({'no ' + rel if folder.is_dir() else 'no such folder'})")
    return None, tried


def _one_line(text: str, limit: int = 200) -> str:
    """`text` with all whitespace runs collapsed to one space, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _offline() -> str | None:
    """The offline variable that is set (HF's truthy values), else None."""
    for var in HF_OFFLINE_ENVS:
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{var}={os.environ[var]}"
    return None


def _pairs(value: Any, first: str, second: str) -> Any:
    """The hub's dict of parallel lists `{first: [...], second: [...]}` -> `[[a, b], ...]` (the
    local files' list of pairs); anything else unchanged."""
    if isinstance(value, dict) and first in value and second in value:
        return [[a, list(b) if isinstance(b, tuple) else b] for a, b in zip(value[first], value[second])]
    return value


def _hub_row(name: str, row: dict) -> dict:
    """A hub row in the schema of the local file: HotpotQA's `supporting_facts` {title, sent_id}
    and `context` {title, sentences} become [[title, sent_id], ...] / [[title, [sentences]], ...],
    and its `id` is `_id` as in the original json files."""
    row = dict(row)
    if name == "hotpotqa":
        row["supporting_facts"] = _pairs(row.get("supporting_facts"), "title", "sent_id")
        row["context"] = _pairs(row.get("context"), "title", "sentences")
        if "_id" not in row and "id" in row:
            row["_id"] = row.pop("id")
    return row


def _load_from_hub(name: str, split: str) -> tuple[str, Iterator[tuple[int, dict]] | None, str]:
    """(label of the source, its rows or None, what was tried -- a phrase for the error)."""
    hub_id, config, splits = HUB_SOURCES[name]
    hub_split = splits.get(split)
    label = f"hf:{hub_id}{f'[{config}]' if config else ''}:{hub_split}"
    if hub_split is None:
        return label, None, f"the Hugging Face hub ({hub_id} has no copy of split {split!r})"
    offline = _offline()
    if offline:
        return label, None, f"the Hugging Face hub (skipped: {offline})"
    try:
        import datasets
    except ImportError:
        return label, None, "the Hugging Face hub (skipped: the datasets package is not installed)"
    try:
        ds = datasets.load_dataset(hub_id, config, split=hub_split)
    except Exception as e:  # offline, no such data set, ...: fall through to the error
        return label, None, f"the Hugging Face hub ({hub_id}: {_one_line(f'{type(e).__name__}: {e}')})"
    return label, ((i, _hub_row(name, dict(row))) for i, row in enumerate(ds, start=1)), ""


def _builtin_source(
    name: str, split: str | None, data_dir: str | os.PathLike | None
) -> tuple[str, str, Iterator[tuple[int, dict]] | None]:
    """(path of the local file or hf:<id>:<split> label, converter, hub rows or None).

    The folders of `locate_data_file` in order, then the hub (`HUB_SOURCES`); else a one-line
    DataError naming every place tried."""
    converter, default_split, splits = BUILTINS[name]
    split = split or default_split
    if split not in splits:
        raise DataError(f"data set {name!r} has no split {split!r}; splits: {', '.join(splits)}")
    rel = splits[split]
    path, tried = locate_data_file(rel, data_dir)
    if path is not None:
        return str(path), converter, None
    if name in HUB_SOURCES:
        label, rows, why = _load_from_hub(name, split)
        if rows is not None:
            return label, converter, rows
        tried.append(why)
    raise DataError(
        f"builtin data set {name}:{split} not found: tried {', '.join(tried)}; "
        f"set {DATA_DIR_ENV}=<folder holding {rel}> or copy the file to {resolve_data_dir(data_dir) / rel}"
    )


def builtin_rows(name: str, split: str | None = None, data_dir: str | os.PathLike | None = None) -> Iterator[tuple[int, dict]]:
    """The raw rows of a builtin data set (`(number, row)`, as `read_rows`), from wherever it resolves."""
    if name not in BUILTINS:
        raise DataError(f"{name!r} is not a builtin data set; builtins: {', '.join(BUILTINS)}")
    path, _, rows = _builtin_source(name, split, data_dir)
    return rows if rows is not None else read_rows(path)


# ----------------------------------------------------------------------------- reading rows


def _detect_format(path: Path) -> str:
    if path.is_dir():
        return "hf_disk"
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".json"):
        with _gz_readable(path), _open_text(path) as f:  # some ".json" files are really JSON lines: peek
            head = f.read(4096).lstrip()
        return "json" if head.startswith("[") else "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise DataError(
        f"{path}: cannot tell the format from the file name; give fmt= one of {', '.join(FORMATS[:4])}"
    )


@contextmanager
def _gz_readable(path: Path):
    """A damaged .gz file (bad header, truncated, bad CRC) as one DataError naming it, not a traceback."""
    try:
        yield
    except (OSError, EOFError, zlib.error) as e:
        if not path.name.endswith(".gz"):
            raise
        why = " ".join(str(e).split()) or "unexpected end of data"
        raise DataError(f"{path}: not a readable gzip file ({type(e).__name__}: {why}); re-download or re-compress it") from None


def _guard_gz(rows: Iterator[tuple[int, dict]], path: Path) -> Iterator[tuple[int, dict]]:
    with _gz_readable(path):
        yield from rows


def _open_text(path: Path):
    """UTF-8 text (a leading BOM dropped); a byte that is not UTF-8 reads as a lone surrogate
    U+DC80..U+DCFF, which `_check_utf8` turns into a DataError naming its line."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="surrogateescape")
    return open(path, encoding="utf-8-sig", errors="surrogateescape")


_BAD_BYTE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte that is not UTF-8


def _check_utf8(text: str, path: Path, first_line: int = 1) -> None:
    """Raise DataError at the first byte of `text` (starting on line `first_line`) that was not UTF-8."""
    bad = _BAD_BYTE.search(text)
    if bad is None:
        return
    line = first_line + text.count("\n", 0, bad.start())
    column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
    raise DataError(f"{path}:{line}: not valid UTF-8 (byte 0x{ord(bad.group()) - 0xDC00:02x} at column {column}); "
                    "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _check_object(row: Any, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: row is a {type(row).__name__}, expected an object with named fields")
    return row


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            _check_utf8(line, path, lineno)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{lineno}: row is not valid JSON ({e.msg} at column {e.colno}) — fix or remove the line"
                ) from None
            yield lineno, _check_object(row, f"{path}:{lineno}")


def _read_json(path: Path) -> Iterator[tuple[int, dict]]:
    with _open_text(path) as f:
        text = f.read()
        _check_utf8(text, path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: file is not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(data, dict):  # {"data": [...]} / {"train": [...]}: one list-valued field
        lists = [k for k, v in data.items() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(f"{path}: expected a JSON list of rows, got an object with fields {', '.join(data)}")
        data = data[lists[0]]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    for i, row in enumerate(data, start=1):
        yield i, _check_object(row, f"{path} row {i}")


def _read_parquet(path: Path) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            n += 1
            yield n, row


def _iter_dataset(ds) -> Iterator[tuple[int, dict]]:
    for i, row in enumerate(ds, start=1):
        yield i, dict(row)


def _pick_split(dd, split: str | None, where: str):
    names = list(dd.keys())
    if split is None:
        split = "train" if "train" in names else names[0] if len(names) == 1 else None
        if split is None:
            raise DataError(f"{where} has splits {', '.join(names)}; choose one with {where}:<split>")
    if split not in names:
        raise DataError(f"{where} has no split {split!r}; splits: {', '.join(names)}")
    return dd[split]


def _read_hf_disk(path: Path, split: str | None) -> Iterator[tuple[int, dict]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise DataError(f"{path}: not a folder written by datasets' save_to_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        ds = _pick_split(ds, split, str(path))
    elif split is not None:
        raise DataError(f"{path} is a single Dataset (no splits); drop ':{split}'")
    yield from _iter_dataset(ds)


def _read_hf_hub(name: str, split: str | None) -> Iterator[tuple[int, dict]]:
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split or "train")
    except Exception as e:  # offline, unknown name, bad split: say which and why
        raise DataError(f"hf:{name}: datasets.load_dataset failed: {type(e).__name__}: {e}") from None
    yield from _iter_dataset(ds)


def read_rows(path: str | os.PathLike, fmt: str = "auto", *, split: str | None = None) -> Iterator[tuple[int, dict]]:
    """Yield `(number, row)`: the 1-based line for jsonl, the 1-based row for other formats.

    `path` is a file, a `save_to_disk` folder, or `hf:<name>` (datasets.load_dataset; `split`
    picks the split, default "train"). `fmt`: auto | jsonl | json | parquet | hf_disk | hf.
    """
    text = str(path)
    if fmt == "hf" or (fmt == "auto" and text.startswith("hf:")):
        return _read_hf_hub(text.removeprefix("hf:"), split)
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    fmt = _detect_format(p) if fmt == "auto" else fmt
    if fmt == "hf_disk":
        return _read_hf_disk(p, split)
    if split is not None:
        raise DataError(f"{p}: a {fmt} file has no splits; drop ':{split}'")
    readers = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet}
    if fmt not in readers:
        raise DataError(f"unknown data format {fmt!r}; formats: auto, {', '.join(FORMATS)}")
    rows = readers[fmt](p)
    return _guard_gz(rows, p) if p.name.endswith(".gz") else rows


# ----------------------------------------------------------------------------- spec -> Tasks


def _parse_spec(
    spec: str, data_dir
) -> tuple[str, str | None, str | None, str | None, Iterator[tuple[int, dict]] | None]:
    """(path or hf spec, split, builtin converter or None, builtin name or None, rows already
    loaded from the hub for a builtin or None)."""
    name, _, split = spec.partition(":")
    if name in BUILTINS and not Path(spec).exists():
        path, converter, rows = _builtin_source(name, split or None, data_dir)
        return path, None, converter, name, rows
    if spec.startswith("hf:"):
        rest = spec[3:]
        hf_name, sep, hf_split = rest.rpartition(":")
        return ("hf:" + (hf_name if sep else rest)), (hf_split if sep else None), None, None, None
    if Path(spec).exists():
        return spec, None, None, None, None
    base, sep, split = spec.rpartition(":")
    if sep and base and Path(base).is_dir():  # saved DatasetDict folder with a split
        return base, split, None, None, None
    raise DataError(
        f"{spec}: no such file or folder, and not a builtin data set "
        f"(builtins: {', '.join(BUILTINS)}; hf:<name>[:split] for the hub)"
    )


def load_tasks(
    spec: str | os.PathLike,
    *,
    fmt: str = "auto",
    converter: str | Callable[..., Task] = "auto",
    prompt_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    source: str | None = None,
    template: PromptTemplate | str | None = None,
    limit: int | None = None,
    data_dir: str | os.PathLike | None = None,
) -> list[Task]:
    """Read `spec` (a path, a builtin name[:split], or hf:<name>[:split]) into Tasks.

    converter: "auto" (from the first row's shape), one of gsm8k | math | qa | verl | fields,
    or a callable `(row, index, template, *, source, id_field) -> Task`.
    prompt_field / answer_field name the question and answer fields (generic rows).
    id_field: the field holding a unique id ("index" numbers rows as `<source>-<i>`).
    source: the data set name (verl rows use their `data_source`); default: the builtin name
    or the file stem. template: a PromptTemplate or a preset name; verl rows keep their
    prompt unless a template is given. limit: the first `limit` rows only.
    """
    spec = str(spec)
    path, split, builtin_converter, builtin, hub_rows = _parse_spec(spec, data_dir)
    if source is None:
        if builtin:
            source = builtin
        elif path.startswith("hf:"):
            source = path[3:].rstrip("/").split("/")[-1]
        else:
            source = _source_from_path(Path(path))
    if isinstance(template, str):
        template = get_template(template)
    if converter == "auto" and builtin_converter and not (prompt_field or answer_field):
        converter = builtin_converter
    if limit is not None and limit <= 0:
        raise DataError(f"limit must be positive, got {limit}")

    if hub_rows is not None:  # a builtin from the hub
        where_fmt, rows = "hf", hub_rows
    else:
        where_fmt = fmt if fmt != "auto" else ("hf" if path.startswith("hf:") else _detect_format(Path(path)))
        rows = read_rows(path, fmt=where_fmt, split=split)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    fn: Callable[..., Task] | None = None
    for index, (number, row) in enumerate(rows):
        where = f"{path}:{number}" if where_fmt == "jsonl" else f"{path} row {number}"
        try:
            if fn is None:
                name = detect_converter(row, prompt_field, answer_field) if converter == "auto" else converter
                if callable(name):
                    fn = name
                elif name == "fields":
                    fn = _fields_converter(prompt_field, answer_field)
                elif name in CONVERTERS:
                    fn = CONVERTERS[name]
                else:
                    raise DataError(f"unknown converter {name!r}; converters: auto, {', '.join(CONVERTERS)}")
            task = fn(row, index, template, source=source, id_field=id_field)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        except ValueError as e:  # a template placeholder the row cannot fill
            raise DataError(f"{where}: {e}") from None
        if task.id in seen:
            raise DataError(
                f"{where}: duplicate task id {task.id!r} (first at row {seen[task.id] + 1}); "
                f"set data.id_field to a unique field, or data.id_field=index to number the rows"
            )
        seen[task.id] = index
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise DataError(f"{path}: no rows")
    return tasks


def _source_from_path(p: Path) -> str:
    """The file stem (`nq.jsonl.gz` -> `nq`); a bare split name (`gsm8k/train.jsonl`) -> the folder."""
    stem = Path(p.name.removesuffix(".gz")).stem if p.is_file() else p.name
    if stem.lower() in _SPLIT_NAMES and p.parent.name:
        return p.parent.name
    return stem


_SPLIT_NAMES = {"train", "test", "dev", "val", "valid", "validation", "eval"}


def _fields_converter(prompt_field: str | None, answer_field: str | None) -> Callable[..., Task]:
    def convert(row, index, template=None, *, source=None, id_field=None):
        return fields_row(
            row, index, template, source=source, id_field=id_field, prompt_field=prompt_field, answer_field=answer_field
        )

    return convert
