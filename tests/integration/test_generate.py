"""`seekrl generate` (seekrl/generate.py): the text agent loop against the scripted teacher and against
real OpenAI-compatible servers on 127.0.0.1, its output rows, resumability, and SFT on its rows.

- the CLI with endpoint=teacher writes rows that `load_sft_rows` reads back; `tokenize_segments`
  gives the prompt and the `<information>` observations mask 0 and the teacher's turns mask 1,
  and its ids / mask equal the trajectory RL's ToolAgentWorkflow builds from the same turns
  (replayed through an engine) with the real search tool;
- resumability: a torn last line is cut and its episode redone (no duplicates); rejected rows
  (below generate.min_reward) go to `<stem>.rejected.jsonl` and are not redone; failed episodes
  are not written and are redone; episodes run `generate.concurrency` at a time;
- `seekrl serve policy`'s app over a saved tiny random model, with a bearer token: every task's
  episode is written (structure, counts, one server request per turn); a wrong token exits 1
  with one error line and writes no rows;
- OpenAIChatEngine: a 503 (or 429, or a refused connection) is retried with backoff, a 4xx is not;
  OpenAI servers cut the stop string and the loop puts it back (`_restore_stop`, dr_tulu's
  `<call_tool name=...>` included); the turn budget: max_turns tool turns + one answer-only turn;
- SFT (`seekrl sft`, model.path=tiny) on teacher rows: the loss falls to under a third in 60
  steps and the checkpoint loads with transformers and scores the rows as well as it trained;
- generate.* config values are validated with the key named.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import string
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from live_server import LiveServer, free_port  # noqa: E402

from seekrl.cli import main  # noqa: E402
from seekrl.config import ConfigError, load_config  # noqa: E402
from seekrl.data.loaders import load_tasks  # noqa: E402
from seekrl.data.synthetic import make_world  # noqa: E402
from seekrl.data.teacher import ScriptedTeacher  # noqa: E402
from seekrl.generate import (  # noqa: E402
    EndpointError,
    GenerateConfig,
    GenerateRun,
    OpenAIChatEngine,
    _restore_stop,
    done_keys,
    generate_rows,
    run_episode,
)
from seekrl.models import encode_chat  # noqa: E402
from seekrl.retrieval.commands import build_index  # noqa: E402
from seekrl.rewards import Rubric  # noqa: E402
from seekrl.tools.base import ToolRegistry, tool  # noqa: E402
from seekrl.tools.executor import ToolExecutor  # noqa: E402
from seekrl.tools.parsers import INVALID_SEARCH_R1, get_format  # noqa: E402
from seekrl.tools.setup import make_tool_executor  # noqa: E402
from seekrl.train.sft import load_sft_rows, tokenize_segments  # noqa: E402
from seekrl.types import Completion, SamplingParams, Task  # noqa: E402

CONFIG = """\
tools:
  format: search_r1
  topk: 3
reward:
  functions: [qa_em]
rollout:
  max_turns: 4
  group_size: 2
  batch_size: 8
log:
  progress: false
  tensorboard: false
