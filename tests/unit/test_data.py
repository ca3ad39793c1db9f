"""seekrl.data: loaders, converters and templates, on the real files in ../shared/data and on
small files the tests write themselves (malformed jsonl, parquet, save_to_disk folders)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seekrl.data import (
    DATA_DIR_ENV,
    PRESETS,
    DataError,
    PromptTemplate,
    get_template,
    gsm8k_row,
    load_tasks,
    math_row,
    qa_row,
    read_rows,
    resolve_data_dir,
    verl_row,
)

DATA = resolve_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "gsm8k").is_dir(), reason=f"shared data not found at {DATA}")


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    """No test here reaches the network: a builtin missing everywhere skips the hub (offline)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _contents(task) -> str:
    return "\n".join(m["content"] for m in task.prompt)


# ----------------------------------------------------------------------------- real data


@needs_data
def test_gsm8k_train_real():
    tasks = load_tasks("gsm8k")
    assert len(tasks) == 7473
    first = tasks[0]
    assert first.answer == "72"  # "... #### 72"
    assert first.source == "gsm8k" and first.id == "gsm8k-0"
    assert len(first.prompt) == 1 and first.prompt[0]["role"] == "user"
    assert first.prompt[0]["content"].startswith("Natalia sold clips to 48 of her friends")
    assert first.meta["solution"].endswith("#### 72")
    for t in tasks:
        assert "####" not in _contents(t)
        assert re.fullmatch(r"-?\d+(\.\d+)?", t.answer), t.answer  # "1,200" -> "1200"
    assert len({t.id for t in tasks}) == len(tasks)


@needs_data
def test_gsm8k_test_split_and_template():
    tasks = load_tasks("gsm8k:test", template="gsm8k", limit=5)
    assert len(tasks) == 5
    assert tasks[0].answer == "18"
    assert tasks[0].prompt[-1]["content"].endswith('output the final answer after "####".')
    assert len(load_tasks("gsm8k:test")) == 1319
    with pytest.raises(DataError, match="no split 'validation'.*train, test"):
        load_tasks("gsm8k:validation")


