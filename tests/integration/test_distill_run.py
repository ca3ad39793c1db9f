"""On-policy distillation end to end: the teachers (train/teacher.py), the engine server's /score,
the vLLM client against a server that answers in vLLM's shape, the tokenizer check, a short run.

- A local teacher scores with the trainer's own pass: a teacher equal to the student gives
  exactly the student's log-probs, so reverse KL 0 and zero distillation advantages.
- `seekrl serve engine`'s POST /score (a real app on 127.0.0.1, bearer token, body limit) gives
  the local teacher's log-probs; a server that cannot be reached is one line.
- vLLM: no vLLM runs here. A fake server answers /v1/completions with `prompt_logprobs` and
  /tokenize in the shapes vLLM's sources give (engines/scoring.py), from the same tiny model.
- A teacher with another tokenizer is refused before training, in one line.
- A few steps of `algo.name=distill` on tiny:copy lower the reverse KL.
"""

from __future__ import annotations

import copy
import json
import math

import httpx
import pytest
import torch
from live_server import LiveServer, free_port
from procs import stop_process

from seekrl.build import build_teacher, check_teacher, policy_trainer, write_initial_weights
from seekrl.config import load_config
from seekrl.engines.local import LocalEngine
from seekrl.engines.scoring import TeacherClient
from seekrl.errors import ConfigError, EngineRequestError, EngineUnavailable
from seekrl.models import load_model, save_tiny, train_tiny_tokenizer
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import undocumented
from seekrl.servers.engine import make_app
from seekrl.train.batch import TokenBatch
from seekrl.train.estimate import estimate_advantages
from seekrl.train.teacher import LocalTeacher, RemoteTeacher, score_completions, scoring_batch, teacher_plan
from seekrl.types import Task, Trajectory

TOKEN = "distill-s3cret"


def cfg_of(*overrides):
    return load_config(None, ["model.path=tiny", "model.device=cpu", "data.train=tiny:copy", *overrides])


def token_batch(vocab: int, seed: int = 0) -> TokenBatch:
    """Two groups of three rows (shared prompts), completions of different lengths, inserted tokens (mask 0)."""
    gen = torch.Generator().manual_seed(seed)
    trajs, group_ids = [], []
    for g, plen in enumerate((5, 9)):
        prompt = torch.randint(3, vocab, (plen,), generator=gen).tolist()
        for k, n in enumerate((4, 7, 2)):
            ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
            mask = [1] * n if k != 1 else [1, 1, 0, 0, 0, 1, 1]  # row 1: a tool's output in the middle
            trajs.append(Trajectory(Task(id=f"t{g}", prompt=[], answer=""), prompt, ids, mask, [0.0] * n, [0] * n, reward=float(k)))
            group_ids.append(g)
    return TokenBatch.from_trajectories(trajs, group_ids)


