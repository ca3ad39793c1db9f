"""The per-API wire format of RemoteEngine (seekrl/engines/adapters.py) and the vLLM worker
extension (seekrl/engines/vllm_worker.py), against recorded exchanges.

Each tests/fixtures/engine_api/*.json is one exchange written from the SGLang 0.5.23 / vLLM 0.33.0
sources (its "source" field names the files): the request body the adapter must build, exactly,
the server's answer, and the GenResult (or one-line AdapterError) it must parse into.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from seekrl.engines.adapters import (
    VLLMAPI,
    AdapterError,
    GenResult,
    HTTPCall,
    SGLangAPI,
    get_api,
)
from seekrl.engines.vllm_worker import SeekrlWorkerExtension
from seekrl.types import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine_api"


def _load(kind: str) -> list[dict]:
    fixtures = [json.loads(p.read_text()) | {"file": p.name} for p in sorted(FIXTURES.glob("*.json"))]
    return [f for f in fixtures if f["exchange"] == kind]


def _params(d: dict) -> SamplingParams:
    d = dict(d)
    return SamplingParams(**{**d, "stop": tuple(d.get("stop", ())), "stop_token_ids": tuple(d.get("stop_token_ids", ()))})


def _as_dict(call: HTTPCall) -> dict:
    return {"method": call.method, "path": call.path, "json": call.json}


GENERATE = _load("generate")
UPDATE = _load("update")


def test_every_api_has_the_recorded_cases():
    for api in ("sglang", "vllm"):
        names = {f["file"] for f in GENERATE + UPDATE if f["api"] == api}
        for case in ("stop_token", "eos", "stop_string", "length", "abort", "malformed"):
            assert f"{api}_generate_{case}.json" in names
        assert {f"{api}_update_success.json", f"{api}_update_failure.json"} <= names
    assert all(f["source"] for f in GENERATE + UPDATE)


@pytest.mark.parametrize("fx", GENERATE, ids=lambda f: f["file"])
def test_generate_request_is_exactly_the_recorded_one(fx):
    call = get_api(fx["api"]).generate(fx["prompt_ids"], _params(fx["params"]), fx["rid"])
    assert _as_dict(call) == fx["request"]
    json.dumps(call.json)  # serialisable as it is


@pytest.mark.parametrize("fx", GENERATE, ids=lambda f: f["file"])
def test_parse_generate(fx):
    api = get_api(fx["api"])
    if fx.get("expected_error"):
        with pytest.raises(AdapterError) as err:
            api.parse_generate(fx["response"], fx["prompt_ids"])
        assert fx["expected_error"] in str(err.value)
        assert "\n" not in str(err.value)
        return
    res = api.parse_generate(fx["response"], fx["prompt_ids"])
    assert res == GenResult(**fx["expected"])


@pytest.mark.parametrize("fx", UPDATE, ids=lambda f: f["file"])
def test_weight_update_calls_and_answers(fx):
    api = get_api(fx["api"])
    calls = [*api.pause(fx["mode"]), *api.update_from_disk(fx["folder"], fx["version"]), *api.resume()]
    assert [_as_dict(c) for c in calls] == fx["calls"]
    errors = []
    for call, body in zip(calls, fx["responses"], strict=True):
        try:
            api.check_update(call, body)
        except AdapterError as e:
            errors.append(str(e))
    if fx["expected_error"] is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].startswith(fx["expected_error"]) and "\n" not in errors[0]


# ----------------------------------------------------------------------------------- SGLang


def _sglang_answer(ids, entries, finish, **meta):
    return {"text": "", "output_ids": ids, "meta_info": {"finish_reason": finish, "output_token_logprobs": entries, **meta}}


def test_sglang_appends_a_stop_id_trimmed_from_output_ids_when_its_logprob_came_back():
    body = _sglang_answer([5, 6], [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 2, None]], {"type": "stop", "matched": 2},
                          weight_version="7", weight_versions=[{"version": "7", "start": 0, "end": 2}])
    assert SGLangAPI().parse_generate(body, [1]) == GenResult([5, 6, 2], [-0.1, -0.2, -0.3], "stop", [7, 7, 7], 7)


def test_sglang_stop_token_missing_from_the_answer_is_an_error():
    body = _sglang_answer([5, 6], [[-0.1, 5, None], [-0.2, 6, None]], {"type": "stop", "matched": 2})
    with pytest.raises(AdapterError, match="finished on token 2 but output_ids end with 6"):
        SGLangAPI().parse_generate(body, [1])


@pytest.mark.parametrize("body, message", [
    ({"meta_info": {}}, "output_ids is not a list of token ids"),
    ({"output_ids": [5]}, "no meta_info"),
    (_sglang_answer([5], [[-0.1, 5, None]], None), "finish_reason None is not one of"),
    (_sglang_answer([5], [[-0.1, 5, None]], {"type": "stop", "matched": "NaN happened"}), "NaN logits"),
    (_sglang_answer([5], [[-0.1, 9, None]], {"type": "length", "length": 1}), "output_token_logprobs[0]"),
    (_sglang_answer([5], [[None, 5, None]], {"type": "length", "length": 1}), "is not a number"),
    (_sglang_answer([5], [[-0.1, 5, None]], {"type": "length", "length": 1}, weight_versions=[{"version": "1", "start": 0, "end": 2}]),
     "cover 2 tokens, the answer has 1"),
    (_sglang_answer([5, 6], [[-0.1, 5, None], [-0.1, 6, None]], {"type": "length", "length": 2},
                    weight_versions=[{"version": "1", "start": 0, "end": 1}, {"version": "2", "start": 0, "end": 2}]), "not contiguous"),
    ([{"output_ids": []}, {"output_ids": []}], "expected one JSON object"),
])
def test_sglang_malformed_answers_are_one_line_errors(body, message):
    with pytest.raises(AdapterError) as err:
        SGLangAPI().parse_generate(body, [1])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_sglang_abort_keeps_no_extra_logprob_and_a_one_element_list_answer_is_read():
    body = _sglang_answer([], [[-0.4, 5, None]], {"type": "abort", "message": "Aborted"})
    assert SGLangAPI().parse_generate([body], [1]) == GenResult([], [], "abort", None, None)


def test_sglang_pause_abort_and_stale_kv_modes():
    api = SGLangAPI()
    assert api.pause("abort") == [HTTPCall("POST", "/pause_generation", {"mode": "abort"})]
    assert api.pause("in_place") == [HTTPCall("POST", "/pause_generation", {"mode": "retract"})]
    assert api.abort("r-1") == [HTTPCall("POST", "/abort_request", {"rid": "r-1#"})]
    assert api.abort(None) == [HTTPCall("POST", "/abort_request", {"abort_all": True})]
    assert api.set_version(5) == [HTTPCall("POST", "/update_weight_version", {"new_version": "5", "abort_all_requests": False})]
    assert api.model_info() == HTTPCall("GET", "/model_info") and api.health == HTTPCall("GET", "/health")
    stale = SGLangAPI(keep_stale_kv=True)
    assert stale.pause("in_place") == [HTTPCall("POST", "/pause_generation", {"mode": "in_place"})]
    assert stale.update_from_disk("/w/v2", 2)[0].json["flush_cache"] is False
    with pytest.raises(ValueError, match="pause mode 'hold'"):
        api.pause("hold")
    with pytest.raises(ValueError, match="contains '#'"):
        api.generate([1], SamplingParams(), "bad#rid")


def test_sglang_nccl_calls():
    api = SGLangAPI()
    assert api.nccl_init("10.0.0.1", 29500, 1, 3) == [HTTPCall("POST", "/init_weights_update_group", {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 3,
        "group_name": "weight_update_group", "backend": "nccl"})]
    plan = api.nccl_update(["lm_head.weight"], ["bfloat16"], [[32, 8]], 6)
    assert plan.before == [HTTPCall("POST", "/begin_weight_update", {})]
    assert plan.transfer == HTTPCall("POST", "/update_weights_from_distributed", {
        "names": ["lm_head.weight"], "dtypes": ["bfloat16"], "shapes": [[32, 8]], "group_name": "weight_update_group",
        "weight_version": "6", "flush_cache": True, "abort_all_requests": False})
    assert plan.after == [HTTPCall("POST", "/end_weight_update", {})]
    with pytest.raises(AdapterError, match="/update_weights_from_distributed failed: Failed to receive weights"):
        api.check_update(plan.transfer, {"success": False, "message": "Failed to receive weights: timeout"})
    with pytest.raises(AdapterError, match="/begin_weight_update failed"):
        api.check_update(plan.before[0], {"message": "no success field"})


def test_sglang_server_command():
    argv, env = SGLangAPI().server_command("/run/engine/weights/v0", "127.0.0.1", 30001, ["--tp-size", "2"])
    assert argv == [sys.executable, "-m", "sglang.launch_server", "--model-path", "/run/engine/weights/v0",
                    "--host", "127.0.0.1", "--port", "30001", "--weight-version", "0", "--enable-deterministic-inference",
                    "--tp-size", "2"]  # seeds reach every request; SGLang honours sampling_seed only with the flag
    assert env == {"SGLANG_RETURN_ORIGINAL_LOGPROB": "false"}


# ------------------------------------------------------------------------------------- vLLM


def test_vllm_refuses_top_p_top_k_unless_allowed():
    for params in (SamplingParams(top_p=0.9), SamplingParams(top_k=20)):
        with pytest.raises(ValueError, match="renormalised after top-p/top-k"):
            VLLMAPI().generate([1], params, "r")
        assert VLLMAPI(allow_filtered_logprobs=True).generate([1], params, "r").json["top_p"] == params.top_p
    greedy = VLLMAPI().generate([1], SamplingParams(temperature=0.0, top_p=0.9, top_k=20), "r")  # T=1 argmax: unaffected
    assert greedy.json["top_k"] == 20


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(finish_reason="error"), "finish_reason 'error' is not one of"),
    (lambda c: c.update(logprobs=None), "token_logprobs is missing"),
    (lambda c: c["logprobs"]["token_logprobs"].pop(), "2 token_logprobs for 3 token_ids"),
    (lambda c: c.update(stop_reason=151645, finish_reason="stop"), "stopped on token 151645 but token_ids end with 315"),
    (lambda c: c.update(weight_versions=[{"version": "3", "start": 1, "end": 3}]), "not contiguous from token 0"),
])
def test_vllm_malformed_answers_are_one_line_errors(change, message):
    body = json.loads((FIXTURES / "vllm_generate_abort.json").read_text())["response"]
    change(body["choices"][0])
    with pytest.raises(AdapterError) as err:
        VLLMAPI().parse_generate(body, [1])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_vllm_without_weight_versions_has_unknown_versions():
    body = json.loads((FIXTURES / "vllm_generate_abort.json").read_text())["response"]
    del body["choices"][0]["weight_versions"]
    res = VLLMAPI().parse_generate(body, [1])
    assert (res.versions, res.version, res.finish_reason) == (None, None, "abort")


def test_vllm_control_calls():
    api = VLLMAPI()
    # keep + abort all: vLLM's abort / wait pauses answer new requests 503 until /resume
    assert api.pause("abort") == [HTTPCall("POST", "/pause?mode=keep"), HTTPCall("POST", "/abort_requests", {})]
    assert api.pause("in_place") == [HTTPCall("POST", "/pause?mode=keep")]
    assert all("mode=abort" not in c.path and "mode=wait" not in c.path for m in ("abort", "in_place") for c in api.pause(m))
    assert api.abort("r-1") == [HTTPCall("POST", "/abort_requests", {"request_ids": ["cmpl-r-1-0"]})]
    assert api.abort(None) == [HTTPCall("POST", "/abort_requests", {})]
    assert api.model_info() == HTTPCall("GET", "/v1/models")
    assert [c.path for c in VLLMAPI(keep_stale_kv=True).update_from_disk("/w/v2", 2)] == ["/collective_rpc", "/update_weight_version"]
    rpc = api.update_from_disk("/w/v2", 2)[0]
    for body, message in [({"results": ["0"]}, "worker 0 loaded 0 tensors"), ({"results": []}, "no results"),
                          ({"error": {"message": "no *.safetensors file in /w/v2", "type": "BadRequestError", "param": None, "code": 400}},
                           "/collective_rpc failed: no *.safetensors file in /w/v2")]:
        with pytest.raises(AdapterError, match=message.replace("*", r"\*")):
            api.check_update(rpc, body)
    api.check_update(rpc, {"results": ["12", "12"]})  # two tensor-parallel workers
    with pytest.raises(AdapterError, match="/pause failed: Invalid pause mode"):
        api.check_update(HTTPCall("POST", "/pause?mode=x"), {"error": "Invalid pause mode: x"})


def test_vllm_nccl_calls():
    api = VLLMAPI()
    assert api.nccl_init("10.0.0.1", 29500, 1, 2) == [HTTPCall("POST", "/init_weight_transfer_engine", {"init_info": {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2, "packed": False}})]
    plan = api.nccl_update(["lm_head.weight"], ["bfloat16"], [[32, 8]], 6)
    assert plan.before == [HTTPCall("POST", "/start_weight_update")]
    assert plan.transfer == HTTPCall("POST", "/update_weights", {"update_info": {
        "names": ["lm_head.weight"], "dtype_names": ["bfloat16"], "shapes": [[32, 8]]}})
    assert plan.after == [HTTPCall("POST", "/finish_weight_update", {"weight_version": "6"}),
                          HTTPCall("POST", "/reset_prefix_cache?reset_running_requests=true")]
    assert api.NCCL_SERVER_ARGS == ("--weight-transfer-config", '{"backend": "nccl"}')


def test_vllm_server_command(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    argv, env = VLLMAPI().server_command("/run/engine/weights/v0", "127.0.0.1", 8001, ["--dtype", "bfloat16"])
    # the module, not the `vllm` script: the CPU build's distribution is `vllm-cpu`, which the script's lookup misses
    assert argv == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/run/engine/weights/v0",
                    "--host", "127.0.0.1", "--port", "8001", "--logprobs-mode", "processed_logprobs",
                    "--worker-extension-cls", "seekrl.engines.vllm_worker.SeekrlWorkerExtension", "--dtype", "bfloat16"]
    # a core range (vLLM refuses "all"); a KV cache size (else the CPU build wants 92% of the RAM free); a small
    # oneDNN primitive cache (at 1,024 the worker grows with every new batch shape)
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"}
    for flags in (["--kv-cache-memory-bytes", "1000000000"], ["--gpu-memory-utilization=0.5"]):  # sized by a flag: no env
        assert "VLLM_CPU_KVCACHE_SPACE" not in VLLMAPI().server_command("/m", "127.0.0.1", 1, flags)[1]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert VLLMAPI().server_command("/m", "127.0.0.1", 1, [])[1]["VLLM_CPU_OMP_THREADS_BIND"] == "0,2,5"
    # fewer threads than cores (three seeds sharing two cores): unbound, OMP_NUM_THREADS threads; as many or more: bound
    for threads, bind in (("1", "nobind"), ("2", "nobind"), ("3", "0,2,5"), ("8", "0,2,5"), ("", "0,2,5"), ("x", "0,2,5")):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        assert VLLMAPI().server_command("/m", "127.0.0.1", 1, [])[1]["VLLM_CPU_OMP_THREADS_BIND"] == bind, threads
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")  # the caller's choice stands (inherited by the server)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    assert not {"VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"} & set(VLLMAPI().server_command("/m", "127.0.0.1", 1, [])[1])


def test_vllm_on_a_cpu_prefills_whole_prompts():
    """vLLM's CPU build dies rewinding a seeded request's CPU generator after a chunked prefill
    (setup.VLLM_CPU_PREFILL): servers seekrl starts for a CPU run get --no-enable-chunked-prefill,
    GPU runs keep vLLM's default, and engine.server_args' own choice stands."""
    from seekrl.engines.config import EngineConfig
    from seekrl.engines.setup import SamplerSettings, server_command

    def argv(device, *server_args):
        e = EngineConfig(kind="remote", api="vllm", servers=1, server_kind="vllm", server_args=list(server_args))
        return server_command(e, "/m", 8000, None, SamplerSettings(device=device)).argv

    assert argv("cpu").count("--no-enable-chunked-prefill") == 1
    assert "--no-enable-chunked-prefill" not in argv("cuda")
    assert "--no-enable-chunked-prefill" not in argv("cpu", "--enable-chunked-prefill")
    assert argv("cpu", "--no-enable-chunked-prefill").count("--no-enable-chunked-prefill") == 1
    assert ("--no-enable-chunked-prefill" in argv("auto")) == (not torch.cuda.is_available())


def test_get_api():
    assert isinstance(get_api("sglang"), SGLangAPI) and isinstance(get_api("vllm"), VLLMAPI)
    with pytest.raises(ValueError, match="unknown engine API 'tgi'; choose one of: sglang, vllm"):
        get_api("tgi")


# ------------------------------------------------------------------------ vLLM worker extension


def _weights_folder(tmp_path: Path) -> dict[str, torch.Tensor]:
    tensors = {"model.embed_tokens.weight": torch.randn(10, 4), "model.norm.weight": torch.ones(4),
               "lm_head.weight": torch.randn(10, 4, dtype=torch.bfloat16)}
    save_file({k: tensors[k] for k in ("model.embed_tokens.weight", "model.norm.weight")}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"lm_head.weight": tensors["lm_head.weight"]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    return tensors


class _FakeModel:
    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor
        return set(self.loaded)


class _FakeModelRunner:
    def __init__(self):
        self.model = _FakeModel()


class _FakeWorker(SeekrlWorkerExtension):
    def __init__(self):
        self.model_runner = _FakeModelRunner()


def test_worker_extension_loads_every_tensor_through_model_load_weights(tmp_path):
    tensors = _weights_folder(tmp_path)
    worker = _FakeWorker()
    assert worker.load_weights_from_folder(str(tmp_path)) == 3
    loaded = worker.model_runner.model.loaded
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)


def test_worker_extension_prefers_vllms_reload_weights(tmp_path):
    tensors = _weights_folder(tmp_path)

    class Worker(_FakeWorker):
        def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
            self.reloaded = ({name for name, _ in weights_iterator}, is_checkpoint_format)

    worker = Worker()
    assert worker.load_weights_from_folder(str(tmp_path)) == 3
    assert worker.reloaded == (set(tensors), True) and worker.model_runner.model.loaded == {}


def test_worker_extension_gives_free_memory_back_after_each_load(tmp_path, monkeypatch):
    import seekrl.engines.vllm_worker as vllm_worker

    _weights_folder(tmp_path)
    worker = _FakeWorker()
    released = []  # how many tensors the model held when release() ran: after the load, not before
    monkeypatch.setattr(vllm_worker, "release", lambda: released.append(len(worker.model_runner.model.loaded)) or {})
    worker.load_weights_from_folder(str(tmp_path))
    worker.load_weights_from_folder(str(tmp_path))
    assert released == [3, 3]


def test_worker_extension_needs_safetensors_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors file"):
        _FakeWorker().load_weights_from_folder(str(tmp_path))


def test_worker_extension_defines_one_method_and_imports_no_vllm():
    assert [a for a in dir(SeekrlWorkerExtension) if not a.startswith("__")] == ["load_weights_from_folder"]
    code = "import sys, seekrl.engines.vllm_worker; print(any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sglang_refuses_ignore_eos_with_stop_token_ids():
    api = SGLangAPI()
    with pytest.raises(ValueError) as err:
        api.generate([1, 2], SamplingParams(max_new_tokens=4, ignore_eos=True, stop_token_ids=(7,)), "r")
    assert "ignore_eos" in str(err.value) and "\n" not in str(err.value)
    api.generate([1, 2], SamplingParams(max_new_tokens=4, ignore_eos=True), "r")  # alone: fine
    api.generate([1, 2], SamplingParams(max_new_tokens=4, stop_token_ids=(7,)), "r")


def test_sglang_abort_always_sends_a_json_body():
    for rid in (None, "r-1"):
        (call,) = SGLangAPI().abort(rid)
        assert isinstance(call.json, dict) and call.json


def test_context_is_read_from_model_info():
    assert SGLangAPI().parse_context({"model_path": "m", "max_context": 512}) == 512  # seekrl serve engine
    assert SGLangAPI().parse_context({"context_length": 4096, "model_path": "m"}) == 4096
    assert SGLangAPI().parse_context({"model_path": "m", "weight_version": "0"}) is None
    assert [c.path for c in SGLangAPI().context_calls()] == ["/model_info", "/server_info"]
    body = {"object": "list", "data": [{"id": "/w/v0", "object": "model", "max_model_len": 2048}]}
    assert VLLMAPI().parse_context(body) == 2048
    assert VLLMAPI().parse_context({"data": []}) is None and VLLMAPI().parse_context([1]) is None
