"""An OpenAI-compatible HTTP server over a seekrl policy (any InferenceEngine, LocalEngine by default).

    POST /v1/chat/completions   messages -> chat template (generation prompt) -> engine -> choices
    POST /v1/completions        prompt (str, list of str, token ids) -> engine -> choices
    GET  /v1/models             the one model
    GET  /health                {"status": "ok"} (no token)
    GET  /server_info           model, weights version, limits, counters (token): requests, rejected (4xx),
                                errors (5xx), cancelled (client gone), completions, tokens, generations

The official `openai` client works against it (`OpenAI(base_url="http://127.0.0.1:8002/v1",
api_key=TOKEN)`). Request fields: max_tokens / max_completion_tokens, temperature (default 1.0),
top_p, top_k (an extension, as in vLLM; -1 or 0 = off), stop (str or list), n, seed, logprobs;
unknown fields (tools, user, ...) and `model` are ignored. The `n` choices of a request are
`n` concurrent `engine.generate` calls, which LocalEngine batches (and prefills once).

Departures from OpenAI's API:
- No streaming (`stream: true` is a 400), no tool calling, no `echo`, no top alternatives:
  `top_logprobs` > 0 is a 400; chat `logprobs` gives only the sampled tokens
  (`{"token", "logprob", "bytes": null, "top_logprobs": []}`); legacy `logprobs: k` gives
  `tokens`, `token_logprobs`, `text_offset` and `top_logprobs: null`.
- Logprob entries, `usage.completion_tokens` and the token count cover every sampled token,
  the eos and the stop string's tokens included (the engine keeps the stop string, so the
  trainer sees exactly what was sampled); the text is decoded with skip_special_tokens=True
  and cut before the first stop string, as OpenAI does.
- With `seed` and n > 1, choice i is drawn with seed + i (so the choices differ and the whole
  request is reproducible).
- /v1/completions encodes a text prompt with the tokenizer's default special tokens (a BOS
  where the model has one, as vLLM does); a list of ints is taken as token ids, as they are.
- Without `max_tokens`, `default_max_tokens` (256) or what is left of the context; a
  `max_tokens` over `max_tokens_cap` or past the model's context is a 400 (never clamped).
- Errors are OpenAI's shape `{"error": {"message", "type", "param", "code"}}` plus this repo's
  `"detail"` (the same one-line message): 400 bad payload (not JSON / UTF-8, nested deeper than
  `max_depth`, a lone surrogate in a string, wrong types, more than `max_completions_per_request`
  prompts x n), 401 missing / wrong bearer token, 413 body over `max_body_bytes` or more than
  `max_prompts_per_request` prompts, 500 engine failure. The checks are api/guards.py's `Guard`.
- A client that disconnects before its answer has its generation cancelled (LocalEngine drops
  the rows), counted in /server_info's "cancelled".

    python -m seekrl.servers.policy --model PATH [--host 127.0.0.1] [--port 8002] [--token T]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from seekrl.api.guards import (
    ClientGone,
    Guard,
    HTTPError,
    add_status_routes,
    cancel_on_disconnect,
    check_port,
    check_temperature,
    openapi_body,
    resolve_token,
)
from seekrl.api.openai_wire import (
    MAX_N,
    ChatRequest,
    CompletionRequest,
    Sampling,
    chat_logprobs,
    chat_messages,
    chat_response,
    completion_logprobs,
    completion_response,
    cut_at_stop,
    openai_error,
    stop_list,
    usage,
)
from seekrl.models import encode_chat
from seekrl.servers.flags import policy_flags
from seekrl.types import SamplingParams

__all__ = ["make_app", "serve_policy", "main", "TOKEN_ENV", "ChatRequest", "CompletionRequest"]

log = logging.getLogger(__name__)

TOKEN_ENV = "SEEKRL_POLICY_TOKEN"


def _context_length(engine) -> int | None:
    config = getattr(getattr(engine, "model", None), "config", None)
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def make_app(
    engine,
    tokenizer,
    *,
    model_name: str = "seekrl",
    token: str | None = None,
    max_body_bytes: int = 1_000_000,
    max_tokens_cap: int = 4096,
    default_max_tokens: int = 256,
    max_prompts_per_request: int = 64,
    max_completions_per_request: int = 256,
    max_depth: int = 32,
) -> FastAPI:
    """A FastAPI app serving `engine` (an InferenceEngine) on OpenAI's chat / completions API."""
    if not callable(getattr(engine, "generate", None)):
        raise TypeError(f"make_app needs an InferenceEngine with async generate, got {type(engine).__name__}")
    if max_prompts_per_request < 1 or max_completions_per_request < 1:
        raise ValueError("max_prompts_per_request and max_completions_per_request must be >= 1")
    guard = Guard(token=token, max_body_bytes=max_body_bytes, max_depth=max_depth)
    guard.stats.update(generations=0, completions=0, tokens=0)
    context = _context_length(engine)
    created = int(time.time())

    app = FastAPI(title="seekrl policy", summary="OpenAI-compatible chat / completions API over a seekrl policy")
    app.state.engine = engine
    app.state.guard = guard
    app.state.stats = guard.stats

    async def read_payload(request: Request, schema: type[BaseModel]):
        """Auth, size, JSON, schema: the parsed request or a HTTPError."""
        req = await guard.validated_body(request, schema)
        if req.stream:
            raise HTTPError(400, "streaming is not supported by this server: send stream=false (or leave it out)", "stream")
        return req

    def sampling(req: Sampling, prompt_len: int, max_tokens: int | None) -> tuple[SamplingParams, int]:
        check_temperature(req.temperature)
        room = None if context is None else context - prompt_len
        if room is not None and room < 1:
            raise HTTPError(400, f"the prompt has {prompt_len} tokens; this model's context is {context} tokens", "messages")
        if max_tokens is None:
            max_tokens = min(default_max_tokens, max_tokens_cap, room or default_max_tokens)
        elif max_tokens > max_tokens_cap:
            raise HTTPError(400, f"max_tokens={max_tokens} is over this server's limit of {max_tokens_cap}", "max_tokens")
        elif room is not None and max_tokens > room:
            raise HTTPError(
                400, f"max_tokens={max_tokens} + the prompt's {prompt_len} tokens is over this model's context of {context} tokens", "max_tokens"
            )
        stops = stop_list(req.stop)
        top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=top_k,
            stop=tuple(stops),
            seed=req.seed,
        )
        return params, req.n or 1

    def check_counts(n_prompts: int, n: int) -> None:
        """413 past max_prompts_per_request prompts, 400 past max_completions_per_request prompts x n."""
        if n_prompts > max_prompts_per_request:
            raise HTTPError(413, f"{n_prompts} prompts in one request; this server's limit is {max_prompts_per_request}", "prompt")
        if n_prompts * n > max_completions_per_request:
            raise HTTPError(
                400, f"{n_prompts} prompts x n={n} is {n_prompts * n} completions; this server's limit is "
                f"{max_completions_per_request} per request", "n",
            )

    async def run(request: Request, prompts: list[list[int]], params: SamplingParams, n: int):
        """n completions per prompt, all concurrent (the engine batches them); in prompt-major
        order. Cancelled (ClientGone) if the client disconnects first."""
        check_counts(len(prompts), n)
        if any(not ids for ids in prompts):
            raise HTTPError(400, "invalid request: a prompt is empty", "prompt")
        calls = []
        for ids in prompts:
            for i in range(n):
                seed = None if params.seed is None else params.seed + i
                p = SamplingParams(params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.stop, seed)
                calls.append(engine.generate(ids, p))
        guard.stats["generations"] += 1
        try:
            outs = await cancel_on_disconnect(request, asyncio.gather(*calls))
        except ClientGone:
            raise
        except ValueError as e:  # a prompt the engine refuses
            raise HTTPError(400, f"invalid request: {e}") from None
        except Exception as e:  # a server stays up; the client gets the reason
            log.exception("generation failed for %d prompts x %d", len(prompts), n)
            raise HTTPError(500, f"generation failed: {type(e).__name__}: {e}") from None
        guard.stats["completions"] += len(outs)
        guard.stats["tokens"] += sum(len(c.token_ids) for c in outs)
        return outs

    def text_of(c, params: SamplingParams) -> str:
        return cut_at_stop(tokenizer.decode(c.token_ids, skip_special_tokens=True), params.stop)

    def counts(prompts: list[list[int]], outs) -> dict:
        return usage(sum(len(x) for x in prompts), sum(len(o.token_ids) for o in outs))

    async def guarded(request: Request, handler):
        return await guard.answer(request, handler, openai_error)

    def info() -> dict:
        limits = {
            "max_tokens_cap": max_tokens_cap, "default_max_tokens": default_max_tokens, "context": context, "max_n": MAX_N,
            "max_prompts_per_request": max_prompts_per_request, "max_completions_per_request": max_completions_per_request,
        }
        return {"model": model_name, "version": getattr(engine, "version", None), "limits": limits}

    add_status_routes(app, guard, openai_error, info)

    @app.get("/v1/models")
    async def models(request: Request):
        async def handler(request):
            guard.check_auth(request)
            card = {"id": model_name, "object": "model", "created": created, "owned_by": "seekrl"}
            return JSONResponse({"object": "list", "data": [card]})

        return await guarded(request, handler)

    @app.post("/v1/chat/completions", openapi_extra=openapi_body(ChatRequest))
    async def chat_completions(request: Request):
        async def handler(request):
            req = await read_payload(request, ChatRequest)
            if req.top_logprobs:
                raise HTTPError(400, "top_logprobs > 0 is not supported: only the sampled tokens' log-probs are available", "top_logprobs")
            messages = chat_messages(req.messages)
            try:
                prompt = encode_chat(tokenizer, messages)
            except Exception as e:  # no chat template, a role the template rejects, ...
                raise HTTPError(400, f"cannot apply the chat template: {type(e).__name__}: {e}", "messages") from None
            max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
            params, n = sampling(req, len(prompt), max_tokens)
            outs = await run(request, [prompt], params, n)
            choices = []
            for i, c in enumerate(outs):
                logprobs = None
                if req.logprobs:
                    logprobs = chat_logprobs(tokenizer, c.token_ids, c.logprobs)
                message = {"role": "assistant", "content": text_of(c, params)}
                choices.append({"index": i, "message": message, "finish_reason": c.finish_reason, "logprobs": logprobs})
            return JSONResponse(chat_response(model_name, choices, counts([prompt], outs)))

        return await guarded(request, handler)

    @app.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
    async def completions(request: Request):
        async def handler(request):
            req = await read_payload(request, CompletionRequest)
            if req.echo:
                raise HTTPError(400, "echo is not supported", "echo")
            p = req.prompt
            if isinstance(p, str):
                p = [p]
            elif p and all(isinstance(x, int) for x in p):
                p = [p]
            if not p:
                raise HTTPError(400, "prompt is empty", "prompt")
            check_counts(len(p), req.n or 1)  # before tokenizing them
            prompts = [tokenizer(x)["input_ids"] if isinstance(x, str) else list(x) for x in p]
            vocab = len(tokenizer)
            if any(not 0 <= t < vocab for ids in prompts for t in ids):
                raise HTTPError(400, f"prompt token ids must be in 0..{vocab - 1}", "prompt")
            params, n = sampling(req, max(len(x) for x in prompts), req.max_tokens)
            outs = await run(request, prompts, params, n)
            choices = []
            for i, c in enumerate(outs):
                logprobs = None
                if req.logprobs is not None:
                    logprobs = completion_logprobs(tokenizer, c.token_ids, c.logprobs)
                choices.append({"index": i, "text": text_of(c, params), "finish_reason": c.finish_reason, "logprobs": logprobs})
            return JSONResponse(completion_response(model_name, choices, counts(prompts, outs)))

        return await guarded(request, handler)

    return app