@pytest.fixture
def student(sharp_tiny):
    return sharp_tiny(1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_local_teacher_equal_to_the_student_gives_the_trainer_s_log_probs_and_zero_reward(student, tiny_tokenizer, temperature):
    cfg = cfg_of(f"rollout.temperature={temperature}")
    trainer = policy_trainer(cfg, student, tiny_tokenizer.pad_token_id)
    teacher_model = copy.deepcopy(student)
    teacher = LocalTeacher(teacher_model, teacher_plan(teacher_model, cfg.train, tiny_tokenizer.pad_token_id), temperature)
    batch = token_batch(len(tiny_tokenizer))
    batch.old_logp_BC = trainer.logprobs(batch)
    batch.teacher_logp_BC = teacher.logprobs(batch)
    assert torch.equal(batch.teacher_logp_BC, batch.old_logp_BC)  # the same scoring pass, bit for bit
    assert (batch.old_logp_BC[batch.token_mask_BC] < 0).all()  # real log-probs, not zeros
    est = estimate_advantages("distill", batch)
    assert est.metrics["distill/reverse_kl"] == 0.0 and not est.adv_BC.any()
    # another teacher: a reward on the sampled tokens only, 0 on the inserted ones
    other = LocalTeacher(copy.deepcopy(student).requires_grad_(False), trainer.plan, temperature)
    with torch.no_grad():
        other.model.model.norm.weight.mul_(3.0)  # a sharper teacher
    batch.teacher_logp_BC = other.logprobs(batch)
    est = estimate_advantages("distill", batch)
    assert est.metrics["distill/reverse_kl"] != 0.0
    assert est.adv_BC[batch.loss_mask_BC > 0].abs().min() > 0 and not est.adv_BC[batch.loss_mask_BC == 0].any()


def serve(model, tokenizer, **limits):
    engine = LocalEngine(model, tokenizer, seed=0)
    return engine, LiveServer(make_app(engine, tokenizer, model_path="teacher", token=TOKEN, **limits))


def test_the_engine_server_scores_what_the_local_teacher_scores(student, tiny_tokenizer, tiny_texts):
    cfg = cfg_of("rollout.temperature=0.7")
    local = LocalTeacher(student, teacher_plan(student, cfg.train, tiny_tokenizer.pad_token_id), 0.7)
    batch = token_batch(len(tiny_tokenizer), seed=3)
    expected = local.logprobs(batch)
    engine, live = serve(copy.deepcopy(student), tiny_tokenizer, max_body_bytes=20_000, max_prompts_per_request=4)
    try:
        with live as url:
            client = TeacherClient(url, "seekrl", token=TOKEN, chunk=4)  # 6 rows: two requests
            client.check_tokenizer(tiny_tokenizer)
            remote = RemoteTeacher(client, 0.7)
            got = remote.logprobs(batch)
            assert got.shape == expected.shape and client.requests == 3  # /model_info + two /score
            assert torch.allclose(got, expected, atol=1e-5, rtol=0)
            assert not got[~batch.token_mask_BC].any()
            # rows sampled at their own temperature (answer branches, TokenBatch.temperature_B; NaN: the run's)
            # are scored at it on the server as in the trainer
            batch.temperature_B = torch.tensor([math.nan, 1.6, math.nan, 1.6, 0.4, math.nan])
            hot = remote.logprobs(batch)
            assert torch.allclose(hot, local.logprobs(batch), atol=1e-5, rtol=0)
            own = torch.tensor([False, True, False, True, True, False])
            assert torch.equal(hot[~own], got[~own])
            assert (hot[own] - got[own])[batch.token_mask_BC[own]].abs().min() > 1e-3  # not scored at 0.7
            batch.temperature_B = None
            other = train_tiny_tokenizer([*tiny_texts, "a new word: zyzzyva"], vocab_size=130)
            with pytest.raises(ConfigError, match="another tokenizer") as err:
                client.check_tokenizer(other)
            assert "\n" not in str(err.value)
            remote.close()

            # the endpoint's guards, as a client that is not seekrl's sees them
            ids = batch.prompt_ids[0] + batch.completion_ids[0]
            h = {"Authorization": f"Bearer {TOKEN}"}
            r = httpx.post(url + "/score", json={"input_ids": ids, "start": len(batch.prompt_ids[0]), "temperature": 0.7}, headers=h)
            assert r.status_code == 200 and r.json()["weight_version"] == 0
            assert r.json()["logprobs"] == pytest.approx(expected[0, :4].tolist(), abs=1e-5)  # one flat sequence: one flat list
            r = httpx.post(url + "/score", json={"input_ids": [ids, ids]}, headers=h)  # start 1, temperature 1: every token but the first
            assert r.status_code == 200 and [len(x) for x in r.json()["logprobs"]] == [len(ids) - 1] * 2
            r = httpx.post(url + "/score", json={"input_ids": ids})
            assert r.status_code == 401
            with pytest.raises(EngineRequestError, match="HTTP 401.*algo.teacher.token_env"):
                TeacherClient(url, "seekrl").score([ids], [1], 1.0)
            for body, status, needle in [
                ({"input_ids": ids, "start": 0}, 400, "start=0"),
                ({"input_ids": ids, "start": len(ids) + 1}, 400, "outside"),
                ({"input_ids": [ids, ids], "start": [1, 2, 3]}, 400, "3 entries for 2"),
                ({"input_ids": [ids, [10**6]]}, 400, "outside the vocabulary"),
                ({"input_ids": ids, "temperature": 0}, 400, "temperature"),
                ({"input_ids": [ids, ids], "temperature": [0.7, 0.7, 1.0]}, 400, "3 entries for 2"),
                ({"input_ids": [ids, ids], "temperature": [0.7, -1.0]}, 400, "temperature"),
                ({"input_ids": [ids] * 5}, 413, "at most 4"),
                ({"input_ids": [list(range(3, 100))] * 4, "pad": "x" * 20_000}, 413, "over the limit"),
            ]:
                r = httpx.post(url + "/score", json=body, headers=h)
                assert r.status_code == status and needle in r.json()["detail"], (body, r.text)
            info = httpx.get(url + "/model_info", headers=h).json()
            assert len(info["vocab_digest"]) == 64
    finally:
        engine.close()


def test_a_teacher_server_that_cannot_be_reached_is_one_line():
    client = TeacherClient(f"http://127.0.0.1:{free_port()}", "seekrl", tries=2, backoff_s=0.01, timeout_s=5)
    with pytest.raises(EngineUnavailable, match=r"did not answer /score in 2 tries.*seekrl serve engine") as err:
        client.score([[5, 6, 7]], [1], 1.0)
    assert "\n" not in str(err.value)
    client.close()


class FakeVLLM:
    """/v1/completions (prompt_logprobs) and /tokenize in vLLM's shapes, from `model` and `tokenizer`."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer, self.bodies = model, tokenizer, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        req = json.loads(body or b"{}")
        self.bodies.append((scope["path"], req))
        if scope["path"] == "/tokenize":
            answer = {"count": 0, "max_model_len": 64, "tokens": self.tokenizer.encode(req["prompt"], add_special_tokens=False)}
            answer["count"] = len(answer["tokens"])
        else:
            prompts = req["prompt"]
            plan = teacher_plan(self.model, cfg_of().train, self.tokenizer.pad_token_id)
            logp = score_completions(self.model, plan, scoring_batch(prompts, [1] * len(prompts)), 1.0)
            choices = []
            for i, ids in enumerate(prompts):
                entries = [None] + [
                    {str(t): {"logprob": float(logp[i, j - 1]), "rank": 2, "decoded_token": "x"},
                     str((t + 1) % 100): {"logprob": -0.01, "rank": 1, "decoded_token": "y"}}  # a top-1 that is not the prompt's token
                    for j, t in enumerate(ids) if j > 0
                ]
                choices.append({"index": i, "text": "z", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                                "prompt_logprobs": entries})
            answer = {"id": "cmpl-1", "object": "text_completion", "model": "teacher", "choices": choices[::-1],  # any order
                      "usage": {"prompt_tokens": 0, "completion_tokens": len(prompts), "total_tokens": 0}}
        data = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})


def test_the_vllm_client_reads_prompt_logprobs(student, tiny_tokenizer, tiny_texts):
    cfg = cfg_of()
    local = LocalTeacher(student, teacher_plan(student, cfg.train, tiny_tokenizer.pad_token_id), 1.0)
    batch = token_batch(len(tiny_tokenizer), seed=5)
    fake = FakeVLLM(copy.deepcopy(student), tiny_tokenizer)
    with LiveServer(fake) as url:
        client = TeacherClient(url, "vllm")
        client.check_tokenizer(tiny_tokenizer)
        with pytest.raises(ConfigError, match="encodes a probe text"):
            client.check_tokenizer(train_tiny_tokenizer([*tiny_texts, "zyzzyva zyzzyva"], vocab_size=140))
        got = RemoteTeacher(client, 1.0).logprobs(batch)
        assert torch.allclose(got, local.logprobs(batch), atol=1e-5, rtol=0)
        client.close()
    path, body = next(b for b in fake.bodies if b[0] == "/v1/completions")
    assert body["prompt_logprobs"] == 0 and body["max_tokens"] == 1 and body["temperature"] == 1.0
    assert body["prompt"][0] == batch.prompt_ids[0] + batch.completion_ids[0]
    # vLLM's prompt log-probs take no temperature: a run sampling at another one is refused before it starts
    with pytest.raises(ConfigError, match="rollout.temperature=0.7"):
        check_teacher(cfg_of("algo.name=distill", "algo.teacher.url=http://127.0.0.1:9", "algo.teacher.api=vllm",
                             "rollout.temperature=0.7"))
    with pytest.raises(ConfigError, match="rollout.branch_temperature=1.5"):  # answer branches sampled at their own
        check_teacher(cfg_of("algo.name=distill", "algo.teacher.url=http://127.0.0.1:9", "algo.teacher.api=vllm",
                             "rollout.answer_branches=2", "rollout.branch_temperature=1.5", "tools.format=search_r1",
                             "tools.retriever=http://127.0.0.1:1/retrieve"))
    with pytest.raises(ConfigError, match="TEACHER_TOKEN_UNSET"):
        check_teacher(cfg_of("algo.name=distill", "algo.teacher.url=http://127.0.0.1:9", "algo.teacher.token_env=TEACHER_TOKEN_UNSET"))


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path, tiny_texts):
    student_tok = train_tiny_tokenizer(tiny_texts, vocab_size=128)
    other_tok = train_tiny_tokenizer([*tiny_texts, "zyzzyva zyzzyva zyzzyva"], vocab_size=128)
    model, _ = load_model("tiny", tiny_texts=tiny_texts, tiny_hidden=32, tiny_layers=1)
    save_tiny(model, student_tok, tmp_path / "same" / "checkpoints" / "step_2" / "model")
    save_tiny(model, other_tok, tmp_path / "other")
    # a checkpoint folder (runs/NAME/checkpoints/step_N) is taken as its model/
    cfg = cfg_of("algo.name=distill", f"algo.teacher.path={tmp_path / 'same' / 'checkpoints' / 'step_2'}")
    check_teacher(cfg)
    teacher = build_teacher(cfg, student_tok, texts=None)
    assert isinstance(teacher, LocalTeacher) and not any(p.requires_grad for p in teacher.model.parameters())
    with pytest.raises(ConfigError, match=r"algo.teacher.path: the teacher's tokenizer is not the policy's.*entries differ") as err:
        build_teacher(cfg_of("algo.name=distill", f"algo.teacher.path={tmp_path / 'other'}"), student_tok, texts=None)
    assert "\n" not in str(err.value) and "model.path=tiny trains its tokenizer" in str(err.value) and "train.seed" in str(err.value)
    with pytest.raises(ConfigError, match="algo.teacher.path: folder .* has no config.json"):
        check_teacher(cfg_of("algo.name=distill", f"algo.teacher.path={tmp_path}"))


def test_a_short_distillation_run_lowers_the_reverse_kl(tmp_path):
    from seekrl.jobs import train

    common = ["model.tiny_hidden=64", "model.max_context=64", "data.eval=null", "rollout.group_size=4", "rollout.batch_size=32",
              "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=32", "reward.functions=[qa_f1]", f"log.dir={tmp_path}",
              "log.progress=false", "log.tensorboard=false", "log.samples_every=0", "train.save_every=0"]
    # the teacher: the student's starting weights and tokenizer, 8x sharper (its final norm scaled):
    # far from the student at first (reverse KL ~3 nats per token), and reachable
    start = write_initial_weights(cfg_of(*common), tmp_path / "init")
    model, tok = load_model(str(start))
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    save_tiny(model, tok, tmp_path / "teacher")
    run = train(cfg_of(*common, "algo.name=distill", f"algo.teacher.path={tmp_path / 'teacher'}", "train.steps=40",
                       "train.lr=3e-3", "train.warmup_steps=0", "log.name=distill"))
    rows = [r for r in read_metrics(run) if r["step"] > 0]
    kl = [r["distill/reverse_kl"] for r in rows]
    assert len(kl) == 40 and all(math.isfinite(x) for x in kl)
    first, last = sum(kl[:5]) / 5, sum(kl[-5:]) / 5
    assert first > 1.0 and last < 0.5 * first, f"the reverse KL did not go down: {first:.3f} -> {last:.3f} ({[round(x, 3) for x in kl]})"
    assert all("reward/mean" in r for r in rows)  # the task reward is still scored and logged
    assert undocumented({k for r in rows for k in r}) == []


def test_a_run_distils_from_a_started_seekrl_server(tmp_path):
    """`seekrl serve engine --model TEACHER` in its own process (bearer token from a variable), and a
    run with algo.teacher.url: the reverse KL of the run with algo.teacher.path; without the token, one line."""
    import os
    import subprocess
    import sys
    import time

    from seekrl.jobs import train

    common = ["model.tiny_hidden=64", "model.max_context=64", "data.eval=null", "rollout.group_size=4", "rollout.batch_size=16",
              "rollout.max_new_tokens=6", "rollout.max_prompt_tokens=32", "reward.functions=[qa_f1]", f"log.dir={tmp_path}",
              "log.progress=false", "log.tensorboard=false", "log.samples_every=0", "train.save_every=0", "train.steps=3",
              "algo.name=distill"]
    model, tok = load_model(str(write_initial_weights(cfg_of(*common[:-1]), tmp_path / "init")))
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    save_tiny(model, tok, tmp_path / "teacher")
    port = free_port()
    env = {**os.environ, "DISTILL_TEST_TOKEN": TOKEN}
    server = subprocess.Popen([sys.executable, "-m", "seekrl", "serve", "engine", "--model", str(tmp_path / "teacher"),
                               "--port", str(port), "--token-env", "DISTILL_TEST_TOKEN", "--compile", "false"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "seekrl serve engine did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        local = train(cfg_of(*common, f"algo.teacher.path={tmp_path / 'teacher'}", "log.name=local"))
        with pytest.raises(EngineRequestError, match="HTTP 401.*algo.teacher.token_env"):  # no token: refused, named
            train(cfg_of(*common, f"algo.teacher.url=http://127.0.0.1:{port}", "log.name=no_token"))
        os.environ["DISTILL_TEST_TOKEN"] = TOKEN
        try:
            remote = train(cfg_of(*common, f"algo.teacher.url=http://127.0.0.1:{port}", "algo.teacher.token_env=DISTILL_TEST_TOKEN",
                                  "log.name=remote"))
        finally:
            del os.environ["DISTILL_TEST_TOKEN"]
        a = [r["distill/reverse_kl"] for r in read_metrics(local) if r["step"] > 0]
        b = [r["distill/reverse_kl"] for r in read_metrics(remote) if r["step"] > 0]
        assert len(a) == len(b) == 3 and a[0] > 1.0 and all(math.isfinite(x) for x in b)
        # step 1: the same samples from the same start, the same teacher (padded vs shared-prefix layouts)
        assert b[0] == pytest.approx(a[0], abs=1e-4)
    finally:
        stop_process(server)
