"""The OpenAI-compatible endpoint an agent's episode talks to during rollout (workflows/agent.py).

One HTTP server per workflow, on 127.0.0.1 and a free port, in its own thread; each episode gets
its own base URL and key, so concurrent episodes never mix:

    endpoint = AgentEndpoint(tokenizer, context=2048)
    session = endpoint.open(engine, loop, params, max_calls=8, max_tokens=1024)
    # the agent: OpenAI(base_url=session.base_url, api_key=session.key)
    #   POST {base_url}/chat/completions   messages (+ tools) -> seekrl's chat template -> engine
    #   POST {base_url}/completions        prompt (text or token ids) -> engine
    #   GET  {base_url}/models
    endpoint.release(session)              # later calls answer 400 "this episode is over"
    endpoint.close()

What each call samples. The prompt ids come from the episode's `EpisodeRecord` (agent_record.py:
a prompt that extends an earlier call continues from the tokens that call sampled). The engine is
the rollout's (`engine.generate` on the rollout's event loop, whatever engine that is: local,
interruptible in async mode, remote), sampling with the rollout's temperature, top-p and top-k
and the episode's seed + call index, whatever the request asks: the trainer recomputes log-probs
at those, and a request's own temperature would make the recorded log-probs another policy's.
The request's `max_tokens` (capped by rollout.max_new_tokens), `stop` and `tools` are honoured.

Chat requests: the messages are rendered with the tokenizer's chat template (with `tools=` when
the request has tools), plus vLLM's extensions `add_generation_prompt` (default true),
`continue_final_message` (continue the last assistant message instead of starting a new one)
and `include_stop_str_in_output`. `stream: true` gets the finished answer as server-sent events
(one content chunk, then the finish reason; usage with `stream_options.include_usage`), so
clients and frameworks that always stream work unchanged. With tools, a reply holding `<tool_call>{"name", "arguments"}</tool_call>`
blocks (the Hermes format most chat templates use) comes back as OpenAI `tool_calls` with
finish_reason "tool_calls"; its other text is the content. `n` must be 1.

Bounded work per episode: at most `max_calls` calls and `max_tokens` sampled tokens (a call's
`max_tokens` is cut to what is left; calls in flight reserve theirs), a prompt and its tokens
within the model's `context`; past a bound the call answers 400 with the reason, and the episode
records which bound it hit (`Session.budget_hit`: max_calls | length). A failed engine request
answers 500 and marks the episode `engine_error` (an infrastructure failure, not learned from;
its later calls answer 400, which the stock client does not retry); a dead engine
(EngineUnavailable) is kept in `Session.fatal` for the workflow to raise: the run stops.
Bodies are bounded (`max_body_bytes`, JSON depth) by the shared Guard (api/guards.py); a wrong
key is a 401, an unknown episode a 404.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import socket
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from seekrl.api.guards import ClientGone, Guard, HTTPError, cancel_on_disconnect, check_token, openapi_body
from seekrl.api.openai_wire import (
    ChatRequest,
    CompletionRequest,
    chat_logprobs,
    chat_messages,
    chat_response,
    completion_logprobs,
    completion_response,
    cut_at_stop,
    openai_error,
    sse_chunks,
    stop_list,
    usage,
)
from seekrl.errors import EngineRequestError, EngineUnavailable
from seekrl.rollout import turn_seed
from seekrl.tools.parsers import HermesFormat
from seekrl.types import Completion, SamplingParams
from seekrl.workflows.agent_record import EpisodeRecord

__all__ = ["AgentEndpoint", "Session", "AgentChatRequest", "START_TIMEOUT_S"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0


class AgentChatRequest(ChatRequest):
    """A chat request as agents send it: OpenAI's fields and vLLM's template extensions."""

    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    include_stop_str_in_output: bool = False
    chat_template_kwargs: dict | None = None
    stream_options: dict | None = None


class AgentCompletionRequest(CompletionRequest):
    include_stop_str_in_output: bool = False
    stream_options: dict | None = None


@dataclasses.dataclass
class Session:
    """One episode's endpoint: where the agent calls, and what its calls sampled."""

    id: str
    key: str
    base_url: str
    engine: object  # the rollout's InferenceEngine
    loop: asyncio.AbstractEventLoop  # the rollout's event loop, where the engine's calls run
    params: SamplingParams  # the episode's sampling (rollout temperature, seed)
    record: EpisodeRecord
    max_calls: int
    max_tokens: int
    calls: int = 0  # started
    sampled: int = 0  # tokens sampled by finished calls
    reserved: int = 0  # tokens reserved by calls in flight
    budget_hit: str | None = None  # max_calls | length: the policy used up the episode's budget
    failure: str | None = None  # engine_error: an infrastructure failure
    fatal: BaseException | None = None  # the engine is gone (EngineUnavailable): the workflow raises it, the run stops
    closed: bool = False