"""
ROW_KEYS = {"id", "sample", "source", "prompt", "segments", "answer", "meta", "reward", "reward_parts", "finish_reason", "metrics"}


def rows_of(tasks, engine, fmt, executor, rubric, out, *, progress=True, seed=0, **settings):
    """generate_rows with `generate.*` settings (n, concurrency, min_reward, ...) given as keywords."""
    run = GenerateRun(GenerateConfig(out=str(out), **settings), tasks, engine, fmt, executor, rubric, progress=progress, seed=seed)
    return generate_rows(run)


# ---- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    """A small world (96 train questions), its BM25 index and a config file."""
    d = tmp_path_factory.mktemp("generate")
    make_world(seed=1, n_entities=40, n_questions=120).save(d / "world")
    with contextlib.redirect_stderr(io.StringIO()):
        build_index(str(d / "world" / "corpus.jsonl"), str(d / "index"), kind="bm25")
    (d / "gen.yaml").write_text(CONFIG)
    return d


def paths(d: Path) -> list[str]:
    return [f"data.train={d / 'world' / 'train.jsonl'}", f"tools.retriever={d / 'index'}", f"log.dir={d / 'runs'}"]


@pytest.fixture(scope="module")
def teacher_rows(world_dir) -> tuple[int, Path, dict]:
    """`seekrl generate` with the scripted teacher (its default imperfections) over every train task."""
    out = world_dir / "teacher.jsonl"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["generate", str(world_dir / "gen.yaml"), *paths(world_dir), "generate.endpoint=teacher", f"generate.out={out}"])
    counts = json.loads(err.getvalue().strip().splitlines()[-1])
    return rc, out, counts


@pytest.fixture(scope="module")
def tasks(world_dir) -> list[Task]:
    return load_tasks(str(world_dir / "world" / "train.jsonl"))


@pytest.fixture(scope="module")
def search_executor(world_dir) -> ToolExecutor:
    return make_tool_executor(load_config(str(world_dir / "gen.yaml"), paths(world_dir)).tools)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal mask value: [(mask value, ids)]."""
    out: list[tuple[int, list[int]]] = []
    for i, m in zip(ids, mask):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return out


def check_row_structure(row: dict, fmt_name: str = "search_r1") -> None:
    fmt = get_format(fmt_name)
    assert set(row) == ROW_KEYS, set(row) ^ ROW_KEYS
    segs, m = row["segments"], row["metrics"]
    assert [s["masked"] for s in segs] == [i % 2 == 1 for i in range(len(segs))]  # turn, observation, turn, ...
    assert len(segs) == 2 * m["turns"] - 1
    assert row["finish_reason"] in ("answered", "max_turns")
    # every turn is an answer, a valid call or an invalid action; the last turn of max_turns is neither
    assert m["turns"] == m["valid_actions"] + m["invalid_actions"] + (row["finish_reason"] == "max_turns")
    for s in segs:
        if s["masked"]:
            assert s["text"] == fmt.invalid_text or s["text"].startswith("\n\n<information>")
    assert sum(s["text"] == fmt.invalid_text for s in segs if s["masked"]) == m["invalid_actions"]
    assert set(row["reward_parts"]) == {"qa_em"} and row["reward"] == row["reward_parts"]["qa_em"]


# ---- the teacher through the CLI, SFT tokenization, RL layout --------------------------------
def test_cli_teacher_rows_read_back_and_tokenize_with_masks(teacher_rows, tasks):
    rc, out, counts = teacher_rows
    assert rc == 0
    rows = read_rows(out)
    assert len(rows) == len(tasks) == counts["written"] and counts["failed"] == counts["rejected"] == 0
    assert sorted(r["id"] for r in rows) == sorted(t.id for t in tasks) and {r["sample"] for r in rows} == {0}
    assert counts["tool_calls"] == sum(r["metrics"]["tool_calls"] for r in rows) > len(rows) // 2
    assert counts["mean_reward"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))
    assert 0.5 < counts["mean_reward"] < 1.0  # imperfect on purpose (measured 0.81)
    for r in rows:
        check_row_structure(r)
        assert r["finish_reason"] == "answered" and r["meta"]["gold_titles"]
    assert (out.parent / "teacher.rejected.jsonl").read_text() == ""

    examples = load_sft_rows(out)
    assert len(examples) == len(rows)
    assert all(ex == {"prompt": r["prompt"], "segments": r["segments"]} for ex, r in zip(examples, rows))

    from seekrl.models import train_tiny_tokenizer

    texts = [m["content"] for ex in examples for m in ex["prompt"]] + [s["text"] for ex in examples for s in ex["segments"]]
    tok = train_tiny_tokenizer(texts + [string.printable, "user\nassistant\n"], vocab_size=512)
    for ex in examples:
        ids, mask = tokenize_segments(tok, ex["prompt"], ex["segments"])
        prompt = encode_chat(tok, ex["prompt"], add_generation_prompt=True)
        assert len(ids) == len(mask) and ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
        # the runs of equal mask are: the prompt, then the segments one by one, each decoding to its text
        spans = runs(ids, mask)
        assert tok.decode(spans[0][1]) == tok.decode(prompt)
        assert [(m, tok.decode(x)) for m, x in spans[1:]] == [(int(not s["masked"]), s["text"]) for s in ex["segments"]]
        trained = tok.decode([i for i, m in zip(ids, mask) if m])
        inserted = tok.decode([i for i, m in zip(ids[len(prompt):], mask[len(prompt):]) if not m])
        assert "<information>" not in trained and trained.count("<answer>") == 1
        assert trained.count("<search>") == inserted.count("<information>") == (len(ex["segments"]) - 1) // 2


