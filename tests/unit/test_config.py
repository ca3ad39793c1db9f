"""Config: YAML + overrides, types, cross-field validation, field docs, the examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from seekrl.config import SECTIONS, Config, ConfigError, field_docs, load_config, parse_override

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_defaults_are_valid():
    cfg = load_config()
    assert cfg.algo.name == "grpo" and cfg.rollout.batch_size % cfg.rollout.group_size == 0


def test_yaml_then_overrides(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("algo:\n  name: ppo\n  kl_coef: 0.01\ntrain:\n  steps: 7\n")
    cfg = load_config(p, ["train.steps=9", "train.lr=1e-3", "rollout.stop=[</search>, </answer>]", "algo.dual_clip=3"])
    assert cfg.algo.name == "ppo" and cfg.algo.kl_coef == 0.01
    assert cfg.train.steps == 9  # the command line wins over the file
    assert cfg.train.lr == 0.001  # YAML 1.1 reads 1e-3 as a string; the float field accepts it
    assert cfg.rollout.stop == ["</search>", "</answer>"]
    assert cfg.algo.dual_clip == 3.0 and isinstance(cfg.algo.dual_clip, float)
    assert cfg.log.name == "x"  # run name defaults to the file stem


def test_single_item_list_and_null():
    cfg = load_config(None, ["reward.functions=qa_em", "data.eval=null"])
    assert cfg.reward.functions == ["qa_em"] and cfg.data.eval is None


def test_parse_override_shapes():
    assert parse_override("algo.kl_coef=0.01") == ("algo", "kl_coef", 0.01)
    assert parse_override("log.name=my run") == ("log", "name", "my run")
    for bad in ("steps=5", "a.b.c=1", ".x=1"):
        with pytest.raises(ConfigError):
            parse_override(bad)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.nmae=ppo"], "unknown key 'algo.nmae'; did you mean 'algo.name'?"),
        (["trian.steps=1"], "unknown section 'trian'; did you mean 'train'?"),
        (["train.steps=1.5"], "train.steps: expected an integer, got 1.5"),
        (["log.tensorboard=maybe"], "log.tensorboard: expected true or false"),
        (["rollout.batch_size=20", "rollout.group_size=8"], "try rollout.batch_size=16"),
        (["rollout.group_size=1"], "needs at least 2 samples per task"),
        (["train.minibatches=3"], "train.minibatches (3) must divide rollout.batch_size (64)"),
        (["rollout.max_prompt_tokens=2000"], "exceeds model.max_context (2048)"),
        (["algo.dual_clip=0.5"], "algo.dual_clip: must be > 1"),
        (["model.tiny_hidden=128", "model.tiny_heads=5"], "model.tiny_heads: must divide model.tiny_hidden (128), got 5"),
        (["model.tiny_intermediate=-1"], "model.tiny_intermediate: must be >= 0"),
        (["algo.clip_low=1.2"], "algo.clip_low: must be in [0, 1)"),
        (["algo.loss_agg=mean"], "algo.loss_agg: 'mean' is not one of"),
        (["reward.weights=[1, 2]"], "reward.weights has 2 values for 1 reward.functions"),
        (["model.dtype=fp8"], "model.dtype: 'fp8' is not one of"),
        (["demo.world_style=plian"], "demo.world_style: 'plian' is not one of varied, plain; did you mean 'plain'?"),
        (["demo.world_style=fancy"], "demo.world_style: 'fancy' is not one of varied, plain"),
        (["model.path=./nowhere"], "model.path: './nowhere' is not a model folder"),
        (["model.path=/tmp/missing.gguf"], "model.path: GGUF file '/tmp/missing.gguf' does not exist"),
    ],
)
def test_errors_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  name: [grpo\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(bad)
    deep = tmp_path / "deep.yaml"
    deep.write_text("algo: grpo\n")
    with pytest.raises(ConfigError, match="section 'algo' must be a mapping"):
        load_config(deep)


def test_every_field_has_a_docstring():
    for name, cls in SECTIONS.items():
        docs = field_docs(cls)
        fields = set(cls.__dataclass_fields__)
        assert fields == set(docs), f"{name}: fields without a docstring: {sorted(fields - set(docs))}"
    assert set(SECTIONS) == set(Config.__dataclass_fields__)


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(None, ["algo.name=rloo", "rollout.stop=[x]", "algo.kl_target=0.1", "log.name=r"])
    p = tmp_path / "saved.yaml"
    p.write_text(cfg.to_yaml())
    assert load_config(p).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_validate(path):
    # search examples name an index folder built by `seekrl index build`; validate the rest with a URL
    extra = ["tools.retriever=http://127.0.0.1:8000/retrieve"] if "\ntools:" in path.read_text() else []
    cfg = load_config(path, extra)
    assert cfg.train.steps > 0


def test_model_path_forms(tmp_path):
    assert load_config(None, ["model.path=Qwen/Qwen2.5-1.5B-Instruct"]).model.path.startswith("Qwen/")
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        load_config(None, [f"model.path={tmp_path / 'm'}"])
    (tmp_path / "m" / "config.json").write_text("{}")
    assert load_config(None, [f"model.path={tmp_path / 'm'}"]).model.path == str(tmp_path / "m")


@pytest.mark.parametrize("overrides,needle", [
    (["engine.kind=remote"], "engine.urls"),
    (["engine.kind=remot"], "engine.kind"),
    (["engine.api=trt"], "engine.api"),
    (["engine.urls=[127.0.0.1:30000]"], "http(s) URL"),
    (["engine.urls=[http://a:1]", "engine.servers=2"], "both set"),
    (["engine.servers=-1"], "engine.servers"),
    (["engine.servers=1", "engine.timeout_s=0"], "engine.timeout_s"),
    (["engine.servers=1", "engine.api=vllm", "engine.server_kind=seekrl"], "does not speak"),
    (["engine.servers=1", "engine.api=vllm", "rollout.top_p=0.9"], "top_p"),
    (["engine.servers=1", "engine.weight_sync=nccl"], "engine.weight_sync=nccl"),
    (["engine.servers=1", "engine.token=a", "engine.token_env=B"], "both set"),
])
def test_engine_section_errors_name_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(None, overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_engine_urls_or_servers_imply_remote():
    assert load_config(None, []).engine.kind == "local"
    assert load_config(None, ["engine.servers=2"]).engine.kind == "remote"
    cfg = load_config(None, ["engine.urls=[http://127.0.0.1:30000]"])
    assert cfg.engine.kind == "remote" and cfg.engine.api == "sglang"
    from seekrl.config_checks import server_kind

    assert server_kind(load_config(None, ["engine.servers=1"])) == "seekrl"
    assert server_kind(load_config(None, ["engine.servers=1", "engine.api=vllm"])) == "vllm"
