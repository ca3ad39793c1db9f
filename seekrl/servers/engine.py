"""`seekrl serve engine`: SGLang's native RL API over a LocalEngine, on a CPU or a GPU.

    seekrl serve engine --model PATH [--host 127.0.0.1] [--port 30000] [--token T | --token-env VAR]
                        [--max-batch-size N] [--seed S] [--max-body-mb M] [--max-prompts-per-request K]

PATH is anything `model.path` accepts (a folder with safetensors and config.json, `tiny`,
`smollm2`, a .gguf file). The server speaks the subset of SGLang's native HTTP API that RL
trainers use, with SGLang's field names, so a client written for one works with the other
(`seekrl.engines.RemoteEngine` with `engine.api=sglang` talks to both):

    POST /generate                 {"input_ids": [...] | [[...], ...], "sampling_params": {...} | [{...}, ...],
                                    "return_logprob": bool, "rid": str | [str, ...]}
    POST /update_weights_from_disk {"model_path": DIR, "weight_version": V} -> {"success", "message"}
    POST /pause_generation         {"mode": "abort" | "retract" | "in_place"}   (default "abort", as SGLang)
    POST /continue_generation
    POST /abort_request            {"rid": str, "abort_all": bool}
    POST /flush_cache              (no prefix cache to flush: answers success)
    POST /score                    {"input_ids": [...] | [[...], ...], "start": int | [int, ...], "temperature": T | [T, ...]}
                                   -> {"logprobs": [...] | [[...], ...], "weight_version"}: a distillation teacher
    GET  /model_info, /get_model_info   model path, weight_version, max context, vocab size, vocab_digest
    GET  /health                   {"status": "ok"}, no token
    GET  /server_info              counters (requests, rejected, errors, cancelled, tokens, ...) and limits

`/generate` answers, per prompt, `{"output_ids", "text", "meta_info": {"id",
"output_token_logprobs": [[logprob, token_id, null], ...], "finish_reason": {"type": "stop" |
"length" | "abort", "matched" | "length" | "message"}, "weight_version", "weight_versions" (spans
`{"version", "start", "end"}`, only when the request crossed a weight update), "prompt_tokens",
"completion_tokens"}}`; a flat id list answers one object, a list of id lists a list. Tokens and
log-probs follow seekrl/engines/base.py exactly (EOS and stop-string tokens are kept in
`output_ids`; `text` is decoded with special tokens skipped). Concurrent requests are batched
together by the LocalEngine: requests that arrive while a batch runs form the next one.

`/score` (seekrl's own, not SGLang's) gives, for each sequence, the log-probs of its tokens
`start ..` (default 1: all but the first), each given the tokens before it:
`log_softmax(logits / temperature)[token]` (default temperature 1; one for all sequences, or one
per sequence: a student's rows sampled at different temperatures), computed by the trainer's own
scoring pass (train/teacher.py `score_completions`), so a model served here scores a student's
tokens as the same model would in the trainer (algo.teacher.url; engines/scoring.py is the client).
`vocab_digest` in /model_info is the sha256 of the tokenizer's vocabulary, which a distillation run
compares with its own before it starts.

Sampling parameters: temperature, top_p, top_k (-1 or 0: off), max_new_tokens (default 128),
stop, stop_token_ids, ignore_eos, sampling_seed; skip_special_tokens, spaces_between_special_tokens,
no_stop_trim and n=1 are accepted and change nothing. Parameters that would change the sampled
distribution without changing the reported log-probs (min_p, penalties) are a 400 unless they
have their neutral value, never silently ignored.

Pause modes, as SGLang's: "abort" ends the requests in flight with their tokens so far (finish
"abort"); "retract" stops the batch in flight and puts its requests back in the queue, so that
after /continue_generation they are prefilled again (prompt + tokens so far) under the weights
loaded meanwhile and go on; "in_place" parks the batch between two steps and keeps its KV cache.
Requests that arrive while paused wait. Each token carries the version of the weights that
computed its logits.

Bad input is a 4xx with a one-line JSON error (`{"error": {"message", ...}, "detail"}`), never a
500 with a traceback: wrong types, token ids outside the vocabulary, prompt + max_new_tokens over
the context, more prompts than --max-prompts-per-request (413), a body over --max-body-mb (413),
JSON nested too deeply, a weight folder that does not exist or does not fit the model (400 with
`success: false`; the old weights keep serving). A client that disconnects has its request
cancelled (its rows leave the running batch at the next step).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seekrl.api.guards import (
    Guard,
    HTTPError,
    add_status_routes,
    cancel_on_disconnect,
    check_port,
    check_temperature,
    json_error,
    openapi_body,
    parse_json,
    resolve_token,
    validation_message,
)
from seekrl.engines.launch import ENGINE_TOKEN_ENV
from seekrl.engines.scoring import vocab_digest
from seekrl.servers.flags import engine_flags
from seekrl.types import Completion, SamplingParams

__all__ = ["make_app", "serve_engine", "run_from_args", "main", "TOKEN_ENV", "GenerateRequest", "ScoreRequest", "completion_body",
           "weight_spans"]

log = logging.getLogger(__name__)

TOKEN_ENV = ENGINE_TOKEN_ENV  # the variable started servers get their token in (engines/launch.py)
DEFAULT_PORT = 30000  # SGLang's
MAX_STOPS = 16
SCORE_TOKEN_BUDGET = 8192  # /score: padded tokens per forward pass


class EngineSampling(BaseModel):
    """SGLang's `sampling_params`, the part this server implements (null means the default)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    max_new_tokens: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    sampling_seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: int | None = Field(default=None, ge=1, le=1)
    # accepted for compatibility, without effect: stop strings are always kept in output_ids,
    # and `text` always skips special tokens
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    # accepted at their neutral values only (they would change the distribution the log-probs describe)
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

    def check_neutral(self) -> None:
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                raise HTTPError(400, f"sampling_params.{name}={value} is not supported (only {neutral}): "
                                     "it would change the sampled distribution", f"sampling_params.{name}")


NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_ids: list[int] | list[list[int]]
    sampling_params: EngineSampling | list[EngineSampling] | None = None  # one for all prompts, or one per prompt
    return_logprob: bool = False
    logprob_start_len: int | None = None  # accepted; log-probs always cover the output tokens only
    rid: str | list[str] | None = None
    stream: bool = False


ScoreTemperature = Annotated[float, Field(gt=0.0, le=100.0)]


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_ids: list[int] | list[list[int]]
    start: int | list[int] = 1  # the first position scored, for all sequences or one per sequence (>= 1)
    temperature: ScoreTemperature | list[ScoreTemperature] = 1.0  # for all sequences or one per sequence


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model_path: str = Field(min_length=1)
    weight_version: int | str | None = None
    load_format: str | None = None
    flush_cache: bool | None = None
    abort_all_requests: bool | None = None


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    mode: str = "abort"


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    rid: str | None = None
    abort_all: bool = False


def _error_response(err: HTTPError) -> JSONResponse:
    kind = {401: "authentication_error", 500: "server_error"}.get(err.status, "invalid_request_error")
    body = {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.status}, "detail": err.message}
    return json_error(err, body)


def weight_spans(c: Completion) -> list[dict]:
    """Runs of equal versions over the output tokens: `[{"version", "start", "end"}]`, end exclusive."""
    vers = c.token_versions()
    spans: list[dict] = []
    for i, v in enumerate(vers):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def _finish_reason(c: Completion, params: SamplingParams, decode) -> dict:
    if c.finish_reason == "length":
        return {"type": "length", "length": len(c.token_ids)}
    if c.finish_reason == "abort":
        return {"type": "abort", "message": "the request was aborted"}
    tail = decode(c.token_ids[-16:]) if c.token_ids else ""
    matched = next((s for s in params.stop if s in tail), None)
    return {"type": "stop", "matched": matched if matched is not None else (c.token_ids[-1] if c.token_ids else None)}