def serve_policy(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8002,
    token: str | None = None,
    dtype: str = "float32",
    device: str = "auto",
    max_batch_size: int = 64,
    model_name: str | None = None,
    **app_kwargs,
) -> None:
    """Load `model_path` (see seekrl.models.load_model), wrap it in a LocalEngine and serve it with
    uvicorn until interrupted. Without `token`, $SEEKRL_POLICY_TOKEN is used when set (keeps the
    secret out of argv). The served model name defaults to `model_path`, as vLLM's does."""
    check_port(port)
    token = resolve_token(token, TOKEN_ENV, host, "the policy")
    import uvicorn

    from seekrl.build import local_engine

    engine, tokenizer = local_engine(model_path, dtype=dtype, device=device, max_batch_size=max_batch_size)
    app = make_app(engine, tokenizer, model_name=model_name or str(model_path), token=token, **app_kwargs)
    log.info("serving %s on http://%s:%d/v1", model_path, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")


def run_from_args(args: argparse.Namespace) -> None:
    serve_policy(
        args.model, host=args.host, port=args.port, token=args.token, dtype=args.dtype, device=args.device,
        max_batch_size=args.max_batch_size, model_name=args.model_name, max_tokens_cap=args.max_tokens_cap,
        max_prompts_per_request=args.max_prompts_per_request, max_completions_per_request=args.max_completions_per_request,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m seekrl.servers.policy", description="Serve a policy on an OpenAI-compatible API.")
    policy_flags(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        run_from_args(args)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")


if __name__ == "__main__":
    main()
