"""Reliability fixes: train.resume naming nothing fails before the model loads; a corrupt .gz data
file is one DataError line; StatsTracker stays finite near the float limit."""

from __future__ import annotations

import gzip
import math

import pytest

import seekrl.build as build
from seekrl.config import load_config
from seekrl.errors import CheckpointError, DataError
from seekrl.observe.stats import StatsTracker


@pytest.mark.parametrize("builder", ["build_rl", "build_sft"])
def test_resume_path_missing_fails_before_model_loads(tmp_path, monkeypatch, builder):
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before train.resume was checked")

    monkeypatch.setattr(build, "_policy", no_model)
    missing = tmp_path / "runs" / "x" / "checkpoints" / "step_9"
    cfg = load_config(None, [f"train.resume={missing}", f"log.dir={tmp_path}"])
    with pytest.raises(CheckpointError) as e:
        getattr(build, builder)(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "train.resume" in msg and str(missing) in msg and "does not exist" in msg


def _gz(path, text: str) -> bytes:
    data = gzip.compress(text.encode())
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("name", ["rows.jsonl.gz", "rows.json.gz"])
@pytest.mark.parametrize("damage", ["truncated", "not_gzip", "bad_crc"])
def test_corrupt_gz_data_file_is_one_dataerror(tmp_path, name, damage):
    from seekrl.data.loaders import load_tasks, read_rows

    path = tmp_path / name
    rows = "".join(f'{{"question": "q{i} {"x" * 50}", "answer": "a{i}"}}\n' for i in range(200))
    data = _gz(path, "[" + rows.replace("}\n", "},", 199).rstrip("\n") + "]" if name.endswith(".json.gz") else rows)
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "not_gzip":
        path.write_bytes(b"\x1f\x8b this is not gzip at all" * 10)
    else:
        path.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:])
    for read in (lambda: list(read_rows(path)), lambda: load_tasks(str(path))):
        with pytest.raises(DataError) as e:
            read()
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg and "gzip" in msg


def test_intact_gz_still_reads(tmp_path):
    from seekrl.data.loaders import read_rows

    path = tmp_path / "ok.jsonl.gz"
    _gz(path, '{"question": "q", "answer": "a"}\n')
    assert [r for _, r in read_rows(path)] == [{"question": "q", "answer": "a"}]


def _all_finite(metrics: dict) -> bool:
    return all(math.isfinite(v) for v in metrics.values())


def test_stats_tracker_stays_finite_near_float_limit():
    import torch

    big = 1.7e308
    t = StatsTracker()
    t.add(a=big)
    t.add(a=big)
    t.add(n=-big)
    t.add(n=big)
    t.add_weighted(1e10, w=1e300)
    t.add_weighted(1e10, w=1e300)
    t.add_masked("m", [big, big, 5.0], [1, 1, 0])
    t.add_masked("mt", torch.tensor([big, big, 3.0], dtype=torch.float64), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    t.add_dist("d", [1e300, -1e300, 1e300])
    t.add_dist("d", [big, -big])
    t.add_dist("e", [1e300] * 4)
    out = t.export(reset=False)
    assert _all_finite(out), out
    assert out["a"] == pytest.approx(big) and out["n"] == 0.0 and out["w"] == pytest.approx(1e300)
    assert out["m"] == pytest.approx(big) and out["mt"] == pytest.approx(big)
    assert out["d/min"] == -big and out["d/max"] == big and out["d/std"] <= big
    xs = [1e300, -1e300, 1e300, big, -big]
    mean = 1e300 / 5  # the big pair cancels
    std = math.sqrt(sum((x / 1e300 - 0.2) ** 2 for x in xs) / 5) * 1e300
    assert out["d/mean"] == pytest.approx(mean, rel=1e-9) and out["d/std"] == pytest.approx(std, rel=1e-9)
    assert out["e/std"] == 0.0 and out["e/mean"] == pytest.approx(1e300)
    merged = StatsTracker()  # ranks pool the same way
    merged.merge([t.state(), t.state()])
    assert _all_finite(merged.export())


def test_stats_tracker_small_values_unchanged():
    t = StatsTracker()
    t.add_dist("r", [1.0, 2.0, 3.0])
    t.add_dist("r", [4.0])
    t.add(x=1.0)
    t.add(x=3.0)
    t.add_weighted(0.25, y=4.0)
    t.add_weighted(0.75, y=8.0)
    out = t.export()
    assert out["r/mean"] == pytest.approx(2.5) and out["r/std"] == pytest.approx(math.sqrt(1.25))
    assert out["x"] == 2.0 and out["y"] == pytest.approx(7.0)


# ----------------------------------------------------------------------------- engine config rules


@pytest.mark.parametrize("overrides, key", [
    (["rollout.temperature=2.5"], "rollout.temperature=2.5"),
    (["eval.temperature=3"], "eval.temperature=3"),
])
def test_vllm_temperature_over_2_is_a_config_error(overrides, key):
    from seekrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, ["engine.servers=1", "engine.api=vllm", *overrides])
    assert key in str(e.value) and "at most 2" in str(e.value) and "\n" not in str(e.value)
    load_config(None, ["engine.servers=1", "engine.api=vllm", "rollout.temperature=2", "eval.temperature=2"])
    load_config(None, ["engine.servers=1", *overrides])  # sglang takes it