def completion_body(c: Completion, rid: str, prompt_len: int, params: SamplingParams, text: str, decode,
                    return_logprob: bool) -> dict:
    """One prompt's answer in SGLang's shape."""
    meta = {
        "id": rid,
        "finish_reason": _finish_reason(c, params, decode),
        "weight_version": c.token_versions()[-1] if c.token_ids else c.version,
        "prompt_tokens": prompt_len,
        "completion_tokens": len(c.token_ids),
    }
    if c.versions is not None:
        meta["weight_versions"] = weight_spans(c)
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(c.logprobs, c.token_ids)]
    return {"output_ids": list(c.token_ids), "text": text, "meta_info": meta}


def make_app(
    engine,
    tokenizer,
    *,
    model_path: str = "",
    token: str | None = None,
    max_body_bytes: int = 16_000_000,
    max_prompts_per_request: int = 256,
    default_max_new_tokens: int = 128,
) -> FastAPI:
    """A FastAPI app serving `engine` (a LocalEngine: it needs `abort`, `pause(mode)` and a model)."""
    config = engine.model.config
    context = int(getattr(config, "max_position_embeddings", 0) or 0) or None
    vocab = int(getattr(config, "vocab_size", 0) or len(tokenizer))
    guard = Guard(token=token, max_body_bytes=max_body_bytes)
    guard.stats.update({"prompts": 0, "tokens": 0, "weight_updates": 0, "scored_tokens": 0})
    digest = vocab_digest(tokenizer)
    counter = iter(range(1, 2**62))

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()  # a batch parked in place must not hold the process open

    app = FastAPI(title="seekrl engine", summary="SGLang's native RL API over a seekrl LocalEngine", lifespan=lifespan)
    app.state.engine, app.state.guard = engine, guard

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def info() -> dict:
        return {
            "model_path": model_path, "weight_version": engine.version, "max_context": context, "vocab_size": vocab,
            "vocab_digest": digest, "is_generation": True, "paused": engine.paused,
            "limits": {"max_prompts_per_request": max_prompts_per_request, "max_batch_size": engine.max_batch_size},
            "engine": dict(engine.stats),
        }

    def sampling(sp: EngineSampling | None, longest_prompt: int) -> SamplingParams:
        sp = sp or EngineSampling()
        sp.check_neutral()
        check_temperature(sp.temperature, "sampling_params.temperature")
        max_new = default_max_new_tokens if sp.max_new_tokens is None else sp.max_new_tokens
        if context is not None and longest_prompt + max_new > context:
            raise HTTPError(400, f"prompt ({longest_prompt} tokens) + max_new_tokens ({max_new}) is over the model's "
                                 f"context of {context} tokens; lower max_new_tokens", "sampling_params.max_new_tokens")
        stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
        if len(stops) > MAX_STOPS:
            raise HTTPError(400, f"{len(stops)} stop strings; at most {MAX_STOPS}", "sampling_params.stop")
        stop_ids = list(sp.stop_token_ids or [])
        if any(not 0 <= t < vocab for t in stop_ids):
            raise HTTPError(400, f"stop_token_ids must be in 0..{vocab - 1}", "sampling_params.stop_token_ids")
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=1.0 if sp.temperature is None else sp.temperature,
            top_p=1.0 if sp.top_p is None else sp.top_p,
            top_k=sp.top_k if sp.top_k is not None and sp.top_k > 0 else 0,
            stop=tuple(s for s in stops if s),
            seed=sp.sampling_seed,
            stop_token_ids=tuple(stop_ids),
            ignore_eos=bool(sp.ignore_eos),
        )

    def prompts_of(req: GenerateRequest) -> tuple[list[list[int]], bool]:
        ids = req.input_ids
        single = not ids or isinstance(ids[0], int)
        prompts = [ids] if single else ids
        if not prompts or any(not p for p in prompts):
            raise HTTPError(400, "input_ids holds an empty prompt", "input_ids")
        if len(prompts) > max_prompts_per_request:
            raise HTTPError(413, f"{len(prompts)} prompts in one request; this server takes at most "
                                 f"{max_prompts_per_request} (--max-prompts-per-request)", "input_ids")
        for p in prompts:
            bad = next((t for t in p if not 0 <= t < vocab), None)
            if bad is not None:
                raise HTTPError(400, f"token id {bad} is outside the vocabulary 0..{vocab - 1}", "input_ids")
        return prompts, single

    def rids_of(req: GenerateRequest, n: int) -> list[str]:
        if req.rid is None:
            return [f"seekrl-{os.getpid()}-{next(counter)}" for _ in range(n)]
        rids = [req.rid] if isinstance(req.rid, str) else list(req.rid)
        if len(rids) != n:
            raise HTTPError(400, f"rid has {len(rids)} entries for {n} prompts; give one per prompt", "rid")
        return rids

    async def body(request: Request, schema: type[BaseModel]):
        return await guard.validated_body(request, schema)

    @app.post("/generate", openapi_extra=openapi_body(GenerateRequest))
    async def generate(request: Request):
        async def handler(request):
            req = await body(request, GenerateRequest)
            if req.stream:
                raise HTTPError(400, "streaming is not supported by this server: send stream=false", "stream")
            prompts, single = prompts_of(req)
            sps = req.sampling_params
            if isinstance(sps, list):
                if len(sps) != len(prompts):
                    raise HTTPError(400, f"sampling_params has {len(sps)} entries for {len(prompts)} prompts; give one, "
                                         "or one per prompt", "sampling_params")
                params = [sampling(sp, len(p)) for sp, p in zip(sps, prompts)]
            else:
                params = [sampling(sps, max(len(p) for p in prompts))] * len(prompts)
            rids = rids_of(req, len(prompts))
            calls = asyncio.gather(*(engine.generate(p, sp, rid=r) for p, sp, r in zip(prompts, params, rids)))
            try:
                outs = await cancel_on_disconnect(request, calls)
            except ValueError as e:
                raise HTTPError(400, f"invalid request: {e}") from None
            guard.stats["prompts"] += len(prompts)
            guard.stats["tokens"] += sum(len(c.token_ids) for c in outs)
            answers = [
                completion_body(c, r, len(p), sp, tokenizer.decode(c.token_ids, skip_special_tokens=True), decode,
                                req.return_logprob)
                for c, r, p, sp in zip(outs, rids, prompts, params)
            ]
            return JSONResponse(answers[0] if single else answers)

        return await guard.answer(request, handler, _error_response)

    @app.post("/update_weights_from_disk", openapi_extra=openapi_body(UpdateWeightsRequest))
    async def update_weights_from_disk(request: Request):
        async def handler(request):
            req = await body(request, UpdateWeightsRequest)
            version = engine.version + 1 if req.weight_version is None else req.weight_version
            try:
                version = int(version)
            except ValueError:
                raise HTTPError(400, f"weight_version must be an integer, got {req.weight_version!r}", "weight_version") from None
            folder = Path(req.model_path)
            try:
                usable = folder.is_dir() and any(folder.glob("*.safetensors"))
            except (OSError, ValueError) as e:  # a name too long, a NUL byte, a folder it may not read
                raise HTTPError(400, f"model_path '{str(folder)[:200]}' cannot be read: {type(e).__name__}: "
                                     f"{getattr(e, 'strerror', None) or e}", "model_path") from None
            if not usable:
                raise HTTPError(400, f"model_path '{str(folder)[:200]}' is not a folder with *.safetensors files", "model_path")
            t0 = time.perf_counter()
            try:
                await engine.update_weights(folder, version)
            except Exception as e:  # a bad or foreign folder: the old weights keep serving
                raise HTTPError(400, f"cannot load the weights of '{folder}': {type(e).__name__}: {e}", "model_path") from None
            guard.stats["weight_updates"] += 1
            seconds = time.perf_counter() - t0
            return JSONResponse({"success": True, "message": f"loaded {folder} as version {version} in {seconds:.3f} s",
                                 "weight_version": version, "seconds": seconds})

        def failed(err: HTTPError) -> JSONResponse:
            body = {"success": False, "message": err.message, "error": {"message": err.message, "code": err.status},
                    "detail": err.message}
            return json_error(err, body)

        return await guard.answer(request, handler, failed)

    @app.post("/pause_generation", openapi_extra=openapi_body(PauseRequest))
    async def pause_generation(request: Request):
        async def handler(request):
            guard.check_auth(request)
            raw = await guard.read_body(request)  # SGLang clients may send no body at all
            payload = parse_json(raw, guard.max_depth) if raw.strip() else {}
            if not isinstance(payload, dict):
                raise HTTPError(400, 'invalid request: body must be a JSON object {"mode": "abort" | "in_place"}')
            try:
                mode = PauseRequest.model_validate(payload).mode
            except ValidationError as e:
                raise HTTPError(400, validation_message(e)) from None
            if mode not in ("abort", "in_place", "retract"):
                raise HTTPError(400, f"mode '{mode}' is not supported; use abort, retract or in_place", "mode")
            engine.pause(mode)
            return JSONResponse({"success": True, "message": f"paused ({mode})"})

        return await guard.answer(request, handler, _error_response)

    @app.post("/continue_generation")
    async def continue_generation(request: Request):
        async def handler(request):
            guard.check_auth(request)
            engine.resume()
            return JSONResponse({"success": True, "message": "continued"})

        return await guard.answer(request, handler, _error_response)

    @app.post("/abort_request", openapi_extra=openapi_body(AbortRequest))
    async def abort_request(request: Request):
        async def handler(request):
            req = await body(request, AbortRequest)
            if not req.abort_all and not req.rid:
                raise HTTPError(400, "give a rid to abort, or abort_all: true", "rid")
            n = engine.abort(None if req.abort_all else req.rid)
            return JSONResponse({"success": True, "aborted": n})

        return await guard.answer(request, handler, _error_response)

    @app.post("/flush_cache")
    async def flush_cache(request: Request):
        async def handler(request):
            guard.check_auth(request)
            return JSONResponse({"success": True, "message": "no prefix cache is kept between batches"})

        return await guard.answer(request, handler, _error_response)

    @app.post("/score", openapi_extra=openapi_body(ScoreRequest))
    async def score(request: Request):
        async def handler(request):
            req = await body(request, ScoreRequest)
            seqs, single = prompts_of(req)
            starts = [req.start] * len(seqs) if isinstance(req.start, int) else list(req.start)
            if len(starts) != len(seqs):
                raise HTTPError(400, f"start has {len(starts)} entries for {len(seqs)} sequences; give one, or one per sequence", "start")
            for s, st in zip(seqs, starts):
                if not 1 <= st <= len(s):
                    raise HTTPError(400, f"start={st} is outside 1..{len(s)} for a sequence of {len(s)} tokens (position 0 "
                                         "has nothing before it to be predicted from)", "start")
                if context is not None and len(s) > context:
                    raise HTTPError(400, f"a sequence of {len(s)} tokens is over the model's context of {context} tokens", "input_ids")
            temps = [req.temperature] * len(seqs) if isinstance(req.temperature, float) else list(req.temperature)
            if len(temps) != len(seqs):
                raise HTTPError(400, f"temperature has {len(temps)} entries for {len(seqs)} sequences; give one, or one per sequence",
                                "temperature")
            for t in temps:
                check_temperature(t, "temperature")
            rows = await cancel_on_disconnect(request, asyncio.to_thread(score_rows, seqs, starts, temps))
            for row, t in zip(rows, temps):
                if not all(math.isfinite(v) for v in row):
                    raise HTTPError(400, f"the log-probs are not finite at temperature {t}; raise it", "temperature")
            guard.stats["scored_tokens"] += sum(len(r) for r in rows)
            return JSONResponse({"logprobs": rows[0] if single else rows, "weight_version": engine.version})

        return await guard.answer(request, handler, _error_response)

    def score_rows(seqs: list[list[int]], starts: list[int], temps: list[float]) -> list[list[float]]:
        from seekrl.train.batching import can_share_prefix
        from seekrl.train.plan import MicroBatchPlan
        from seekrl.train.teacher import score_completions, scoring_batch

        todo = [i for i, (s, st) in enumerate(zip(seqs, starts)) if st < len(s)]  # start == len: nothing to score
        rows: list[list[float]] = [[] for _ in seqs]
        if todo:
            model = engine.model
            plan = MicroBatchPlan(SCORE_TOKEN_BUDGET, tokenizer.pad_token_id or 0, next(model.parameters()).device,
                                  share_prefix=can_share_prefix(model))
            batch = scoring_batch([seqs[i] for i in todo], [starts[i] for i in todo], [temps[i] for i in todo])
            logp_BC = score_completions(model, plan, batch, temps[todo[0]])  # mixed temperatures ride on the batch's rows
            for k, i in enumerate(todo):
                rows[i] = logp_BC[k, : len(seqs[i]) - starts[i]].tolist()
        return rows

    async def model_info(request: Request):
        async def handler(request):
            guard.check_auth(request)
            keys = ("model_path", "weight_version", "max_context", "vocab_size", "vocab_digest", "is_generation")
            return JSONResponse({k: v for k, v in info().items() if k in keys})

        return await guard.answer(request, handler, _error_response)

    app.add_api_route("/model_info", model_info, methods=["GET"])
    app.add_api_route("/get_model_info", model_info, methods=["GET"])
    add_status_routes(app, guard, _error_response, info)
    return app