def test_sft_layout_equals_the_rl_trajectory(teacher_rows, tasks, search_executor, world_dir):
    """Replaying the teacher's turns through RL's ToolAgentWorkflow (real search) gives the same ids and mask."""
    from seekrl.models import train_tiny_tokenizer
    from seekrl.workflows.tool_agent import ToolAgentWorkflow

    _, out, _ = teacher_rows
    rows = read_rows(out)[:24]
    by_id = {t.id: t for t in tasks}
    texts = [m["content"] for r in rows for m in r["prompt"]] + [s["text"] for r in rows for s in r["segments"]]
    tok = train_tiny_tokenizer(texts + [string.printable, "user\nassistant\n"], vocab_size=512)

    class Replay:
        """An InferenceEngine whose turns are the row's trained segments, as token ids."""

        def __init__(self, row):
            self.turns = [s["text"] for s in row["segments"] if not s["masked"]]

        async def generate(self, prompt_ids, params):
            ids = list(tok.encode(self.turns.pop(0), add_special_tokens=False))
            return Completion(ids, [0.0] * len(ids), "stop", 0)

    cfg = load_config(str(world_dir / "gen.yaml"), paths(world_dir))
    wf = ToolAgentWorkflow(tok, SamplingParams(max_new_tokens=10_000), Rubric(["qa_em"]), get_format("search_r1"), search_executor,
                           max_turns=cfg.rollout.max_turns, max_obs_tokens=100_000, max_total_tokens=100_000)

    async def go():
        for row in rows:
            engine = Replay(row)
            group = await wf.run(by_id[row["id"]], engine, 1)
            yield row, group.trajectories[0], engine

    async def check():
        n = 0
        async for row, traj, engine in go():
            ids, mask = tokenize_segments(tok, row["prompt"], row["segments"])
            assert traj.prompt_ids + traj.completion_ids == ids
            assert [0] * len(traj.prompt_ids) + traj.loss_mask == mask
            assert engine.turns == [] and traj.finish_reason == row["finish_reason"]
            assert traj.reward == row["reward"]
            n += 1
        return n

    assert asyncio.run(check()) == len(rows)


# ---- resumability, rejection, failures, concurrency ------------------------------------------
def _rows_in(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_cuts_a_torn_line_and_redoes_only_that_episode(tmp_path, tasks, search_executor):
    fmt, rubric, some = get_format("search_r1"), Rubric(["qa_em"]), tasks[:10]
    out = tmp_path / "rows.jsonl"

    def run(**kw):
        teacher = ScriptedTeacher(some, seed=0)
        return asyncio.run(rows_of(some, teacher, fmt, search_executor, rubric, out, progress=False, **kw))

    first = run(n=2, concurrency=4)
    assert first["written"] == 20 and first["already_done"] == 0
    lines = out.read_text().splitlines(keepends=True)
    assert len(lines) == 20
    torn = json.loads(lines[-1])
    out.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    assert done_keys(out) == {(r["id"], r["sample"]) for r in map(json.loads, lines[:-1])}
    assert out.read_text() == "".join(lines[:-1])  # the torn line was cut off the file
    out.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])

    again = run(n=2, concurrency=4)
    assert again["written"] == 1 and again["already_done"] == 19
    rows = _rows_in(out)
    keys = [(r["id"], r["sample"]) for r in rows]
    assert keys == [(t.id, s) for t in some for s in range(2)]  # all 20, back in task order
    assert rows[keys.index((torn["id"], torn["sample"]))]["segments"] == torn["segments"]  # redone the same way
    before = out.read_bytes()
    third = run(n=2)
    assert third["written"] == 0 and third["already_done"] == 20 and out.read_bytes() == before
    # a torn line that is valid JSON but lacks its newline is cut too
    out.write_bytes(before + json.dumps({"id": "x", "sample": 0}).encode())
    assert ("x", 0) not in done_keys(out) and out.read_bytes() == before


