"""A distillation teacher on a server: ask it for the log-probs of given token sequences.

    client = TeacherClient("http://host:30000", api="seekrl", token=None, timeout_s=300)
    client.check_tokenizer(tokenizer)               # ConfigError when the server's tokenizer differs
    rows = client.score([[5, 6, 7, 8]], [2], 1.0)   # log p(7 | 5 6), log p(8 | 5 6 7) at temperature 1
    client.close()

Two APIs, each a small class that builds the requests and reads the answers without I/O (as
engines/adapters.py does for sampling); `TeacherClient` sends them (synchronous httpx: the RL
step asks from its worker thread), `chunk` sequences per request.

seekrl (`seekrl serve engine`, servers/engine.py)
- POST /score {"input_ids": [[...], ...], "start": [s, ...], "temperature": T | [T, ...]} ->
  {"logprobs": [[...], ...], "weight_version"}: for each sequence, the log-probs of its tokens
  `start .. len-1`, each given the tokens before it, `log_softmax(logits / T)[token]` in the
  server's model (one T, or one a sequence: rows sampled at their own temperature), by the
  trainer's own scoring code (train/teacher.py `score_completions`).
- GET /model_info -> {"vocab_digest", "vocab_size", ...}: `vocab_digest` is `vocab_digest(tokenizer)`,
  compared with the student's before training starts.

vLLM (`vllm serve`; what the vLLM sources say, see below)
- POST /v1/completions {"prompt": [[ids], ...], "max_tokens": 1, "prompt_logprobs": 0,
  "temperature": 1.0, ...} -> choices (one per prompt, in order; `index` says which), each with
  `prompt_logprobs`: a list as long as the prompt, `null` first (the first token has nothing to
  be predicted from), then `{"<token id>": {"logprob", "rank", "decoded_token"}}` holding at
  least the prompt's own token at that position (vllm/logprobs.py `PromptLogprobs`;
  entrypoints/openai/completion/protocol.py `CompletionResponseChoice.prompt_logprobs`; -inf is
  floored at -9999.0). The one sampled token (max_tokens 1) is ignored.
- vLLM's prompt log-probs are taken from the logits before any temperature (its default
  logprobs mode, `raw_logprobs`), so the vllm API scores at temperature 1 only: a run sampling
  at another rollout.temperature or rollout.branch_temperature is refused before it starts
  (seekrl/build.py).
- POST /tokenize {"prompt": text, "add_special_tokens": false} -> {"tokens": [...], "count",
  "max_model_len"}: the probe text's ids are compared with the student tokenizer's (vLLM does
  not serve its vocabulary without --enable-tokenizer-info-endpoint).
The vLLM request / answer shapes were read from vLLM's sources and are tested against a recorded
shape on a local fake server (tests/integration/test_distill_run.py), not against a running vLLM.

Failures: a refused connection, a timeout or a 5xx is retried (`tries`, backoff 0.5 s, 1 s, ...),
then `EngineUnavailable` (one line naming the server; the run stops: every trajectory of the
step would lack its reward); a 4xx or an answer that cannot be read is `EngineRequestError`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from seekrl.engines.adapters import HTTPCall
from seekrl.engines.wire import AdapterError, int_list, is_int, logprob, one_line
from seekrl.errors import ConfigError, EngineRequestError, EngineUnavailable
from seekrl.httpclient import sync_client

__all__ = ["SCORING_APIS", "PROBE", "SeekrlScoring", "VLLMScoring", "TeacherClient", "vocab_digest"]

# Text whose tokenization tells two tokenizers apart: every printable ASCII character, words,
# digits, whitespace runs, a chat turn and non-ASCII text.
PROBE = ("".join(chr(c) for c in range(32, 127)) + "\n\t  The quick brown fox jumps over the lazy dog. 3 7 1 12 + 30 = 42\n"
         "<|im_start|>user\ncopy: 3 7 1<|im_end|>\n<|im_start|>assistant\n<think> ok </think> <answer> Paris </answer>"
         " naïve café — 東京 🙂")


def vocab_digest(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id, added tokens included): equal digests, same ids."""
    vocab = sorted((str(k), int(v)) for k, v in tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=True).encode()).hexdigest()


def _row_lengths(seqs: list[list[int]], starts: list[int]) -> list[int]:
    return [len(s) - st for s, st in zip(seqs, starts)]


