"""`seekrl serve engine` on 127.0.0.1: every endpoint of the SGLang subset, against the in-process engine.

A real uvicorn server (tests/live_server.py) over a LocalEngine on the tiny model; the client is
plain httpx sending SGLang's field names.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from live_server import LiveServer

from seekrl.engines import LocalEngine
from seekrl.models import make_tiny_model
from seekrl.servers.engine import make_app
from seekrl.types import SamplingParams

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def engine(tiny_tokenizer, sharp_tiny):
    return LocalEngine(sharp_tiny(3), tiny_tokenizer, seed=0)


@pytest.fixture
def server(engine, tiny_tokenizer):
    app = make_app(engine, tiny_tokenizer, model_path="tiny-test", token=TOKEN, max_body_bytes=200_000,
                   max_prompts_per_request=8)
    with LiveServer(app) as url:
        yield url


@pytest.fixture
def prompts(tiny_tokenizer):
    return [tiny_tokenizer.encode(t, add_special_tokens=False) for t in ("Question: 12 + 30?", "the quick brown fox")]


def post(url, path, body, headers=AUTH, timeout=60):
    return httpx.post(url + path, json=body, headers=headers, timeout=timeout)


def test_generate_matches_the_in_process_engine(server, tiny_tokenizer, prompts, sharp_tiny):
    sp = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 12, "sampling_seed": 17}
    r = post(server, "/generate", {"input_ids": prompts, "sampling_params": sp, "return_logprob": True, "rid": ["a", "b"]})
    assert r.status_code == 200, r.text
    answers = r.json()
    local = LocalEngine(sharp_tiny(3), tiny_tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=17)
    for p, a, rid in zip(prompts, answers, ["a", "b"]):
        ref = asyncio.run(local.generate(p, params))
        meta = a["meta_info"]
        assert a["output_ids"] == ref.token_ids
        assert [x[1] for x in meta["output_token_logprobs"]] == ref.token_ids
        assert [x[0] for x in meta["output_token_logprobs"]] == pytest.approx(ref.logprobs, abs=1e-5)
        assert all(x[2] is None for x in meta["output_token_logprobs"])
        assert meta["id"] == rid and meta["weight_version"] == 0 and "weight_versions" not in meta
        assert meta["prompt_tokens"] == len(p) and meta["completion_tokens"] == len(ref.token_ids)
        assert a["text"] == tiny_tokenizer.decode(ref.token_ids, skip_special_tokens=True)
        reason = meta["finish_reason"]
        assert reason["type"] == ref.finish_reason
        if reason["type"] == "length":
            assert reason["length"] == 12
    # one flat prompt answers one object; no return_logprob, no log-probs
    one = post(server, "/generate", {"input_ids": prompts[0], "sampling_params": sp}).json()
    assert one["output_ids"] == answers[0]["output_ids"] and "output_token_logprobs" not in one["meta_info"]


def test_stop_string_and_stop_token_ids(server, tiny_tokenizer, prompts):
    base = {"temperature": 1.0, "max_new_tokens": 30, "sampling_seed": 5, "ignore_eos": True}
    free = post(server, "/generate", {"input_ids": prompts[0], "sampling_params": base}).json()["output_ids"]
    stop_id = free[8]
    cut = post(server, "/generate", {"input_ids": prompts[0], "sampling_params": {**base, "stop_token_ids": [stop_id]}}).json()
    k = free.index(stop_id)
    assert cut["output_ids"] == free[: k + 1]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}


def test_abort_request_mid_generation(server, engine, prompts):
    sp = {"temperature": 1.0, "max_new_tokens": 900, "ignore_eos": True, "sampling_seed": 3}
    out = {}
    t = threading.Thread(target=lambda: out.update(r=post(server, "/generate", {"input_ids": prompts[0], "sampling_params": sp, "rid": "long", "return_logprob": True})))
    t.start()
    deadline = time.monotonic() + 30
    while engine.stats["forward_steps"] < 30:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = post(server, "/abort_request", {"rid": "long"})
    assert r.status_code == 200 and r.json()["aborted"] == 1
    t.join(30)
    a = out["r"].json()
    assert a["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(a["output_ids"]) < 900 == sp["max_new_tokens"]
    assert len(a["meta_info"]["output_token_logprobs"]) == len(a["output_ids"])
    assert post(server, "/abort_request", {}).status_code == 400  # neither rid nor abort_all


def test_weight_update_changes_samples_and_a_bad_folder_keeps_the_old_weights(server, tiny_tokenizer, prompts, tmp_path, sharp_tiny):
    greedy = {"input_ids": prompts[0], "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}}
    before = post(server, "/generate", greedy).json()
    other = sharp_tiny(11)
    other.save_pretrained(tmp_path / "v5")
    r = post(server, "/update_weights_from_disk", {"model_path": str(tmp_path / "v5"), "weight_version": 5})
    assert r.status_code == 200 and r.json()["success"] is True
    after = post(server, "/generate", greedy).json()
    assert after["meta_info"]["weight_version"] == 5 and after["output_ids"] != before["output_ids"]
    ref = asyncio.run(LocalEngine(other, tiny_tokenizer).generate(prompts[0], SamplingParams(10, 0.0, ignore_eos=True)))
    assert after["output_ids"] == ref.token_ids

    bigger = make_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=1)  # does not fit
    bigger.save_pretrained(tmp_path / "wrong")
    (tmp_path / "truncated").mkdir()
    raw = (tmp_path / "v5" / "model.safetensors").read_bytes()
    (tmp_path / "truncated" / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    for folder in (tmp_path / "wrong", tmp_path / "truncated", tmp_path / "missing", tmp_path):
        r = post(server, "/update_weights_from_disk", {"model_path": str(folder), "weight_version": 6})
        assert r.status_code == 400, folder
        body = r.json()
        assert body["success"] is False and "\n" not in body["message"] and "Traceback" not in r.text
    still = post(server, "/generate", greedy).json()
    assert still["output_ids"] == after["output_ids"] and still["meta_info"]["weight_version"] == 5
    info = httpx.get(server + "/model_info", headers=AUTH).json()
    assert info["weight_version"] == 5 and info["model_path"] == "tiny-test" and info["max_context"] == 1024
    assert httpx.get(server + "/get_model_info", headers=AUTH).json() == info


def test_in_place_pause_update_continue_gives_version_spans(server, engine, tiny_tokenizer, prompts, tmp_path):
    make_tiny_model(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=2).save_pretrained(tmp_path / "v1")
    sp = {"temperature": 1.0, "max_new_tokens": 600, "ignore_eos": True, "sampling_seed": 9}
    out = {}
    t = threading.Thread(target=lambda: out.update(r=post(server, "/generate", {"input_ids": prompts[1], "sampling_params": sp})))
    t.start()
    deadline = time.monotonic() + 30
    while engine.stats["forward_steps"] < 40:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert post(server, "/pause_generation", {"mode": "in_place"}).json()["success"]
    assert post(server, "/update_weights_from_disk", {"model_path": str(tmp_path / "v1"), "weight_version": 1}).json()["success"]
    assert post(server, "/continue_generation", None).status_code == 200
    t.join(60)
    meta = out["r"].json()["meta_info"]
    spans = meta["weight_versions"]
    assert [s["version"] for s in spans] == [0, 1]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 600
    assert meta["weight_version"] == 1 and meta["finish_reason"]["type"] == "length"


def test_pause_abort_returns_running_requests_and_holds_new_ones(server, engine, prompts):
    sp = {"temperature": 1.0, "max_new_tokens": 900, "ignore_eos": True}
    out = {}
    t = threading.Thread(target=lambda: out.update(r=post(server, "/generate", {"input_ids": prompts[0], "sampling_params": sp})))
    t.start()
    deadline = time.monotonic() + 30
    while engine.stats["forward_steps"] < 20:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = httpx.post(server + "/pause_generation", headers=AUTH, timeout=10)  # no body: SGLang's default, abort
    short = {"max_new_tokens": 2, "ignore_eos": True}  # a sampled end-of-sequence must not cut it to one token
    assert r.status_code == 200
    t.join(30)
    assert out["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    with pytest.raises(httpx.ReadTimeout):  # held while paused
        post(server, "/generate", {"input_ids": prompts[0], "sampling_params": short}, timeout=0.5)
    assert post(server, "/continue_generation", {}).status_code == 200
    assert len(post(server, "/generate", {"input_ids": prompts[0], "sampling_params": short}).json()["output_ids"]) == 2
    assert post(server, "/pause_generation", {"mode": "later"}).status_code == 400


BAD_GENERATE = [
    ({"input_ids": "12 13"}, "input_ids"),
    ({"input_ids": [1, 2.5]}, "input_ids"),
    ({"input_ids": [1, True]}, "input_ids"),
    ({"input_ids": []}, "empty prompt"),
    ({"input_ids": [[1, 2], []]}, "empty prompt"),
    ({"input_ids": [1, 100000]}, "outside the vocabulary"),
    ({"input_ids": [1, -1]}, "outside the vocabulary"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5000}}, "context"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}}, "temperature"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1, 2], "sampling_params": {"min_p": 0.1}}, "min_p"),
    ({"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"input_ids": [1, 2], "sampling_params": {"typical_p": 0.5}}, "typical_p"),
    ({"input_ids": [1, 2], "sampling_params": {"n": 4}}, "n"),
    ({"input_ids": [1, 2], "sampling_params": {"stop_token_ids": [999]}}, "stop_token_ids"),
    ({"input_ids": [1, 2], "text": "hello"}, "text"),
    ({"input_ids": [1, 2], "stream": True}, "stream"),
    ({"input_ids": [[1, 2], [3, 4]], "rid": ["only-one"]}, "rid"),
    ([1, 2, 3], "JSON object"),
]


@pytest.mark.parametrize("body,needle", BAD_GENERATE)
def test_bad_generate_requests_are_one_line_400s(server, body, needle):
    r = post(server, "/generate", body)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert needle in msg and "\n" not in msg and "Traceback" not in r.text


def test_limits_auth_and_status_endpoints(server, engine):
    many = {"input_ids": [[1, 2]] * 9}
    assert post(server, "/generate", many).status_code == 413  # over --max-prompts-per-request
    big = {"input_ids": [1] * 120_000}
    assert post(server, "/generate", big).status_code == 413  # over the body limit
    deep = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(server + "/generate", content=deep, headers={**AUTH, "content-type": "application/json"}, timeout=10)
    assert r.status_code == 413 or (r.status_code == 400 and "nested" in r.json()["error"]["message"])
    nested = json.dumps({"input_ids": [1, 2], "rid": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})
    r = httpx.post(server + "/generate", content=nested, headers={**AUTH, "content-type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
    bad_utf8 = httpx.post(server + "/generate", content=b'{"input_ids": [1], "rid": "\xff"}', headers=AUTH, timeout=10)
    assert bad_utf8.status_code == 400
    assert post(server, "/generate", {"input_ids": [1, 2]}, headers={}).status_code == 401
    assert post(server, "/generate", {"input_ids": [1, 2]}, headers={"Authorization": "Bearer nope"}).status_code == 401
    lower = post(server, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
                 headers={"Authorization": f"bearer {TOKEN}"})
    assert lower.status_code == 200
    for path in ("/model_info", "/server_info"):
        assert httpx.get(server + path).status_code == 401
    assert post(server, "/update_weights_from_disk", {"model_path": "/x"}, headers={}).status_code == 401
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    assert post(server, "/flush_cache", None).json()["success"] is True
    info = httpx.get(server + "/server_info", headers=AUTH).json()
    assert info["stats"]["rejected"] >= 8 and info["limits"]["max_prompts_per_request"] == 8
    assert info["weight_version"] == 0 and info["engine"]["requests"] >= 1


def test_a_client_that_disconnects_has_its_request_cancelled(server, engine, prompts):
    sp = {"temperature": 1.0, "max_new_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        post(server, "/generate", {"input_ids": prompts[0], "sampling_params": sp}, timeout=0.5)
    deadline = time.monotonic() + 2.0
    while engine.stats["aborted"] < 1 or engine.in_flight:
        assert time.monotonic() < deadline, "the server kept generating for a client that left"
        time.sleep(0.02)
    info = httpx.get(server + "/server_info", headers=AUTH).json()
    assert info["stats"]["cancelled"] == 1


def test_one_sampling_params_per_prompt(server, tiny_tokenizer, prompts):
    """SGLang's batch form: a list of sampling_params, one per prompt, each with its own seed."""
    sps = [{"temperature": 1.0, "max_new_tokens": 6, "sampling_seed": 1, "ignore_eos": True},
           {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}]
    both = post(server, "/generate", {"input_ids": prompts, "sampling_params": sps, "return_logprob": True}).json()
    alone = [post(server, "/generate", {"input_ids": p, "sampling_params": sp, "return_logprob": True}).json()
             for p, sp in zip(prompts, sps)]
    assert [a["output_ids"] for a in both] == [a["output_ids"] for a in alone]
    assert [len(a["output_ids"]) for a in both] == [6, 4]
    r = post(server, "/generate", {"input_ids": prompts, "sampling_params": sps[:1]})
    assert r.status_code == 400 and "one per prompt" in r.json()["error"]["message"]