class AgentEndpoint:
    def __init__(self, tokenizer, *, host: str = "127.0.0.1", context: int | None = None, max_body_bytes: int = 8_000_000,
                 model_name: str = "seekrl-policy"):
        self.tokenizer = tokenizer
        self.host = host
        self.context = context
        self.model_name = model_name
        self.guard = Guard(token=None, max_body_bytes=max_body_bytes)  # auth is per episode (Session.key)
        self.sessions: dict[str, Session] = {}
        self._server = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.port: int | None = None
        self._hermes = HermesFormat()
        self._start_lock = threading.Lock()

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Serve on a free loopback port in a daemon thread (idempotent); waits until it answers."""
        with self._start_lock:
            if self._thread is not None:
                return
            import uvicorn

            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            self._sock, self.port = sock, sock.getsockname()[1]
            config = uvicorn.Config(self._app(), log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="seekrl-agent-endpoint", daemon=True)
            self._thread.start()
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self._server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"the agent endpoint did not start on {self.host} within {START_TIMEOUT_S:g} s")
                time.sleep(0.01)

    def close(self) -> None:
        """Stop the server (waits up to 10 s) and end every open episode."""
        for s in list(self.sessions.values()):
            s.closed = True
        self.sessions.clear()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def open(self, engine, loop: asyncio.AbstractEventLoop, params: SamplingParams, *, max_calls: int, max_tokens: int) -> Session:
        """A new episode's base URL and key (the server starts on the first episode)."""
        self.start()
        sid = uuid.uuid4().hex
        s = Session(id=sid, key=secrets.token_urlsafe(24), base_url=f"http://{self.host}:{self.port}/episodes/{sid}/v1", engine=engine,
                    loop=loop, params=params, record=EpisodeRecord(self.tokenizer), max_calls=max_calls, max_tokens=max_tokens)
        self.sessions[sid] = s
        return s

    def release(self, session: Session) -> None:
        """End an episode: its later calls are refused, calls in flight are not recorded."""
        session.closed = True
        self.sessions.pop(session.id, None)

    # ---------------------------------------------------------------------------------- one call

    def _session(self, request, episode: str) -> Session:
        s = self.sessions.get(episode)
        if s is None:
            raise HTTPError(404, f"no episode {episode[:40]!r} is running here: each episode has its own base URL")
        check_token(request.headers, s.key)
        if s.closed:
            raise HTTPError(400, "this episode is over: its endpoint takes no more calls")
        if s.failure:  # not 5xx: the stock client would retry it
            raise HTTPError(400, f"this episode failed ({s.failure}): its endpoint takes no more calls")
        return s

    def _budget(self, s: Session, prompt_len: int, asked: int | None) -> SamplingParams:
        """The call's sampling: the episode's params, its seed + call index, max_new_tokens cut to the budgets."""
        if s.calls >= s.max_calls:
            s.budget_hit = s.budget_hit or "max_calls"
            raise HTTPError(400, f"this episode's budget of {s.max_calls} model calls is spent (rollout.agent_max_calls)", "messages")
        left = s.max_tokens - s.sampled - s.reserved
        room = None if self.context is None else self.context - prompt_len
        if left < 1 or (room is not None and room < 1):
            s.budget_hit = s.budget_hit or "length"
            why = (f"this episode's budget of {s.max_tokens} sampled tokens is spent (rollout.agent_max_tokens)" if left < 1 else
                   f"the prompt has {prompt_len} tokens; the model's context is {self.context} tokens")
            raise HTTPError(400, why, "max_tokens")
        n = min(s.params.max_new_tokens, left, *(x for x in (asked, room) if x is not None))
        p = dataclasses.replace(s.params, max_new_tokens=n, seed=turn_seed(s.params.seed, s.calls))
        s.calls += 1
        s.reserved += n
        return p

    async def _generate(self, request, s: Session, prompt_ids: list[int], p: SamplingParams) -> Completion:
        """The engine's answer for one call, on the rollout's loop; 500 (and an engine_error episode) if it fails."""
        try:
            future = asyncio.run_coroutine_threadsafe(s.engine.generate(prompt_ids, p), s.loop)
            c = await cancel_on_disconnect(request, asyncio.wrap_future(future))
        except ClientGone:
            raise
        except EngineUnavailable as e:
            s.failure, s.fatal = s.failure or "engine_error", e
            raise HTTPError(500, f"generation failed: {type(e).__name__}: {e}") from None
        except (EngineRequestError, RuntimeError) as e:  # RuntimeError: the rollout's loop is gone
            s.failure = s.failure or "engine_error"
            raise HTTPError(500, f"generation failed: {type(e).__name__}: {e}") from None
        finally:
            s.reserved -= p.max_new_tokens
        if c.finish_reason == "abort":
            s.failure = s.failure or "engine_error"
            raise HTTPError(500, "generation failed: the engine aborted the request")
        s.sampled += len(c.token_ids)
        return c

    async def _sample(self, request, s: Session, text: str | None, prompted: tuple, asked: int | None,
                      stops: list[str]) -> tuple[list[int], Completion, SamplingParams]:
        """One call: the budgets, the engine, the record. `prompted`: (ids, base, inserted) from the record."""
        ids, base, inserted = prompted
        p = dataclasses.replace(self._budget(s, len(ids), asked), stop=tuple(stops))
        c = await self._generate(request, s, ids, p)
        if s.closed:
            raise HTTPError(400, "this episode is over: its endpoint takes no more calls")
        s.record.add(text, ids, base, inserted, c)
        return ids, c, p

    def _chat_prompt(self, req: AgentChatRequest) -> str:
        messages = chat_messages(req.messages)
        kwargs = dict(req.chat_template_kwargs or {})
        if req.tools:
            kwargs["tools"] = req.tools
        if req.continue_final_message:
            if messages[-1]["role"] != "assistant":
                raise HTTPError(400, "continue_final_message needs the last message to be an assistant message", "messages")
            kwargs["continue_final_message"] = True
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                                                      **kwargs)
        except Exception as e:  # a role the template rejects, a bad tool schema, ...
            raise HTTPError(400, f"cannot apply the chat template: {type(e).__name__}: {e}", "messages") from None

    def _tool_message(self, text: str) -> tuple[dict, bool]:
        """The assistant message of a reply to a request with tools: Hermes `<tool_call>` blocks as tool_calls."""
        parsed = self._hermes.parse(text)
        if not parsed.calls:
            return {"role": "assistant", "content": text}, False
        first = text.find("<tool_call>")
        content = text[:first].strip() or None
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.args, ensure_ascii=False)}} for c in parsed.calls]
        return {"role": "assistant", "content": content, "tool_calls": calls}, True

    def _text(self, c: Completion, p: SamplingParams, include_stop: bool) -> str:
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        return text if include_stop else cut_at_stop(text, p.stop)

    def _check_sampling(self, req) -> list[str]:
        if (req.n or 1) != 1:
            raise HTTPError(400, "n must be 1 during training: each call is one sample of the episode", "n")
        return stop_list(req.stop)

    def _reply(self, req, body: dict):
        """The response: JSON, or with `stream: true` the same answer as server-sent events (one chunk)."""
        if not req.stream:
            return JSONResponse(body)
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        return StreamingResponse(sse_chunks(body, include_usage), media_type="text/event-stream")

    def _app(self):
        app = FastAPI(title="seekrl agent endpoint", summary="Per-episode OpenAI-compatible endpoint of a rollout")
        guard = self.guard

        async def answer(request, episode: str, handler):
            return await guard.answer(request, lambda request: handler(request, self._session(request, episode)), openai_error)

        @app.get("/health")
        async def health():
            return JSONResponse({"status": "ok"})

        @app.get("/episodes/{episode}/v1/models")
        async def models(request: Request, episode: str):
            async def handler(request, s):
                card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "seekrl"}
                return JSONResponse({"object": "list", "data": [card]})

            return await answer(request, episode, handler)

        @app.post("/episodes/{episode}/v1/chat/completions", openapi_extra=openapi_body(AgentChatRequest))
        async def chat(request: Request, episode: str):
            async def handler(request, s: Session):
                req = await guard.validated_body(request, AgentChatRequest)
                stops = self._check_sampling(req)
                if req.top_logprobs:
                    raise HTTPError(400, "top_logprobs > 0 is not supported: only the sampled tokens' log-probs are recorded", "top_logprobs")
                text = self._chat_prompt(req)
                asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
                ids, c, p = await self._sample(request, s, text, s.record.prompt_from_text(text), asked, stops)
                content = self._text(c, p, req.include_stop_str_in_output)
                message, called = self._tool_message(content) if req.tools and req.tool_choice != "none" else ({"role": "assistant", "content": content}, False)
                choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if called else c.finish_reason,
                          "logprobs": chat_logprobs(self.tokenizer, c.token_ids, c.logprobs) if req.logprobs else None}
                return self._reply(req, chat_response(self.model_name, [choice], usage(len(ids), len(c.token_ids))))

            return await answer(request, episode, handler)

        @app.post("/episodes/{episode}/v1/completions", openapi_extra=openapi_body(AgentCompletionRequest))
        async def completions(request: Request, episode: str):
            async def handler(request, s: Session):
                req = await guard.validated_body(request, AgentCompletionRequest)
                stops = self._check_sampling(req)
                if req.echo:
                    raise HTTPError(400, "echo is not supported", "echo")
                prompt = req.prompt
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                    prompt = prompt[0]
                if isinstance(prompt, str):
                    if not prompt:
                        raise HTTPError(400, "prompt is empty", "prompt")
                    text: str | None = prompt
                    prompted = s.record.prompt_from_text(prompt, special_tokens=True)
                elif prompt and all(isinstance(x, int) for x in prompt):
                    vocab = len(self.tokenizer)
                    if any(not 0 <= t < vocab for t in prompt):
                        raise HTTPError(400, f"prompt token ids must be in 0..{vocab - 1}", "prompt")
                    text = None
                    prompted = s.record.prompt_from_ids(prompt)
                else:
                    raise HTTPError(400, "one prompt per call during training (a string or a list of token ids)", "prompt")
                ids, c, p = await self._sample(request, s, text, prompted, req.max_tokens, stops)
                logprobs = completion_logprobs(self.tokenizer, c.token_ids, c.logprobs) if req.logprobs is not None else None
                choice = {"index": 0, "text": self._text(c, p, req.include_stop_str_in_output), "finish_reason": c.finish_reason,
                          "logprobs": logprobs}
                return self._reply(req, completion_response(self.model_name, [choice], usage(len(ids), len(c.token_ids))))

            return await answer(request, episode, handler)

        return app