def serve_engine(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    token_env: str = TOKEN_ENV,
    max_batch_size: int = 64,
    seed: int = 0,
    max_body_mb: float = 16.0,
    max_prompts_per_request: int = 256,
    dtype: str = "float32",
    device: str = "auto",
    compile: str = "false",
) -> None:
    """Load `model_path`, wrap it in a LocalEngine and serve it with uvicorn until SIGINT / SIGTERM.
    `compile`: LocalEngine's decode (false | true | auto, as rollout.compile)."""
    check_port(port)
    if max_body_mb <= 0 or max_batch_size < 1 or max_prompts_per_request < 1:
        raise ValueError("--max-body-mb must be > 0, --max-batch-size and --max-prompts-per-request >= 1")
    token = resolve_token(token, token_env, host, "the engine")
    import uvicorn

    from seekrl.build import local_engine

    engine, tokenizer = local_engine(model_path, dtype=dtype, device=device, seed=seed, max_batch_size=max_batch_size,
                                     compile=compile)
    app = make_app(engine, tokenizer, model_path=str(model_path), token=token, max_body_bytes=int(max_body_mb * 1e6),
                   max_prompts_per_request=max_prompts_per_request)
    import sys

    print(f"seekrl serve engine: {model_path} on http://{host}:{port} (SGLang's native API; "
          f"{'bearer token required' if token else 'no token'})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)


def run_from_args(args: argparse.Namespace) -> None:
    serve_engine(
        args.model, host=args.host, port=args.port, token=args.token, token_env=args.token_env,
        max_batch_size=args.max_batch_size, seed=args.seed, max_body_mb=args.max_body_mb,
        max_prompts_per_request=args.max_prompts_per_request, dtype=args.dtype, device=args.device,
        compile=args.compile,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m seekrl.servers.engine", description="Serve a model on SGLang's native RL API.")
    engine_flags(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        run_from_args(args)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")


if __name__ == "__main__":
    main()