def test_min_reward_rejects_and_rerun_does_not_redo(tmp_path, tasks, search_executor):
    fmt, rubric, some = get_format("search_r1"), Rubric(["qa_em"]), tasks[:30]
    out = tmp_path / "kept.jsonl"
    rejected = tmp_path / "kept.rejected.jsonl"

    def run(seed):
        teacher = ScriptedTeacher(some, seed=seed, skip_search=0.6, stop_early=0.5)
        return asyncio.run(rows_of(some, teacher, fmt, search_executor, rubric, out, min_reward=1.0, progress=False))

    c = run(0)
    kept, rej = _rows_in(out), _rows_in(rejected)
    assert c["written"] == len(kept) > 0 and c["rejected"] == len(rej) > 0 and len(kept) + len(rej) == len(some)
    assert all(r["reward"] == 1.0 for r in kept) and all(r["reward"] < 1.0 for r in rej)
    assert not {r["id"] for r in kept} & {r["id"] for r in rej}
    assert c["mean_reward"] == pytest.approx(len(kept) / len(some))
    before = (out.read_bytes(), rejected.read_bytes())
    c2 = run(1)  # another teacher would answer differently, but nothing is redone
    assert c2["written"] == c2["rejected"] == 0 and c2["already_done"] == len(some)
    assert (out.read_bytes(), rejected.read_bytes()) == before


def test_the_rows_do_not_depend_on_concurrency_or_timing(tmp_path, tasks, search_executor):
    """A flawed teacher whose turns finish in a random order: concurrency 1 and 6 write the same
    bytes, in task order; the seed, not the schedule, decides each episode."""
    import random

    fmt, rubric, some = get_format("search_r1"), Rubric(["qa_em"]), tasks[:24]

    class Jittery:
        def __init__(self, seed: int = 0):
            self.teacher, self.jitter = ScriptedTeacher(some, seed=seed, skip_search=0.5, stop_early=0.5, weak_query=0.5), random.Random()

        async def chat(self, messages, **kw):
            await asyncio.sleep(self.jitter.random() * 0.005)
            return await self.teacher.chat(messages, **kw)

    def run(out, concurrency, seed=0, teacher_seed=0):
        asyncio.run(rows_of(some, Jittery(teacher_seed), fmt, search_executor, rubric, out, n=2, concurrency=concurrency,
                                  progress=False, seed=seed))
        return out.read_bytes()

    one = run(tmp_path / "c1.jsonl", 1)
    assert run(tmp_path / "c6.jsonl", 6) == one
    rows = _rows_in(tmp_path / "c1.jsonl")
    assert [(r["id"], r["sample"]) for r in rows] == [(t.id, s) for t in some for s in range(2)]
    # the two samples of a task are two draws, not one episode twice; another seed draws others
    assert any(rows[i]["segments"] != rows[i + 1]["segments"] for i in range(0, len(rows), 2))
    assert run(tmp_path / "s1.jsonl", 6, seed=1) != one and run(tmp_path / "t1.jsonl", 6, teacher_seed=1) != one


