"""The OpenAI-compatible policy server on 127.0.0.1, driven by the official `openai` client.

A real uvicorn server runs in a thread on a free loopback port over LocalEngine(tiny model).
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402
import uvicorn  # noqa: E402
from live_server import LiveServer  # noqa: E402

from seekrl.engines.local import LocalEngine  # noqa: E402
from seekrl.models import encode_chat  # noqa: E402
from seekrl.servers.policy import TOKEN_ENV, main, make_app, serve_policy  # noqa: E402

TOKEN = "secret"
CAP = 64
MESSAGES = [{"role": "user", "content": "Question: what is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer):
    """Base URL of a live server with token "secret", max_tokens_cap=64, a 4,000-byte body limit."""
    engine = LocalEngine(tiny_model, tiny_tokenizer, max_batch_size=16)
    app = make_app(engine, tiny_tokenizer, model_name="tiny-policy", token=TOKEN, max_body_bytes=4_000, max_tokens_cap=CAP)
    with LiveServer(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=f"{server}/v1", api_key=TOKEN, max_retries=0, timeout=30)
    yield c
    c.close()


@pytest.fixture(scope="module")
def id_of(tiny_tokenizer):
    """Decoded token text -> id (the tiny tokenizer's tokens decode to distinct strings)."""
    table = {tiny_tokenizer.decode([i], skip_special_tokens=False): i for i in range(len(tiny_tokenizer))}
    assert len(table) == len(tiny_tokenizer)
    return table


def _post(server, path, json=None, token=TOKEN, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server}{path}", json=json, headers=headers, timeout=30, **kw)


def test_chat_completion_content_usage_and_logprobs(client, tiny_model, tiny_tokenizer, id_of):
    r = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=12, seed=7, logprobs=True)
    assert r.object == "chat.completion" and r.model == "tiny-policy" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    entries = choice.logprobs.content
    ids = [id_of[e.token] for e in entries]
    prompt = encode_chat(tiny_tokenizer, MESSAGES)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == len(ids) and 1 <= len(ids) <= 12
    assert r.usage.total_tokens == len(prompt) + len(ids)
    assert choice.message.content == tiny_tokenizer.decode(ids, skip_special_tokens=True)
    assert all(e.bytes is None and e.top_logprobs == [] for e in entries)
    # the engine's log-probs (T=1) equal a plain forward pass over prompt + completion
    with torch.no_grad():
        logits = tiny_model(torch.tensor([prompt + ids])).logits[0].float()
    ref = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor([e.logprob for e in entries]), ref, atol=1e-4)
    # same seed, same sample; without logprobs the field is null
    again = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=12, seed=7)
    assert again.choices[0].message.content == choice.message.content and again.choices[0].logprobs is None


def test_max_tokens_length_greedy_and_n(client):
    r = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r2 = client.chat.completions.create(model="x", messages=MESSAGES, max_completion_tokens=5, temperature=0)
    assert r2.choices[0].message.content == r.choices[0].message.content
    r3 = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=6, n=3, logprobs=True)
    assert [c.index for c in r3.choices] == [0, 1, 2]
    assert r3.usage.completion_tokens == sum(len(c.logprobs.content) for c in r3.choices)
    assert all(e.logprob <= 0 for c in r3.choices for e in c.logprobs.content)


def test_stop_string_is_cut_from_content(client):
    # a seeded sample is reproducible and does not depend on the batch, so its prefix repeats
    full = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=40, seed=3).choices[0]
    text = full.message.content
    stop = next((text[k : k + 2] for k in range(2, len(text) - 1) if text[k : k + 2].strip() and text.find(text[k : k + 2]) >= 2), None)
    if stop is None:
        pytest.skip(f"sampled text {text!r} has no usable stop string")
    r = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=40, seed=3, stop=[stop, "@@never@@"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.find(stop)]


def test_completions_endpoint(client, tiny_tokenizer):
    r = client.completions.create(model="x", prompt="the quick brown fox", max_tokens=4, temperature=0, logprobs=0)
    (choice,) = r.choices
    assert r.object == "text_completion" and choice.finish_reason == "length" and r.usage.completion_tokens == 4
    assert r.usage.prompt_tokens == len(tiny_tokenizer("the quick brown fox")["input_ids"])
    assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == 4
    assert choice.text == "".join(choice.logprobs.tokens)  # no special tokens were sampled greedily here
    ids = tiny_tokenizer("the quick brown fox")["input_ids"]
    by_ids = client.completions.create(model="x", prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == choice.text
    batch = client.completions.create(model="x", prompt=["a b", "c d"], max_tokens=3, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]


def test_errors_through_the_client(server, client):
    bad = openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="x", messages=MESSAGES, max_tokens=2)
    bad.close()
    with pytest.raises(openai.BadRequestError, match="streaming is not supported"):
        client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=2, stream=True)
    with pytest.raises(openai.BadRequestError, match="over this server's limit of 64"):
        client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=CAP + 1)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=2, logprobs=True, top_logprobs=3)
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-policy"]


def test_errors_over_http(server):
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES}, token=None)
    assert r.status_code == 401 and "missing bearer token" in r.json()["error"]["message"]
    assert httpx.get(f"{server}/v1/models", timeout=30).status_code == 401
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "whatever": [1], "tools": []})
    assert r.status_code == 200  # unknown fields are ignored
    r = _post(server, "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["detail"]
    r = _post(server, "/v1/chat/completions", {"messages": [], "max_tokens": 2})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "temperature": "hot"})
    assert r.status_code == 400 and "temperature" in r.json()["detail"]
    r = _post(server, "/v1/chat/completions", {"messages": [{"content": "no role"}]})
    assert r.status_code == 400 and "role" in r.json()["detail"]
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 5_000}]})
    assert r.status_code == 413
    r = _post(server, "/v1/completions", {"prompt": [100_000], "max_tokens": 2})
    assert r.status_code == 400 and "token ids" in r.json()["detail"]
    r = _post(server, "/v1/completions", {"prompt": "", "max_tokens": 2})
    assert r.status_code == 400
    assert httpx.get(f"{server}/health", timeout=30).json() == {"status": "ok"}
    info = httpx.get(f"{server}/server_info", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).json()
    assert info["model"] == "tiny-policy" and info["stats"]["generations"] >= 1 and info["stats"]["rejected"] >= 8


def test_serve_policy_loads_and_reads_token_env(tmp_path, monkeypatch, tiny_model, tiny_tokenizer):
    from starlette.testclient import TestClient

    from seekrl.models import save_tiny

    save_tiny(tiny_model, tiny_tokenizer, tmp_path / "m")
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    serve_policy(str(tmp_path / "m"), port=0, device="cpu")
    assert seen["host"] == "127.0.0.1"
    with TestClient(seen["app"]) as tc:
        assert tc.get("/v1/models").status_code == 401
        r = tc.get("/v1/models", headers={"Authorization": "Bearer from-env"})
        assert r.json()["data"][0]["id"] == str(tmp_path / "m")
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tmp_path / "missing"), "--device", "cpu"])
    assert e.value.code == 2