@needs_data
def test_math500_answers_real():
    tasks = load_tasks("math500")
    rows = [json.loads(line) for line in open(DATA / "math500/test.jsonl")]
    assert len(tasks) == 500
    assert tasks[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert tasks[0].id == "test/precalculus/807.json"
    assert [t.answer for t in tasks] == [r["answer"] for r in rows]
    assert tasks[0].meta["subject"] == "Precalculus" and tasks[0].meta["level"] == 2
    for t, r in zip(tasks, rows):
        assert t.prompt == [{"role": "user", "content": r["problem"]}]


@needs_data
def test_aime24_real():
    tasks = load_tasks("aime24", template="math_boxed")
    assert len(tasks) == 30
    assert tasks[0].answer == "204" and tasks[0].source == "aime24"
    assert tasks[0].prompt[0]["role"] == "system" and "\\boxed{}" in tasks[0].prompt[0]["content"]


@needs_data
def test_verl_bamboogle_prompt_as_is():
    tasks = load_tasks("bamboogle")
    rows = [json.loads(line) for line in open(DATA / "bamboogle/test.verl-format.jsonl")]
    assert len(tasks) == len(rows) == 125
    for t, r in zip(tasks, rows):
        assert t.prompt == r["prompt"]  # the row's messages are the prompt, untouched
        assert t.answer == r["reward_model"]["ground_truth"]
        assert t.source == "chiayewken/bamboogle"
        assert t.meta["extra_info"] == r["extra_info"] and t.meta["ability"] == "QA"
    assert tasks[0].answer == "james madison"


@needs_data
def test_verl_nq_open_alias_list():
    tasks = load_tasks("nq_open_verl")
    assert len(tasks) == 200
    first = tasks[0]
    assert first.prompt == [{"content": "when was the last time anyone was on the moon", "role": "user"}]
    # ground_truth "14 December 1972 UTC, December 1972" is the joined extra_info.answer list
    assert first.answer == ["14 December 1972 UTC", "December 1972"]
    assert first.source == "google-research-datasets/nq_open"
    assert all(isinstance(t.answer, list) and t.answer for t in tasks)
    # the raw NQ-open file gives the same aliases through the QA converter
    raw = load_tasks("nq_open", limit=3)
    assert raw[0].answer == first.answer and raw[0].source == "nq_open"


@needs_data
def test_qa_builtins_real():
    hotpot = load_tasks("hotpotqa", limit=2)
    assert hotpot[0].id == "5a8b57f25542995d1e6f1371" and hotpot[0].answer == ["yes"]
    assert "context" in hotpot[0].meta and "yes" not in _contents(hotpot[0]).lower().split()
    trivia = load_tasks("triviaqa", limit=1)[0]
    assert trivia.answer[:3] == ["Phar Lap", "Pharlap", "Phar"] and trivia.source == "triviaqa"
    assert load_tasks("popqa", limit=1)[0].answer[0] == "Aiwass"
    assert load_tasks("2wiki", limit=1)[0].answer == ["Panam Paduthum Padu"]
    assert load_tasks("musique", limit=1)[0].answer == ["Miquette Giraudy"]


# ----------------------------------------------------------------------------- errors


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", [{"question": "a", "answer": ["x"]}, "", '{"question": "b" "answer": 1}'])
    with pytest.raises(DataError) as err:
        load_tasks(str(path))
    msg = str(err.value)
    assert f"{path}:3:" in msg  # the blank line 2 still counts
    assert "not valid JSON" in msg and "fix or remove the line" in msg
    with pytest.raises(DataError, match=r"bad\.jsonl:3:"):
        list(read_rows(path))


def test_invalid_utf8_names_file_line_and_column(tmp_path):
    import gzip

    good = json.dumps({"question": "a", "answer": "x"}).encode() + b"\n"
    bad = b'{"question": "caf\xe9", "answer": "y"}\n'
    for name, write in (("b.jsonl", lambda p, d: p.write_bytes(d)), ("b.jsonl.gz", lambda p, d: p.write_bytes(gzip.compress(d)))):
        path = tmp_path / name
        write(path, good + b"\n" + bad)
        with pytest.raises(DataError) as err:
            load_tasks(str(path))
        assert str(err.value) == (f"{path}:3: not valid UTF-8 (byte 0xe9 at column 18); "
                                  "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
    path = tmp_path / "b.json"
    path.write_bytes(b'[\n  {"question": "a", "answer": "x"},\n  {"question": "\xff", "answer": "x"}\n]')
    with pytest.raises(DataError, match=r"b\.json:3: not valid UTF-8 \(byte 0xff at column 17\)"):
        load_tasks(str(path))
    # a UTF-8 byte order mark is not an error
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + good + '{"question": "café", "answer": "z"}\n'.encode())
    assert [t.answer for t in load_tasks(str(path))] == [["x"], ["z"]]


def test_empty_slice_at_load_time_names_the_row_count(tmp_path):
    from seekrl.data.config import DataConfig
    from seekrl.data.sets import load_split

    path = _jsonl(tmp_path / "five.jsonl", [{"id": i, "question": f"q{i}", "answer": "a"} for i in range(5)])
    with pytest.raises(DataError) as err:
        load_split(f"{path}[7:]", DataConfig(), "train", None)
    assert str(err.value) == f"'{path}[7:]' selects no rows: {path} has 5 rows; take rows within them (e.g. {path}[:2])"


def test_missing_field_names_fields(tmp_path):
    path = _jsonl(tmp_path / "g.jsonl", [{"question": "q1", "answer": "#### 1"}, {"question": "q2", "extra": 0}])
    with pytest.raises(DataError) as err:
        load_tasks(str(path), converter="gsm8k")
    msg = str(err.value)
    assert f"{path}:2:" in msg and "missing field 'answer'" in msg and "question, extra" in msg


def test_unknown_shape_suggests_fields(tmp_path):
    path = _jsonl(tmp_path / "odd.jsonl", [{"q": "What?", "a": "this"}])
    with pytest.raises(DataError) as err:
        load_tasks(str(path))
    assert "q, a" in str(err.value) and "data.prompt_field=" in str(err.value)
    tasks = load_tasks(str(path), prompt_field="q", answer_field="a")
    assert tasks[0].prompt == [{"role": "user", "content": "What?"}] and tasks[0].answer == "this"
    assert tasks[0].source == "odd" and tasks[0].id == "odd-0"


def test_missing_builtin_names_path_and_env(tmp_path, monkeypatch):
    with pytest.raises(DataError) as err:
        load_tasks("math500", data_dir=tmp_path)
    msg = str(err.value)
    assert f"data_dir={tmp_path} (no math500/test.jsonl)" in msg and DATA_DIR_ENV in msg
    assert str(tmp_path / "math500/test.jsonl") in msg  # where to copy it
    # the environment variable is the second place looked at
    (tmp_path / "gsm8k").mkdir()
    _jsonl(tmp_path / "gsm8k" / "train.jsonl", [{"question": "1+1?", "answer": "so\n#### 2"}])
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    tasks = load_tasks("gsm8k")
    assert [(t.id, t.answer) for t in tasks] == [("gsm8k-0", "2")]


# ----------------------------------------------------------------------------- builtin lookup order


def _dirs(tmp_path, monkeypatch, *, env: bool = True):
    """An env data dir and a shared dir (standing in for ../shared/data), both empty."""
    from seekrl.data import loaders

    env_dir, shared = tmp_path / "env", tmp_path / "shared"
    env_dir.mkdir()
    shared.mkdir()
    monkeypatch.setattr(loaders, "_candidate_dirs", lambda: [shared])
    if env:
        monkeypatch.setenv(DATA_DIR_ENV, str(env_dir))
    else:
        monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    return env_dir, shared


def _gsm8k_file(folder: Path, answer: str) -> None:
    (folder / "gsm8k").mkdir()
    _jsonl(folder / "gsm8k" / "test.jsonl", [{"question": "1+1?", "answer": f"so\n#### {answer}"}])


def test_builtin_env_dir_with_the_file_wins(tmp_path, monkeypatch):
    env_dir, shared = _dirs(tmp_path, monkeypatch)
    _gsm8k_file(env_dir, "1")
    _gsm8k_file(shared, "2")
    assert [t.answer for t in load_tasks("gsm8k:test")] == ["1"]


def test_builtin_env_dir_lacking_the_file_falls_through_to_shared(tmp_path, monkeypatch):
    env_dir, shared = _dirs(tmp_path, monkeypatch)
    _gsm8k_file(shared, "2")
    (env_dir / "gsm8k").mkdir()  # the folder is there, the file is not
    assert [t.answer for t in load_tasks("gsm8k:test")] == ["2"]
    # a $SEEKRL_DATA_DIR that does not exist falls through as well
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    assert [t.answer for t in load_tasks("gsm8k:test")] == ["2"]


def test_builtin_data_dir_argument_is_the_only_folder(tmp_path, monkeypatch):
    env_dir, shared = _dirs(tmp_path, monkeypatch)
    _gsm8k_file(shared, "2")
    with pytest.raises(DataError) as err:
        load_tasks("gsm8k:test", data_dir=env_dir)
    assert str(shared) not in str(err.value).split("; set")[0]


HOTPOT_HUB_ROW = {
    "id": "5a8b57f25542995d1e6f1371",
    "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "answer": "yes",
    "type": "comparison",
    "level": "hard",
    "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood", "Scott Derrickson"], "sent_id": [0, 0, 1]},
    "context": {
        "title": ["Ed Wood (film)", "Scott Derrickson"],
        "sentences": [["Ed Wood is a film.", " It is American."], ["Scott Derrickson is a director."]],
    },
}