def test_failed_episodes_are_not_written_and_are_redone(tmp_path, tasks, search_executor):
    fmt, rubric, some = get_format("search_r1"), Rubric(["qa_em"]), tasks[:8]
    out = tmp_path / "rows.jsonl"
    bad = {some[1].id, some[5].id}

    class Flaky:
        """The teacher, but the endpoint fails for two tasks (after the episode started), and slow."""

        def __init__(self, fail: bool):
            self.teacher, self.fail = ScriptedTeacher(some, seed=0), fail
            self.in_flight = self.max_in_flight = 0

        async def chat(self, messages, **kw):
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.01)
                if self.fail and messages[0]["content"] in {t.prompt[0]["content"] for t in some if t.id in bad} and len(messages) > 1:
                    raise EndpointError("http://x/v1/chat/completions failed 4 times; last: HTTP 503")
                return await self.teacher.chat(messages, **kw)
            finally:
                self.in_flight -= 1

    engine = Flaky(fail=True)
    c = asyncio.run(rows_of(some, engine, fmt, search_executor, rubric, out, concurrency=3, progress=False))
    assert c["failed"] == 2 and c["written"] == 6 and "HTTP 503" in c["first_error"]
    assert {r["id"] for r in _rows_in(out)} == {t.id for t in some} - bad
    assert engine.max_in_flight == 3  # generate.concurrency episodes at once, no more
    c = asyncio.run(rows_of(some, Flaky(fail=False), fmt, search_executor, rubric, out, progress=False))
    assert c["failed"] == 0 and c["written"] == 2 and c["already_done"] == 6 and "first_error" not in c
    assert sorted(r["id"] for r in _rows_in(out)) == sorted(t.id for t in some)


# ---- a real OpenAI-compatible server: seekrl serve policy over a saved tiny model -------------
@pytest.fixture(scope="module")
def policy_server(tmp_path_factory, tasks):
    """(base URL, app) of the policy app over a tiny random model saved to a folder and loaded back."""
    from seekrl.engines.local import LocalEngine
    from seekrl.models import load_model, make_tiny_model, save_tiny, train_tiny_tokenizer
    from seekrl.servers.policy import make_app

    folder = tmp_path_factory.mktemp("policy") / "model"
    texts = [t.prompt[-1]["content"] for t in tasks] + [string.printable, INVALID_SEARCH_R1, "<search> </search> <answer> </answer>"]
    tok = train_tiny_tokenizer(texts, vocab_size=256)
    save_tiny(make_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, seed=0), tok, folder)
    model, tokenizer = load_model(str(folder), dtype="float32", device="cpu")  # as serve_policy loads it
    app = make_app(LocalEngine(model.eval(), tokenizer, max_batch_size=16), tokenizer, model_name=str(folder), token="gen-secret")
    with LiveServer(app) as url:
        yield url, app


def generate_via(url: str, world_dir, out, *overrides: str) -> int:
    """`seekrl generate` against the policy server, its key read from SEEKRL_TEST_GEN_KEY."""
    return main(["generate", str(world_dir / "gen.yaml"), *paths(world_dir), f"generate.endpoint={url}/v1",
                 "generate.api_key_env=SEEKRL_TEST_GEN_KEY", f"generate.out={out}", *overrides])


def test_generate_against_the_policy_server(policy_server, world_dir, tmp_path, monkeypatch, capsys):
    url, app = policy_server
    monkeypatch.setenv("SEEKRL_TEST_GEN_KEY", "gen-secret")
    out = tmp_path / "policy.jsonl"
    before = app.state.stats["requests"]
    rc = generate_via(url, world_dir, out, "data.max_train=6", "generate.concurrency=3", "generate.retries=0",
                      "rollout.max_turns=2", "rollout.max_new_tokens=12", "generate.n=2")
    err = capsys.readouterr().err
    assert rc == 0, err
    counts = json.loads(err.strip().splitlines()[-1])
    rows = read_rows(out)
    assert counts["written"] == len(rows) == 12 and counts["failed"] == 0
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted((t.id, s) for t in load_tasks(str(world_dir / "world" / "train.jsonl"))[:6] for s in range(2))
    for r in rows:
        check_row_structure(r)
        assert 1 <= r["metrics"]["turns"] <= 3  # max_turns tool turns + the answer-only turn
    # a random model writes garbage: invalid actions, answered for the most part never
    assert sum(r["metrics"]["invalid_actions"] for r in rows) > 0
    # every turn of every episode was one request to the server, and nothing else was
    assert app.state.stats["requests"] - before == sum(r["metrics"]["turns"] for r in rows)