def test_weight_sync_timeout_key():
    from seekrl.errors import ConfigError

    assert load_config().engine.weight_sync_timeout_s == 600.0
    assert load_config(None, ["engine.weight_sync_timeout_s=30"]).engine.weight_sync_timeout_s == 30.0
    with pytest.raises(ConfigError, match="engine.weight_sync_timeout_s"):
        load_config(None, ["engine.weight_sync_timeout_s=0"])


def test_weight_sync_timeout_reaches_the_remote_engine(tmp_path, monkeypatch):
    from seekrl.engines import setup
    from seekrl.engines.remote import RemoteEngine

    cfg = load_config(None, ["engine.urls=[http://127.0.0.1:9]", "engine.weight_sync_timeout_s=42", "engine.timeout_s=7"])
    engine = setup.make_engine(cfg.engine, None, None, tmp_path, setup.SamplerSettings())
    assert isinstance(engine, RemoteEngine) and engine.weight_sync_timeout_s == 42.0 and engine.timeout_s == 7.0


def test_vllm_off_loopback_needs_the_opt_in():
    from seekrl.engines.setup import SamplerSettings, check_control_exposure, is_loopback, server_command
    from seekrl.errors import ConfigError

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.0.2")
    assert not is_loopback("10.0.0.5") and not is_loopback("0.0.0.0") and not is_loopback("node-1")
    e = load_config(None, ["engine.servers=1", "engine.api=vllm"]).engine
    with pytest.raises(ConfigError) as err:
        server_command(e, "/m", 8000, "tok", SamplerSettings(), host="10.0.0.5")
    assert "engine.allow_unauthenticated_control=true" in str(err.value) and "\n" not in str(err.value)
    check_control_exposure(e, "127.0.0.1")
    server_command(e, "/m", 8000, "tok", SamplerSettings(), host="127.0.0.1")
    opted = load_config(None, ["engine.servers=1", "engine.api=vllm", "engine.allow_unauthenticated_control=true"]).engine
    server_command(opted, "/m", 8000, "tok", SamplerSettings(), host="10.0.0.5")
    seekrl_kind = load_config(None, ["engine.servers=1"]).engine  # seekrl's server checks its token on every endpoint
    server_command(seekrl_kind, "/m", 8000, "tok", SamplerSettings(), host="10.0.0.5")


def test_launch_refuses_vllm_servers_on_node_ips_before_ray(tmp_path, monkeypatch):
    from seekrl.cluster import ray_launch
    from seekrl.errors import ConfigError

    def no_ray():
        raise AssertionError("Ray was started before the check")

    monkeypatch.setattr(ray_launch, "require_ray", no_ray)
    cfg = load_config(None, ["engine.api=vllm", "cluster.engine_servers=1", f"log.dir={tmp_path}"])
    with pytest.raises(ConfigError, match="allow_unauthenticated_control"):
        ray_launch.launch(cfg)