@dataclass(frozen=True)
class SeekrlScoring:
    """`seekrl serve engine`'s POST /score (module docstring)."""

    name: ClassVar[str] = "seekrl"

    def score(self, seqs: list[list[int]], starts: list[int], temperature: float | list[float]) -> HTTPCall:
        temps = _temperatures(temperature, len(seqs))
        sent = temps[0] if len(set(temps)) == 1 else temps  # one number when they agree, as a client that is not seekrl's sends
        return HTTPCall("POST", "/score", {"input_ids": seqs, "start": starts, "temperature": sent})

    def parse_score(self, body: Any, seqs: list[list[int]], starts: list[int]) -> list[list[float]]:
        what = "seekrl /score"
        rows = body.get("logprobs") if isinstance(body, dict) else None
        if not isinstance(rows, list) or len(rows) != len(seqs):
            raise AdapterError(f"{what}: expected {{\"logprobs\": [{len(seqs)} lists]}}, got {one_line(body, 120)}")
        out = []
        for i, (row, n) in enumerate(zip(rows, _row_lengths(seqs, starts))):
            if not isinstance(row, list) or len(row) != n:
                raise AdapterError(f"{what}: logprobs[{i}] should hold {n} numbers, got {one_line(row, 80)}")
            out.append([logprob(v, f"{what}: logprobs[{i}][{j}]") for j, v in enumerate(row)])
        return out

    def tokenizer_call(self) -> HTTPCall:
        return HTTPCall("GET", "/model_info")

    def tokenizer_problem(self, body: Any, tokenizer) -> str | None:
        """Why the server's tokenizer is not `tokenizer` (None: the same vocabulary)."""
        digest = body.get("vocab_digest") if isinstance(body, dict) else None
        if not isinstance(digest, str):
            raise AdapterError(f"seekrl /model_info has no vocab_digest (a seekrl server older than /score?): {one_line(body, 120)}")
        if digest == vocab_digest(tokenizer):
            return None
        return f"its vocabulary ({body.get('vocab_size')} ids) is not the policy's ({len(tokenizer.get_vocab())} ids)"


@dataclass(frozen=True)
class VLLMScoring:
    """vLLM's POST /v1/completions with prompt_logprobs (module docstring)."""

    name: ClassVar[str] = "vllm"

    def score(self, seqs: list[list[int]], starts: list[int], temperature: float | list[float]) -> HTTPCall:
        other = next((t for t in _temperatures(temperature, len(seqs)) if t != 1.0), None)
        if other is not None:
            raise ValueError(f"vLLM's prompt log-probs are taken at temperature 1, not {other}")
        body = {"prompt": seqs, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                "skip_special_tokens": False, "stream": False}
        return HTTPCall("POST", "/v1/completions", body)

    def parse_score(self, body: Any, seqs: list[list[int]], starts: list[int]) -> list[list[float]]:
        what = "vllm /v1/completions"
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or len(choices) != len(seqs) or not all(isinstance(c, dict) for c in choices):
            raise AdapterError(f"{what}: expected {len(seqs)} choices (one per prompt), got {one_line(choices, 120)}")
        if all(is_int(c.get("index")) for c in choices):
            choices = sorted(choices, key=lambda c: c["index"])
        out = []
        for i, (choice, seq, start) in enumerate(zip(choices, seqs, starts)):
            entries = choice.get("prompt_logprobs")
            if not isinstance(entries, list) or len(entries) != len(seq):
                raise AdapterError(f"{what}: choices[{i}].prompt_logprobs should hold {len(seq)} entries (was prompt_logprobs sent?), "
                                   f"got {one_line(entries, 80)}")
            row = []
            for j in range(start, len(seq)):
                entry = entries[j]
                found = entry.get(str(seq[j])) if isinstance(entry, dict) else None
                value = found.get("logprob") if isinstance(found, dict) else found
                if value is None:
                    raise AdapterError(f"{what}: choices[{i}].prompt_logprobs[{j}] has no entry for token {seq[j]}: {one_line(entry, 80)}")
                row.append(logprob(value, f"{what}: choices[{i}].prompt_logprobs[{j}]"))
            out.append(row)
        return out

    def tokenizer_call(self) -> HTTPCall:
        return HTTPCall("POST", "/tokenize", {"prompt": PROBE, "add_special_tokens": False})

    def tokenizer_problem(self, body: Any, tokenizer) -> str | None:
        tokens = int_list(body.get("tokens") if isinstance(body, dict) else body, "vllm /tokenize tokens")
        ours = list(tokenizer.encode(PROBE, add_special_tokens=False))
        if tokens == ours:
            return None
        first = next((k for k, (a, b) in enumerate(zip(tokens, ours)) if a != b), min(len(tokens), len(ours)))
        return f"it encodes a probe text as {len(tokens)} ids, the policy's tokenizer as {len(ours)} (first difference at id {first})"