def test_wrong_token_exits_with_one_error_line_and_no_rows(policy_server, world_dir, tmp_path, monkeypatch, capsys):
    url, app = policy_server
    monkeypatch.setenv("SEEKRL_TEST_GEN_KEY", "not-the-token")
    out = tmp_path / "none.jsonl"
    before = app.state.stats["generations"]
    rc = generate_via(url, world_dir, out, "data.max_train=3", "rollout.max_new_tokens=8",
                      "rollout.batch_size=4")  # load_task_sets wants batch_size / group_size <= the tasks
    err = capsys.readouterr().err
    assert rc == 1
    errors = [line for line in err.splitlines() if line.startswith("seekrl: error:")]
    assert len(errors) == 1 and errors[0] == err.strip().splitlines()[-1]
    assert "every episode failed" in errors[0] and "HTTP 401" in errors[0]
    assert read_rows(out) == [] and app.state.stats["generations"] == before
    assert json.loads(err.strip().splitlines()[-2])["failed"] == 3


# ---- OpenAIChatEngine against a scripted server: retries, errors, the stop string -------------
def scripted_server(script: list, seen: list):
    """A chat/completions endpoint answering from `script`: (status, content, finish_reason) per request."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        seen.append({"auth": request.headers.get("authorization"), "body": await request.json()})
        status, content, finish = script.pop(0)
        if status != 200:
            return JSONResponse({"error": {"message": f"status {status}"}}, status_code=status)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}

    return LiveServer(app)


def _executor(calls: list) -> ToolExecutor:
    @tool
    async def search(query: str) -> str:
        """Search.

        Args:
            query: the query.
        """
        calls.append(query)
        return f'Doc 1(Title: "{query}") Paris is the capital of France.'

    reg = ToolRegistry()
    reg.register(search)
    return ToolExecutor(reg)


TASK = Task(id="t", prompt=[{"role": "user", "content": "Question: what is the capital of France?"}], answer=["Paris"])


def test_503_then_success_is_retried_and_the_cut_stop_string_restored():
    seen, calls = [], []
    script = [(503, None, None), (200, "<search> capital of France ", "stop"), (429, None, None), (200, "<answer> Paris ", "stop")]
    with scripted_server(script, seen) as url:

        async def go():
            engine = OpenAIChatEngine(url + "/v1", "m", "k", retries=2, backoff_s=0.01)
            try:
                ep = await run_episode(TASK, engine, get_format("search_r1"), _executor(calls), max_turns=2, max_tokens=32,
                                       temperature=0.5, seed=41)
            finally:
                await engine.aclose()
            return engine, ep

        engine, ep = asyncio.run(go())
    assert engine.retried == 2 and engine.requests == 4 and script == []
    assert ep["finish_reason"] == "answered" and ep["metrics"]["tool_calls"] == 1 and calls == ["capital of France"]
    texts = [s["text"] for s in ep["segments"]]
    assert texts[0] == "<search> capital of France </search>" and texts[2] == "<answer> Paris </answer>"
    assert texts[1].startswith("\n\n<information>") and ep["segments"][1]["masked"]
    assert all(s["auth"] == "Bearer k" for s in seen)
    body = seen[-1]["body"]
    assert body["model"] == "m" and body["max_tokens"] == 32 and body["temperature"] == 0.5
    assert body["stop"] == ["</search>", "</answer>"]
    # the loop sends the whole transcript: prompt, the restored turn, the observation as a user message
    assert body["messages"] == [*TASK.prompt, {"role": "assistant", "content": texts[0]}, {"role": "user", "content": texts[1]}]
    assert seen[1]["body"] == seen[0]["body"]  # the retry resends the same request
    assert [s["body"]["seed"] for s in seen] == [41, 41, 42, 42]  # seed + turn, the same on a retry


def test_a_4xx_is_not_retried_and_persistent_5xx_gives_up():
    seen = []
    with scripted_server([(400, None, None), (500, None, None), (502, None, None), (503, None, None)], seen) as url:

        async def go():
            engine = OpenAIChatEngine(url + "/v1", retries=2, backoff_s=0.01)
            try:
                with pytest.raises(EndpointError, match="HTTP 400"):
                    await engine.chat(TASK.prompt)
                assert engine.requests == 1 and engine.retried == 0
                with pytest.raises(EndpointError, match=r"failed 3 times; last: HTTP 503"):
                    await engine.chat(TASK.prompt)
                assert engine.requests == 4 and engine.retried == 2
            finally:
                await engine.aclose()

        asyncio.run(go())
    assert all(s["auth"] is None for s in seen) and "stop" not in seen[0]["body"]


def test_connection_refused_is_retried_then_an_endpoint_error():
    async def go():
        engine = OpenAIChatEngine(f"http://127.0.0.1:{free_port()}/v1", retries=2, backoff_s=0.01)
        try:
            t0 = time.monotonic()
            with pytest.raises(EndpointError, match="failed 3 times; last: ConnectError"):
                await engine.chat(TASK.prompt)
            return engine, time.monotonic() - t0
        finally:
            await engine.aclose()

    engine, dt = asyncio.run(go())
    assert engine.requests == 3 and engine.retried == 2
    assert dt >= 0.01 + 0.02  # backoff 0.01 * 2**k * (1 + jitter) before retry k


@pytest.mark.parametrize(
    "text, finish, stop, expected",
    [
        ("<search> q ", "stop", ("</search>", "</answer>"), "<search> q </search>"),
        ("<answer> Paris ", "stop", ("</search>", "</answer>"), "<answer> Paris </answer>"),
        ("<answer> Paris ", "length", ("</search>", "</answer>"), "<answer> Paris "),  # cut by max_tokens: not a stop
        ("<search> q </search>", "stop", ("</search>", "</answer>"), "<search> q </search>"),  # stop kept by the server
        ("I think so", "stop", ("</search>", "</answer>"), "I think so"),  # an EOS: nothing is open
        ("<search> q </search> ok", "stop", ("</search>", "</answer>"), "<search> q </search> ok"),  # closed, then EOS
        ("<search> a </search> then <answer> b ", "stop", ("</search>", "</answer>"), "<search> a </search> then <answer> b </answer>"),
        ("<answer> a </answer> <search> q ", "stop", ("</search>", "</answer>"), "<answer> a </answer> <search> q </search>"),
        ("<search> a </search>", "stop", ("</answer>",), "<search> a </search>"),  # only the stops asked for
        ("<searching> q ", "stop", ("</search>",), "<searching> q "),  # another tag
        ('<call_tool name="search"> q ', "stop", ("</call_tool>", "</answer>"), '<call_tool name="search"> q </call_tool>'),
        ("<answer> x ", "stop", (), "<answer> x "),
        ("a\n", "stop", ("\n\n",), "a\n"),  # a stop that is not a closing tag is never guessed
    ],
)
def test_restore_stop(text, finish, stop, expected):
    assert _restore_stop(text, finish, stop) == expected


def test_dr_tulu_episode_through_an_openai_endpoint():
    """The server cuts `</call_tool>`; the loop restores it, so the call runs (not an invalid action)."""
    seen, calls = [], []
    script = [(200, '<call_tool name="search"> capital of France ', "stop"), (200, "<answer> Paris ", "stop")]
    with scripted_server(script, seen) as url:

        async def go():
            engine = OpenAIChatEngine(url + "/v1", retries=0)
            try:
                return await run_episode(TASK, engine, get_format("dr_tulu"), _executor(calls), max_turns=2)
            finally:
                await engine.aclose()

        ep = asyncio.run(go())
    assert ep["metrics"]["invalid_actions"] == 0 and ep["metrics"]["tool_calls"] == 1 and calls == ["capital of France"]
    assert ep["segments"][0]["text"] == '<call_tool name="search"> capital of France </call_tool>'
    assert ep["finish_reason"] == "answered" and seen[0]["body"]["stop"] == ["</call_tool>", "</answer>"]
    assert all("seed" not in s["body"] for s in seen)  # no seed asked, none sent


def test_run_episode_turn_budget_and_stop_strings():
    """An engine that never acts: max_turns invalid actions, then one answer-only turn, then max_turns."""

    class Babble:
        def __init__(self):
            self.stops = []

        async def chat(self, messages, *, stop=(), max_tokens=256, temperature=1.0):
            self.stops.append(tuple(stop))
            return "hmm", "length"

    engine, fmt = Babble(), get_format("search_r1")
    ep = asyncio.run(run_episode(TASK, engine, fmt, _executor([]), max_turns=3))
    assert engine.stops == [fmt.stop] * 3 + [fmt.answer_stop]
    assert ep["finish_reason"] == "max_turns" and ep["metrics"] == {
        "turns": 4, "tool_calls": 0, "valid_actions": 0, "invalid_actions": 3, "tool_errors": 0}
    assert [s["text"] for s in ep["segments"]] == ["hmm", fmt.invalid_text] * 3 + ["hmm"]


# ---- SFT on the teacher's rows ---------------------------------------------------------------
def test_sft_on_teacher_rows_learns_and_the_checkpoint_loads(teacher_rows, world_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seekrl.observe.loggers import read_metrics
    from seekrl.train.sft import step_loss

    _, out, _ = teacher_rows
    steps = 60
    rc = main(["sft", str(world_dir / "gen.yaml"), *paths(world_dir), f"data.train={out}", "model.path=tiny",
               "model.tiny_vocab=512", "model.tiny_hidden=64", f"train.steps={steps}", "train.lr=3e-3", "train.warmup_steps=0",
               "rollout.batch_size=8", "log.name=sft", "train.seed=0"])
    assert rc == 0
    run_dir = world_dir / "runs" / "sft"
    losses = [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
    assert len(losses) == steps
    first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert last < first / 3, (first, last)  # measured: 5.8 -> 1.35
    # the checkpoint is a standalone HF folder; it scores the rows about as well as training did
    folder = run_dir / "checkpoints" / f"step_{steps}" / "model"
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    examples = [tokenize_segments(tok, ex["prompt"], ex["segments"]) for ex in load_sft_rows(out, limit=16)]
    with torch.no_grad():
        loaded = step_loss(model, examples, 8192, tok.pad_token_id, torch.device("cpu"), backward=False)[0]
    assert loaded < first / 3, (loaded, first, last)  # measured: 1.09


# ---- config -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        ("generate.teacher_skip_search=1.5", "generate.teacher_skip_search: must be a probability in [0, 1], got 1.5"),
        ("generate.teacher_give_up=-0.1", "generate.teacher_give_up: must be a probability in [0, 1]"),
        ("generate.endpoint=ftp://x", "generate.endpoint: 'ftp://x' is neither 'teacher' nor an http(s) base URL"),
        ("generate.n=0", "generate.n and generate.concurrency must be at least 1"),
        ("generate.retries=-1", "generate.retries at least 0"),
        ("generate.min_reward=high", "generate.min_reward"),
    ],
)
def test_generate_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_generate_cli_config_errors_exit_2(world_dir, tmp_path, capsys):
    assert main(["generate", str(world_dir / "gen.yaml"), *paths(world_dir), "generate.teacher_skip_search=1.5"]) == 2
    assert "generate.teacher_skip_search" in capsys.readouterr().err
    assert main(["generate", str(world_dir / "gen.yaml"), *paths(world_dir)]) == 2  # no generate.out
    assert "generate.out is not set" in capsys.readouterr().err
    out = tmp_path / "x.jsonl"
    assert main(["generate", str(world_dir / "gen.yaml"), *paths(world_dir), "tools.format=hermes", f"generate.out={out}"]) == 2
    assert "search_r1 or dr_tulu" in capsys.readouterr().err and not out.exists()
    # the teacher's kinds are checked against the tasks, before any episode: one line naming the key
    assert main(["generate", str(world_dir / "gen.yaml"), *paths(world_dir), f"generate.out={out}",
                 "generate.teacher_overconfident_kinds=[3hop]"]) == 2
    err = capsys.readouterr().err
    assert "generate.teacher_overconfident_kinds ['3hop'] match no task; the tasks' kinds are ['1hop', '2hop', 'comparison']" in err
    assert "Traceback" not in err and not out.exists()
