"""Config: YAML + overrides, types, cross-field validation, field docs, the examples."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from seekrl.config import SECTIONS, Config, ConfigError, field_docs, load_config, parse_override, reference_markdown

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
    assert parse_override("algo.teacher.path=d") == ("algo", "teacher.path", "d")
    for bad in ("steps=5", "a.b.c.d=1", ".x=1", "algo..path=1"):
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
        (["algo.clip_low=1.2"], "algo.clip_low: must be in [0, 1]"),
        (["algo.clip_low=1"], "algo.clip_low=1.0 must be below 1 for algo.policy_loss=ppo"),
        (["algo.policy_loss=gpso"], "algo.policy_loss: 'gpso' is not one of ppo, gspo, gspo_token, cispo; did you mean 'gspo'?"),
        (["algo.policy_loss=gspo", "algo.dual_clip=3"], "algo.policy_loss=gspo has none: drop algo.dual_clip"),
        (["algo.name=distill"], "algo.name=distill needs a teacher: set algo.teacher.path=DIR"),
        (["algo.teacher.path=tiny"], "algo.teacher is set but algo.name=grpo with algo.distill_coef=0 never asks it"),
        (["algo.name=distill", "algo.teacher.path=tiny", "algo.teacher.url=http://127.0.0.1:1"], "keep one"),
        (["algo.teacher.pth=x"], "unknown key 'algo.teacher.pth'; did you mean 'algo.teacher.path'?"),
        (["algo.name.path=x"], "unknown key 'algo.name.path'"),
        (["algo.teacher=3"], "algo.teacher: expected a mapping of key: value"),
        (["algo.teacher.api=sglang", "algo.name=distill", "algo.teacher.url=http://127.0.0.1:1"], "algo.teacher.api: 'sglang' is not one of seekrl, vllm"),
        (["algo.loss_agg=mean"], "algo.loss_agg: 'mean' is not one of"),
        (["reward.weights=[1, 2]"], "reward.weights has 2 values for 1 reward.functions"),
        (["model.dtype=fp8"], "model.dtype: 'fp8' is not one of"),
        (["demo.world_style=plian"], "demo.world_style: 'plian' is not one of varied, plain; did you mean 'plain'?"),
        (["demo.world_style=fancy"], "demo.world_style: 'fancy' is not one of varied, plain"),
        (["model.path=./nowhere"], "model.path: './nowhere' is not a model folder"),
        (["model.path=/tmp/missing.gguf"], "model.path: GGUF file '/tmp/missing.gguf' does not exist"),
        (["train.save_every=-1"], "train.save_every: must be >= 0"),
        (["train.seed=1000000000000000000000000000000"], "train.seed: must be in 0..4294967295"),
        (["train.seed=-1"], "train.seed: must be in 0..4294967295"),
        (["log.name=../../.."], "log.name: '../../..' would put the run folder outside log.dir"),
        (["log.name=/tmp/x"], "log.name: '/tmp/x' would put the run folder outside log.dir"),
        (["log.name=a/../../b"], "outside log.dir"),
        (["log.name=."], "outside log.dir ('runs') or on it"),
        (["data.train=tiny:copy[5:2]"], "data.train: 'tiny:copy[5:2]' selects no rows (tiny:copy has 512 rows); rows start..stop-1 are taken, e.g. tiny:copy[2:5]"),
        (["data.train=tiny:copy[600:]"], "selects no rows (tiny:copy has 512 rows)"),
        (["data.eval=x.jsonl[-1:-3]"], "data.eval: 'x.jsonl[-1:-3]' selects no rows (empty whatever the source holds)"),
        (["data.train=y.jsonl[:0]"], "selects no rows"),
        (["data.train=tiny:copy[a:b]"], "data.train: 'tiny:copy[a:b]' ends in a slice that is not [start:stop] with integers"),
        (["data.train=gsm8k,tiny:copy[::2]"], "'tiny:copy[::2]' ends in a slice that is not [start:stop]"),
        (["data.train=tiny:cpy"], "unknown tiny task 'cpy' in 'tiny:cpy'; choose one of tiny:copy, tiny:add; did you mean 'tiny:copy'?"),
        (["data.train=''"], "data.train is empty"),
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
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"log:\n  name: caf\xe9\n")
    with pytest.raises(ConfigError, match="latin1.yaml: not valid UTF-8"):
        load_config(latin1)


def test_duplicate_yaml_keys_are_refused(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("train:\n  steps: 5\n  lr: 1.0e-3\n  steps: 7\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == f"{p}:4: duplicate key 'train.steps' (first at line 2); keep one of them"
    p.write_text("algo:\n  name: ppo\ntrain:\n  steps: 5\nalgo:\n  kl_coef: 0.1\n")
    with pytest.raises(ConfigError, match=r"dup.yaml:5: duplicate key 'algo' \(first at line 1\)"):
        load_config(p)
    # the same key in two sections is not a duplicate
    p.write_text("train:\n  steps: 4\n  seed: 1\neval:\n  every: 2\n  n: 1\ngenerate:\n  n: 3\n")
    cfg = load_config(p)
    assert (cfg.eval.n, cfg.generate.n, cfg.train.seed) == (1, 3, 1)


def test_yaml_merge_keys_still_work():
    import yaml

    from seekrl.yaml_keys import UniqueKeyLoader as _UniqueKeyLoader

    text = "a: &x {k: 1, j: 2}\nb:\n  <<: *x\n  k: 3\n"
    assert yaml.load(text, Loader=_UniqueKeyLoader) == yaml.safe_load(text) == {"a": {"k": 1, "j": 2}, "b": {"k": 3, "j": 2}}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'b.k' at line 5"):
        yaml.load(text + "  k: 4\n", Loader=_UniqueKeyLoader)


def _safetensors(path: Path, tensors: dict) -> None:
    from safetensors.numpy import save_file

    save_file(tensors, str(path))


def test_model_folder_checks(tmp_path):
    import numpy as np

    from seekrl.models import check_model_folder

    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text('{"model_type": "llama"}')
    _safetensors(m / "model.safetensors", {"w": np.zeros((4, 4), np.float32), "b": np.ones(3, np.float32)})
    check_model_folder(m)  # whole

    def error() -> str:
        with pytest.raises(ConfigError) as e:
            check_model_folder(m)
        assert "\n" not in str(e.value)
        return str(e.value)

    (m / "config.json").write_text('{"model_type": ')
    assert error().startswith(f"model.path: {m / 'config.json'} is not valid JSON (Expecting value at line 1 column 16)")
    (m / "config.json").write_text('{"hidden_size": 8}')
    assert f"{m / 'config.json'} has no \"model_type\"" in error()
    (m / "config.json").write_text('{"model_type": "llama"}')
    data = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(data[:-10])
    assert error() == (f"model.path: {m / 'model.safetensors'} is truncated: {len(data) - 10} bytes, its header needs {len(data)}; "
                       "the file is damaged (an interrupted copy or save?): copy or save it again")
    (m / "model.safetensors").write_bytes(data + b"xx")
    assert "has 2 bytes past the end of its last tensor" in error()
    (m / "model.safetensors").write_bytes(data[:5])
    assert "is 5 bytes, too short for a safetensors file" in error()
    (m / "model.safetensors").write_bytes(b"this is not a safetensors file at all")
    assert "is truncated or not a safetensors file: its header length says" in error()
    (m / "model.safetensors").write_bytes((8).to_bytes(8, "little") + b"{nojson}")
    assert "has a header that is not valid JSON" in error()
    (m / "model.safetensors").write_bytes(data)
    (m / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model.safetensors", "x": "model-2.safetensors"}}')
    assert "lists 1 shard(s) that are missing, first 'model-2.safetensors'" in error()
    (m / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model.safetensors"}}')
    check_model_folder(m)
    # the safetensors library agrees with the header check
    from safetensors import safe_open

    with safe_open(str(m / "model.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == ["b", "w"]
    (m / "model.safetensors").write_bytes(data[:-10])
    with pytest.raises(Exception):
        with safe_open(str(m / "model.safetensors"), framework="numpy") as f:
            f.get_tensor("w")


def test_every_field_has_a_docstring():
    for name, cls in SECTIONS.items():
        docs = field_docs(cls)
        fields = set(cls.__dataclass_fields__)
        top = {k.split(".")[0] for k in docs}  # a subsection's keys are listed as sub.key
        assert fields == top, f"{name}: fields without a docstring: {sorted(fields - top)}"
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
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama"}')
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
    from seekrl.engines.config import server_kind

    assert server_kind(load_config(None, ["engine.servers=1"]).engine) == "seekrl"
    assert server_kind(load_config(None, ["engine.servers=1", "engine.api=vllm"]).engine) == "vllm"
    vllm = load_config(None, ["engine.servers=1", "engine.server_kind=vllm"]).engine  # the README's command: api follows
    assert vllm.api == "vllm" and server_kind(vllm) == "vllm"


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=inf", "train.lr: must be a finite number >= 0 (e.g. 1e-6 for a real model, 1e-3 for the tiny one; 0 freezes it), got inf"),
        ("train.lr=nan", "train.lr: must be a finite number >= 0"),
        ("train.lr=.nan", "got nan"),
        ("train.lr=-1", "train.lr: must be a finite number >= 0 (e.g. 1e-6 for a real model, 1e-3 for the tiny one; 0 freezes it), got -1.0"),
        ("train.critic_lr=-1e-5", "train.critic_lr: must be a finite number >= 0"),
        ("train.weight_decay=-0.1", "train.weight_decay: must be a finite number >= 0"),
        ("train.min_lr_ratio=1.5", "train.min_lr_ratio: must be in [0, 1]"),
        ("train.max_grad_norm=0", "train.max_grad_norm: must be a finite number > 0 (e.g. 1.0; 1e6 clips nothing), got 0.0"),
        ("train.max_grad_norm=inf", "train.max_grad_norm: must be a finite number > 0"),
        ("model.lora_dropout=1", "model.lora_dropout: must be in [0, 1)"),
        ("algo.clip_high=-0.1", "algo.clip_high: must be a finite number >= 0"),
        ("algo.kl_coef=nan", "algo.kl_coef: must be a finite number >= 0"),
        ("algo.kl_target=0", "algo.kl_target: must be a finite number > 0 (e.g. 0.01) or null"),
        ("algo.value_clip=-1", "algo.value_clip: must be a finite number > 0"),
        ("algo.entropy_coef=inf", "algo.entropy_coef: must be a finite number, got inf"),
        ("algo.dual_clip=.inf", "algo.dual_clip: must be a finite number or null, got inf"),
        ("algo.gamma=nan", "algo.gamma: must be a finite number, got nan"),
        ("rollout.temperature=-1", "rollout.temperature: must be a finite number >= 0 (0: greedy)"),
        ("rollout.top_p=nan", "rollout.top_p: must be a finite number"),
        ("eval.temperature=inf", "eval.temperature: must be a finite number >= 0"),
        ("tools.timeout_s=0", "tools.timeout_s: must be a finite number > 0 (seconds), got 0.0"),
        ("engine.timeout_s=inf", "engine.timeout_s: must be a finite number > 0 (seconds)"),
        ("engine.startup_timeout_s=-5", "engine.startup_timeout_s: must be a finite number > 0"),
        ("generate.timeout_s=nan", "generate.timeout_s: must be a finite number > 0"),
        ("generate.temperature=-0.5", "generate.temperature: must be a finite number >= 0"),
        ("generate.min_reward=-.inf", "generate.min_reward: must be a finite number or null, got -inf"),
        ("generate.teacher_give_up=nan", "generate.teacher_give_up: must be a finite number"),
        ("demo.pretrain_lr=inf", "demo.pretrain_lr: must be a finite number >= 0"),
        ("demo.sft_lr=-2e-3", "demo.sft_lr: must be a finite number >= 0"),
        ("reward.repetition_max_penalty=0.5", "reward.repetition_max_penalty: must be a finite number <= 0"),
        ("reward.weights=[.nan]", "reward.weights[0]: must be a finite number, got nan"),
        ("train.max_nonfinite=-1", "train.max_nonfinite: must be >= 0"),
    ],
)
def test_float_keys_must_be_finite_and_in_range(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_float_key_refuses_nan_and_inf():
    import typing

    def floats(hint) -> bool:  # float, float | None, list[float] (a Literal of strings is no number)
        return hint is float or any(floats(a) for a in typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal)

    for section, cls in SECTIONS.items():
        for key, hint in typing.get_type_hints(cls).items():
            if not floats(hint):
                continue
            for bad in (".nan", ".inf", "-.inf"):
                value = f"[{bad}]" if typing.get_origin(hint) is list else bad
                with pytest.raises(ConfigError, match=rf"^{section}\.{key}(\[0\])?: must be "):
                    load_config(None, [f"{section}.{key}={value}"])
    cfg = load_config(None, ["train.lr=0", "train.max_nonfinite=0", "algo.kl_target=0.01", "generate.min_reward=-1"])
    assert cfg.train.lr == 0.0 and cfg.train.max_nonfinite == 0


def test_each_objective_brings_its_clip_range_and_aggregation():
    c = load_config(None, [])
    assert (c.algo.policy_loss, c.algo.clip_low, c.algo.clip_high, c.algo.loss_agg) == ("ppo", 0.2, 0.2, "token-mean")
    c = load_config(None, ["algo.policy_loss=gspo"])
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    c = load_config(None, ["algo.policy_loss=cispo"])
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.loss_agg) == (1.0, 5.0, "token-mean")
    c = load_config(None, ["algo.policy_loss=gspo_token", "algo.clip_high=1e-3", "algo.loss_agg=token-mean"])
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.loss_agg) == (3e-4, 1e-3, "token-mean")  # what is set stays
    assert load_config(None, []).algo.distill_coef == 0.0


def test_subsection_keys_from_yaml_and_the_command_line(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text("algo:\n  name: distill\n  teacher:\n    path: tiny\n    timeout_s: 5\n")
    c = load_config(p, ["algo.teacher.api=vllm"])
    assert (c.algo.teacher.path, c.algo.teacher.timeout_s, c.algo.teacher.api, c.algo.distill_coef) == ("tiny", 5.0, "vllm", 1.0)
    saved = tmp_path / "saved.yaml"
    saved.write_text(c.to_yaml())
    assert load_config(saved).to_dict() == c.to_dict()
    with pytest.raises(ConfigError, match=r"^algo\.teacher\.timeout_s: must be > 0 seconds, got -1"):
        load_config(p, ["algo.teacher.timeout_s=-1"])
    with pytest.raises(ConfigError, match=r"^algo\.teacher\.timeout_s: must be "):
        load_config(p, ["algo.teacher.timeout_s=.nan"])
    assert "| `algo.teacher.path` | `null` |" in reference_markdown()


@dataclasses.dataclass
class _ListsSection:
    kinds: list[typing.Literal["alpha", "beta"]] = dataclasses.field(default_factory=list)
    maybe: list[typing.Literal["x", "y"]] | None = None
    names: list[str] = dataclasses.field(default_factory=list)


def test_each_item_of_a_list_of_literals_is_checked():
    """schema.check_fields: a `list[Literal[...]]` field (also `| None`) gets each item checked
    against the choices, with its index and a did-you-mean; a plain list of strings is not."""
    from seekrl.schema import check_fields, item_choices, section_hints

    hints = section_hints(_ListsSection)
    assert item_choices(hints["names"]) is None and item_choices(hints["maybe"]) == ("x", "y")
    Section = _ListsSection
    check_fields("s", Section(kinds=["alpha", "beta"], maybe=None, names=["anything"]))
    with pytest.raises(ConfigError, match=r"^s.kinds\[1\]: 'alpah' is not one of alpha, beta; did you mean 'alpha'\?$"):
        check_fields("s", Section(kinds=["beta", "alpah"]))
    with pytest.raises(ConfigError, match=r"^s.maybe\[0\]: 'z' is not one of x, y$"):
        check_fields("s", Section(maybe=["z"]))