def test_builtin_hub_fallback_when_no_dir_has_the_file(tmp_path, monkeypatch):
    import sys
    import types

    from seekrl.data.corpus import hotpotqa_gold_titles
    from seekrl.data.teacher import gold_titles

    _dirs(tmp_path, monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    calls = []

    def load_dataset(path, name=None, *, split=None):
        calls.append((path, name, split))
        return [dict(HOTPOT_HUB_ROW)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    tasks = load_tasks("hotpotqa")
    assert calls == [("hotpotqa/hotpot_qa", "distractor", "validation")]
    (task,) = tasks
    assert task.answer == ["yes"] and task.source == "hotpotqa" and task.id == HOTPOT_HUB_ROW["id"]
    assert "Scott Derrickson and Ed Wood" in _contents(task)
    # the local schema: lists of [title, sent_id] / [title, [sentences]] pairs
    assert task.meta["supporting_facts"] == [["Scott Derrickson", 0], ["Ed Wood", 0], ["Scott Derrickson", 1]]
    assert task.meta["context"][1] == ["Scott Derrickson", ["Scott Derrickson is a director."]]
    assert gold_titles(task) == ["Scott Derrickson", "Ed Wood"]
    assert hotpotqa_gold_titles(task.meta) == ["Scott Derrickson", "Ed Wood"]

    # gsm8k: its hub id, config and split; rows as the hub has them
    calls.clear()

    def load_gsm8k(path, name=None, *, split=None):
        calls.append((path, name, split))
        return [{"question": "1+1?", "answer": "so\n#### 2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_gsm8k))
    assert [t.answer for t in load_tasks("gsm8k:test")] == ["2"]
    assert calls == [("openai/gsm8k", "main", "test")]


def test_builtin_not_found_is_one_line_naming_every_place(tmp_path, monkeypatch):
    import sys
    import types

    env_dir, shared = _dirs(tmp_path, monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def load_dataset(path, name=None, *, split=None):
        raise ConnectionError("Couldn't reach 'hotpotqa/hotpot_qa' on the Hub\n" + "retrying... " * 100)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(DataError) as err:
        load_tasks("hotpotqa")
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 800, msg
    assert msg.startswith("builtin data set hotpotqa:dev not found: tried ")
    assert f"${DATA_DIR_ENV}={env_dir} (no hotpotqa/dev_distractor.jsonl)" in msg
    assert f"{shared} (no hotpotqa/dev_distractor.jsonl)" in msg
    assert "the Hugging Face hub (hotpotqa/hotpot_qa: ConnectionError: Couldn't reach" in msg
    assert f"set {DATA_DIR_ENV}=<folder holding hotpotqa/dev_distractor.jsonl>" in msg

    # offline: the hub is skipped (and said so); a builtin with no hub copy names only the dirs
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match=r"the Hugging Face hub \(skipped: HF_DATASETS_OFFLINE=1\)"):
        load_tasks("hotpotqa")
    with pytest.raises(DataError) as err:
        load_tasks("2wiki")
    assert "Hugging Face" not in str(err.value) and "\n" not in str(err.value)
    assert f"{shared} (no 2wikimultihopqa/dev500_gold_context.json)" in str(err.value)


def test_duplicate_ids_rejected(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"id": 1, "question": "a", "answer": "x"}, {"id": 1, "question": "b", "answer": "y"}])
    with pytest.raises(DataError, match="duplicate task id '1'"):
        load_tasks(str(path))
    assert [t.id for t in load_tasks(str(path), id_field="index")] == ["d-0", "d-1"]


def test_json_list_and_limit(tmp_path):
    rows = [{"id": i, "Question": f"q{i}", "answer": [f"a{i}", f"b{i}"]} for i in range(5)]
    path = tmp_path / "trivia.json"
    path.write_text(json.dumps(rows, indent=2))
    tasks = load_tasks(str(path), limit=2, source="tqa")
    assert [(t.id, t.answer, t.source) for t in tasks] == [("0", ["a0", "b0"], "tqa"), ("1", ["a1", "b1"], "tqa")]


def test_split_spec_slices_rows_before_limit(tmp_path):
    from seekrl.data.config import DataConfig
    from seekrl.data.sets import load_split

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"id": i, "question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(10)))
    cfg = DataConfig()
    ids = lambda spec, limit=None: [t.id for t in load_split(spec, cfg, "train", limit)]  # noqa: E731
    assert ids(f"{path}[:3]") == ["0", "1", "2"]
    assert ids(f"{path}[3:]") == [str(i) for i in range(3, 10)]  # disjoint from [:3]
    assert ids(f"{path}[-2:]") == ["8", "9"] and ids(f"{path}[2:8]", limit=2) == ["2", "3"]
    assert ids(f"{path}[:2],{path}[9:]") == ["0", "1", "9"]
    with pytest.raises(Exception, match=r"no such file"):
        load_split(str(tmp_path / "nope.jsonl") + "[:2]", cfg, "train", None)


# ----------------------------------------------------------------------------- converters


def test_math_row_boxed_from_solution():
    row = {"problem": "Half of one?", "solution": "First \\boxed{2}, no: $\\boxed{\\frac{1}{2}}$."}
    task = math_row(row, 3, source="m")
    assert task.answer == "\\frac{1}{2}" and task.id == "m-3" and task.meta == {"solution": row["solution"]}
    assert "boxed" not in _contents(task)
    with pytest.raises(DataError, match="no \\\\boxed"):
        math_row({"problem": "p", "solution": "no box here"}, 0)
    with pytest.raises(DataError, match="no \\\\boxed"):
        math_row({"problem": "p", "solution": "\\boxed{1 + {2"}, 0)  # unbalanced braces


def test_gsm8k_row_commas_and_no_marker():
    task = gsm8k_row({"question": "How many?", "answer": "big\n#### 1,200"}, 0)
    assert task.answer == "1200" and task.prompt == [{"role": "user", "content": "How many?"}]
    with pytest.raises(DataError, match="####"):
        gsm8k_row({"question": "q", "answer": "42"}, 0)


def test_qa_row_aliases():
    musique = qa_row({"id": "2hop_1", "question": "Who?", "answer": "Ann", "answer_aliases": ["Anne", "Ann"]}, 0)
    assert musique.answer == ["Ann", "Anne"] and musique.id == "2hop_1"
    trivia = qa_row({"question": "Q", "answer": {"value": "Paris", "aliases": ["Paris", "City of Light"]}}, 4, source="t")
    assert trivia.answer == ["Paris", "City of Light"] and trivia.id == "t-4"
    flash = qa_row({"question": "Q", "golden_answers": ["x", "y"]}, 0)
    assert flash.answer == ["x", "y"]


def test_verl_row_search_r1_target_and_template():
    row = {
        "id": "train_7",
        "question": "capital of france?",
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "Answer with <search>... Question: capital of france?"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris", "paris, france"]}},
        "extra_info": {"split": "train", "index": 7},
    }
    task = verl_row(row, 0)
    assert task.answer == ["Paris", "paris, france"]
    assert task.prompt == row["prompt"] and task.source == "nq" and task.id == "train_7"
    assert task.meta["extra_info"] == {"split": "train", "index": 7} and task.meta["reward_style"] == "rule"
    redone = verl_row(row, 0, PRESETS["r1"])  # a template is applied only when asked
    assert redone.prompt[0]["role"] == "system" and redone.prompt[1] == {"role": "user", "content": "capital of france?"}
    with pytest.raises(DataError, match="reward_model"):
        verl_row({"prompt": row["prompt"]}, 0)


def test_template_cannot_use_ground_truth():
    with pytest.raises(DataError, match="ground truth"):
        qa_row({"question": "Q", "answer": ["A"]}, 0, PromptTemplate(user="{question} (hint: {answer})"))


def test_template_fields_from_row():
    tmpl = PromptTemplate(user="Context:\n{golden_context}\n\nQ: {question}")
    task = qa_row({"Question": "Who?", "answer": ["B"], "golden_context": ["p1", "p2"]}, 0, tmpl)
    assert task.prompt == [{"role": "user", "content": "Context:\np1\np2\n\nQ: Who?"}]


# ----------------------------------------------------------------------------- formats


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"question {i}?"}],
            "ability": "qa",
            "reward_model": {"style": "rule", "ground_truth": {"target": [f"a{i}", f"alias{i}"]}},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(4)
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert [r for _, r in read_rows(path)] == rows
    tasks = load_tasks(str(path))
    assert [t.answer for t in tasks] == [[f"a{i}", f"alias{i}"] for i in range(4)]
    assert [t.prompt for t in tasks] == [r["prompt"] for r in rows]
    assert [t.id for t in tasks] == ["nq-0", "nq-1", "nq-2", "nq-3"]
    with pytest.raises(DataError, match=r"train\.parquet row 1: missing field 'question'; the row has fields: data_source, prompt"):
        load_tasks(str(path), converter="gsm8k")