SCORING_APIS: dict[str, type] = {"seekrl": SeekrlScoring, "vllm": VLLMScoring}


class TeacherClient:
    """Scores token sequences on one teacher server (module docstring). Synchronous; not thread-safe."""

    def __init__(self, url: str, api: str = "seekrl", *, token: str | None = None, timeout_s: float = 300.0,
                 tries: int = 3, chunk: int = 64, backoff_s: float = 0.5):
        if api not in SCORING_APIS:
            raise ValueError(f"teacher api {api!r} is not one of {', '.join(SCORING_APIS)}")
        self.url, self.api, self.tries, self.chunk, self.backoff_s = url.rstrip("/"), SCORING_APIS[api](), max(1, tries), chunk, backoff_s
        self.client = sync_client(base_url=self.url, token=token, timeout_s=timeout_s)
        self.requests = 0

    def _send(self, call: HTTPCall) -> Any:
        """One call, retried on connection failures, timeouts and 5xx; the JSON answer."""
        last = ""
        for attempt in range(self.tries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = self.client.request(call.method, call.path, json=call.json)
            except httpx.HTTPError as e:  # refused, reset, timed out
                last = f"{type(e).__name__}: {one_line(e, 160) or 'no answer'}"
                continue
            self.requests += 1
            if r.status_code >= 500:
                last = f"HTTP {r.status_code}: {one_line(r.text, 160)}"
                continue
            if r.status_code >= 400:
                hint = " (set algo.teacher.token_env to the variable holding its token)" if r.status_code in (401, 403) else ""
                raise EngineRequestError(f"the teacher server {self.url} refused {call.path}: HTTP {r.status_code}: "
                                         f"{one_line(_detail(r), 200)}{hint}")
            try:
                return r.json()
            except ValueError:
                raise EngineRequestError(f"the teacher server {self.url} answered {call.path} with something that is not JSON: "
                                         f"{one_line(r.text, 120)}") from None
        raise EngineUnavailable(f"the teacher server {self.url} did not answer {call.path} in {self.tries} tries ({last}); "
                                "start it (seekrl serve engine --model DIR) or fix algo.teacher.url")

    def score(self, seqs: list[list[int]], starts: list[int], temperature: float | list[float]) -> list[list[float]]:
        """For each sequence, the teacher's log-probs of its tokens `start ..` (empty where there are none),
        at `temperature`: one for all, or one a sequence."""
        temps = _temperatures(temperature, len(seqs))
        out: list[list[float]] = [[] for _ in seqs]
        todo = [i for i, (s, st) in enumerate(zip(seqs, starts)) if len(s) > st]
        for k in range(0, len(todo), self.chunk):
            part = todo[k : k + self.chunk]
            sub, sub_starts = [seqs[i] for i in part], [starts[i] for i in part]
            body = self._send(self.api.score(sub, sub_starts, [temps[i] for i in part]))
            try:
                rows = self.api.parse_score(body, sub, sub_starts)
            except AdapterError as e:
                raise EngineRequestError(f"the teacher server {self.url}: {e}") from None
            for i, row in zip(part, rows):
                out[i] = row
        return out

    def check_tokenizer(self, tokenizer) -> None:
        """ConfigError (one line) when the server's tokenizer is not `tokenizer`."""
        body = self._send(self.api.tokenizer_call())
        try:
            problem = self.api.tokenizer_problem(body, tokenizer)
        except AdapterError as e:
            raise EngineRequestError(f"the teacher server {self.url}: {e}") from None
        if problem:
            raise ConfigError(f"algo.teacher.url: the teacher at {self.url} has another tokenizer: {problem}; distillation scores "
                              "the student's own token ids, so serve a teacher with the policy's tokenizer")

    def close(self) -> None:
        self.client.close()


def _temperatures(temperature: float | list[float], n: int) -> list[float]:
    """One temperature a sequence, from one for all or a list of `n`."""
    if isinstance(temperature, (int, float)):
        return [float(temperature)] * n
    if len(temperature) != n:
        raise ValueError(f"{len(temperature)} temperatures for {n} sequences")
    return [float(t) for t in temperature]


def _detail(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("message") or body.get("error")
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
        return str(detail) if detail else json.dumps(body)
    return json.dumps(body)
