"""`seekrl average`: checkpoint averaging (seekrl/train/average.py)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from seekrl.cli import main
from seekrl.errors import ConfigError
from seekrl.train.average import average_models, average_sources
from seekrl.train.checkpoint import save_checkpoint


def _shifted(model, delta: float):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(delta)
    return m


def _save(model, tokenizer, folder):
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def test_mean_of_two_models_is_exact_and_loads(tmp_path, tiny_model, tiny_tokenizer):
    a = _save(tiny_model, tiny_tokenizer, tmp_path / "a")
    b = _save(_shifted(tiny_model, 1.0), tiny_tokenizer, tmp_path / "b")
    record = average_models([a, b], tmp_path / "avg")
    wa, wb, avg = (load_file(str(f / "model.safetensors")) for f in (a, b, tmp_path / "avg"))
    assert set(avg) == set(wa) and record["tensors"] == len(wa)
    for k in wa:
        assert avg[k].dtype == wa[k].dtype
        torch.testing.assert_close(avg[k], (wa[k] + wb[k]) / 2)
    assert not torch.equal(avg[next(iter(wa))], wa[next(iter(wa))])
    # the folder is a whole model folder: the tokenizer and config came along, and it loads
    assert (tmp_path / "avg" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "avg" / "average.json").read_text())["weights"] == [0.5, 0.5]
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "avg"))
    ref = dict(tiny_model.named_parameters())
    for name, p in loaded.named_parameters():
        torch.testing.assert_close(p.detach(), ref[name].detach() + 0.5)
    assert not (tmp_path / "avg.tmp").exists()


def test_weights_are_normalised_and_dtype_kept(tmp_path, tiny_model, tiny_tokenizer):
    half = copy.deepcopy(tiny_model).to(torch.bfloat16)
    a = _save(half, tiny_tokenizer, tmp_path / "a")
    b = _save(_shifted(half, 4.0), tiny_tokenizer, tmp_path / "b")
    average_models([a, b], tmp_path / "avg", weights=[3, 1])
    wa, wb, avg = (load_file(str(f / "model.safetensors")) for f in (a, b, tmp_path / "avg"))
    for k in wa:
        assert avg[k].dtype == torch.bfloat16
        expect = (0.75 * wa[k].float() + 0.25 * wb[k].float()).to(torch.bfloat16)
        torch.testing.assert_close(avg[k], expect)


def test_last_k_checkpoints_of_a_run(tmp_path, tiny_model, tiny_tokenizer):
    root = tmp_path / "run" / "checkpoints"
    for step, delta in ((1, 0.0), (2, 1.0), (3, 3.0)):
        save_checkpoint(root, step, model=_shifted(tiny_model, delta), tokenizer=tiny_tokenizer, state={})
    folders = average_sources([tmp_path / "run"], last=2)
    assert folders == [root / "step_2" / "model", root / "step_3" / "model"]
    assert main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path / "avg")]) == 0
    avg = load_file(str(tmp_path / "avg" / "model.safetensors"))
    w1 = load_file(str(root / "step_1" / "model" / "model.safetensors"))
    for k in w1:
        torch.testing.assert_close(avg[k], w1[k] + 2.0)
    # checkpoint folders given by hand resolve to their model/
    assert average_sources([root / "step_1", root / "step_3" / "model"]) == [root / "step_1" / "model", root / "step_3" / "model"]


def test_bad_arguments_are_one_line_errors(tmp_path, tiny_model, tiny_tokenizer, capsys):
    a = _save(tiny_model, tiny_tokenizer, tmp_path / "a")
    b = _save(_shifted(tiny_model, 1.0), tiny_tokenizer, tmp_path / "b")
    with pytest.raises(ConfigError, match="at least two"):
        average_sources([a])
    with pytest.raises(ConfigError, match="fewer than --last 3"):
        save_checkpoint(tmp_path / "r" / "checkpoints", 1, model=tiny_model, state={})
        average_sources([tmp_path / "r"], last=3)
    with pytest.raises(ConfigError, match="neither a model folder"):
        average_sources([a, tmp_path])
    with pytest.raises(ConfigError, match="2 weight"):
        average_models([a, b, a], tmp_path / "o", weights=[1, 1])
    with pytest.raises(ConfigError, match="positive sum"):
        average_models([a, b], tmp_path / "o", weights=[0, 0])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not an empty folder"):
        average_models([a, b], tmp_path / "full")
    with pytest.raises(ConfigError, match="not an empty folder"):
        average_models([a, b], tmp_path / "full" / "x")
    # another architecture: a config key differs
    other = tmp_path / "other"
    _save(tiny_model, tiny_tokenizer, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match='"num_hidden_layers"'):
        average_models([a, other], tmp_path / "o")
    # a tensor of another shape, config alike
    bent = _save(tiny_model, tiny_tokenizer, tmp_path / "bent")
    w = load_file(str(bent / "model.safetensors"))
    key = sorted(w)[0]
    w[key] = torch.zeros(3)
    save_file(w, str(bent / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=f"tensor '{key}'"):
        average_models([a, bent], tmp_path / "o")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()
    # the command: exit 2 and one line
    capsys.readouterr()
    assert main(["average", str(a), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("seekrl: error: seekrl average: needs at least two") and "\n" not in err