def test_hf_save_to_disk_round_trip(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"problem": f"{i}+{i}?", "answer": str(2 * i), "unique_id": f"u{i}"} for i in range(6)]
    single = tmp_path / "single"
    datasets.Dataset.from_list(rows).save_to_disk(str(single))
    tasks = load_tasks(str(single))
    assert [(t.id, t.answer, t.source) for t in tasks] == [(f"u{i}", str(2 * i), "single") for i in range(6)]
    assert tasks[1].prompt == [{"role": "user", "content": "1+1?"}]

    both = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:4]), "test": datasets.Dataset.from_list(rows[4:])}
    ).save_to_disk(str(both))
    assert [t.id for t in load_tasks(f"{both}:test")] == ["u4", "u5"]
    assert len(load_tasks(str(both))) == 4  # "train" by default
    with pytest.raises(DataError, match="no split 'dev'"):
        load_tasks(f"{both}:dev")


# ----------------------------------------------------------------------------- templates


def test_template_render_and_missing_placeholder():
    tmpl = PromptTemplate(system="You are terse. Use \\boxed{} and {{literal}}.", user="Q: {question}\nTopic: {topic}")
    msgs = tmpl.render("What is {x}?", topic="sets")
    assert msgs == [
        {"role": "system", "content": "You are terse. Use \\boxed{} and {literal}."},
        {"role": "user", "content": "Q: What is {x}?\nTopic: sets"},  # braces in the question stay
    ]
    with pytest.raises(ValueError, match=r"\{topic\}.*available: question"):
        tmpl.render("Q?")
    assert PromptTemplate().render("hi") == [{"role": "user", "content": "hi"}]


def test_presets():
    assert set(PRESETS) >= {"plain", "math_boxed", "gsm8k", "r1", "search_r1"}
    sr1 = get_template("search_r1").render("Who wrote Hamlet?")
    text = sr1[-1]["content"]
    for tag in ("<think>", "<search>", "</search>", "<information>", "<answer>"):
        assert tag in text
    assert text.rstrip().endswith("Who wrote Hamlet?")
    r1 = get_template("r1").render("2+2?")
    assert "<think>" in r1[0]["content"] and "<answer>" in r1[0]["content"]
    assert get_template(None) == PRESETS["plain"]
    custom = get_template("math_boxed", user="Problem: {question}")
    assert custom.system == PRESETS["math_boxed"].system and custom.render("x")[1]["content"] == "Problem: x"
    with pytest.raises(ValueError, match="unknown prompt template 'nope'.*search_r1"):
        get_template("nope")
