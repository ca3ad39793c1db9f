"""train/checkpoint.py: exact resume (bitwise), HF-loadable model/, pruning, atomicity, RNG, no pickle."""

from __future__ import annotations

import ast
import json
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from seekrl.train import checkpoint as ckpt_mod
from seekrl.train.checkpoint import (
    CheckpointError,
    find_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    resume_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


def tiny_llama(seed: int, tie: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(config)


def make_opt(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))  # warmup
    return optimizer, scheduler


BATCH = torch.arange(24).reshape(2, 12) % 64


def train_step(model, optimizer, scheduler):
    loss = model(input_ids=BATCH, labels=BATCH).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


class FakeTokenizer:
    def save_pretrained(self, path):
        Path(path, "tokenizer.json").write_text("{}")


def test_round_trip_is_bitwise_exact(tmp_path):
    model = tiny_llama(seed=0)
    optimizer, scheduler = make_opt(model)
    for _ in range(3):
        train_step(model, optimizer, scheduler)
    with torch.no_grad():
        logits_at_save = model(input_ids=BATCH).logits
    state = {"step": 3, "data": {"epoch": 0, "index": 12}, "kl_coef": 0.05}
    path = save_checkpoint(
        tmp_path, 3, model=model, tokenizer=FakeTokenizer(), optimizer=optimizer, scheduler=scheduler, state=state
    )
    assert path == tmp_path / "step_3" and latest_checkpoint(tmp_path) == path
    assert (path / "model" / "tokenizer.json").exists()
    assert "state.0.exp_avg" in json.dumps(json.loads((path / "optimizer.json").read_text()))
    for _ in range(2):  # steps 4 and 5 (5 uses the lr the restored scheduler sets), original run
        train_step(model, optimizer, scheduler)

    fresh = tiny_llama(seed=1)  # different weights until loaded
    fresh_opt, fresh_sched = make_opt(fresh)
    assert not torch.equal(fresh.model.embed_tokens.weight, model.model.embed_tokens.weight)
    loaded_state = load_checkpoint(path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert loaded_state == state
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight  # still tied
    assert fresh_sched.last_epoch == 3 and fresh_sched.get_last_lr() == pytest.approx([4e-3])
    for _ in range(2):  # steps 4 and 5, resumed run
        train_step(fresh, fresh_opt, fresh_sched)
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(a, b), name
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()

    hf = AutoModelForCausalLM.from_pretrained(path / "model")
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=BATCH).logits, logits_at_save)


def test_empty_adamw_state_and_untied_mismatch(tmp_path):
    model = tiny_llama(seed=0)
    optimizer, scheduler = make_opt(model)  # no step yet: optimizer.state is empty
    path = save_checkpoint(tmp_path, 0, model=model, optimizer=optimizer, scheduler=scheduler, state={})
    fresh = tiny_llama(seed=2)
    fresh_opt, fresh_sched = make_opt(fresh)
    assert load_checkpoint(path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched) == {}
    assert len(fresh_opt.state) == 0
    assert fresh_opt.param_groups[0]["betas"] == (0.9, 0.999)  # tuple survives JSON
    # an untied model misses lm_head.weight for real: a clear error, not silent random weights
    with pytest.raises(RuntimeError, match="lm_head.weight"):
        load_checkpoint(path, model=tiny_llama(seed=0, tie=False))
    with pytest.raises(CheckpointError, match="critic.safetensors is missing"):
        load_checkpoint(path, critic=torch.nn.Linear(2, 1))


class TiedCritic(torch.nn.Module):
    """A value model with a tied pair of weights, as a full LM critic has."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.out = torch.nn.Linear(4, 8, bias=False)
        self.out.weight = self.embed.weight
        self.value_head = torch.nn.Linear(4, 1)


def test_critic_and_plain_module_round_trip(tmp_path):
    torch.manual_seed(0)
    policy, critic = torch.nn.Linear(3, 3), TiedCritic()  # plain modules: no save_pretrained
    critic_opt = torch.optim.Adam(critic.parameters(), lr=0.1)
    loss = critic.value_head(critic.embed(torch.tensor([1, 2]))).pow(2).sum()
    loss.backward()
    critic_opt.step()
    path = save_checkpoint(tmp_path, 5, model=policy, critic=critic, critic_optimizer=critic_opt, state={"s": 1})
    torch.manual_seed(1)
    policy2, critic2 = torch.nn.Linear(3, 3), TiedCritic()
    critic_opt2 = torch.optim.Adam(critic2.parameters(), lr=0.1)
    load_checkpoint(path, model=policy2, critic=critic2, critic_optimizer=critic_opt2)
    assert torch.equal(policy.weight, policy2.weight)
    for a, b in zip(critic.state_dict().values(), critic2.state_dict().values()):
        assert torch.equal(a, b)
    assert critic2.out.weight is critic2.embed.weight
    s1, s2 = critic_opt.state_dict(), critic_opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])


def test_keep_last_tmp_and_partial_folders(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 10, 3):
        save_checkpoint(tmp_path, step, model=model, state={"step": step}, keep_last=2)
    # the one just written (the pointer's) and the newest other one by number
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_10", "step_3"]
    assert (tmp_path / "latest").read_text() == "step_3\n"
    assert latest_checkpoint(tmp_path) == tmp_path / "step_3"  # the pointer wins over a higher number
    (tmp_path / "step_20.tmp").mkdir()
    (tmp_path / "step_20.tmp" / "state.json").write_text("{}")  # killed during the rename window
    (tmp_path / "step_30").mkdir()  # no state.json: incomplete
    (tmp_path / "latest").unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_10"  # without a pointer: the highest complete one
    (tmp_path / "latest").write_text("../../etc\n")  # not a step_<N> name: ignored
    assert latest_checkpoint(tmp_path) == tmp_path / "step_10"
    assert latest_checkpoint(tmp_path / "missing") is None
    # saving the same step twice replaces it
    save_checkpoint(tmp_path, 10, model=model, state={"step": "again"})
    assert load_checkpoint(tmp_path / "step_10", restore_rng=False) == {"step": "again"}
    with pytest.raises(ValueError, match="JSON"):
        save_checkpoint(tmp_path, 11, model=model, state={"bad": object()})


def test_rng_restore(tmp_path):
    torch.manual_seed(123)
    random.seed(4)
    np.random.seed(5)
    torch.rand(3), random.random(), np.random.rand()  # advance a little
    path = save_checkpoint(tmp_path, 1, model=torch.nn.Linear(1, 1), state={})
    draws = (torch.rand(5), [random.random() for _ in range(3)], np.random.rand(3), np.random.randn())
    load_checkpoint(path)
    again = (torch.rand(5), [random.random() for _ in range(3)], np.random.rand(3), np.random.randn())
    assert torch.equal(draws[0], again[0])
    assert draws[1] == again[1]
    assert np.array_equal(draws[2], again[2]) and draws[3] == again[3]


@pytest.mark.parametrize("module", ["checkpoint", "checkpoint_tree", "checkpoint_verify"])
def test_checkpoint_never_unpickles(tmp_path, monkeypatch, module):
    import importlib

    source = Path(importlib.import_module(f"seekrl.train.{module}").__file__).read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not any(n.split(".")[0] in {"pickle", "dill", "cloudpickle", "joblib"} for n in names)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            assert node.attr not in {"load", "save"}, f"torch.{node.attr} at line {node.lineno}"

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling during load_checkpoint")

    model = tiny_llama(seed=0)
    optimizer, scheduler = make_opt(model)
    train_step(model, optimizer, scheduler)
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler, state={})
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    fresh = tiny_llama(seed=1)
    load_checkpoint(path, model=fresh, optimizer=make_opt(fresh)[0])
    assert not any(p.suffix in {".bin", ".pt", ".pkl", ".pth"} for p in path.rglob("*"))


def test_peft_adapter_and_merged_model(tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(tiny_llama(seed=0), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at zero; make the adapter change the output
        logits = model(input_ids=BATCH).logits
    path = save_checkpoint(tmp_path, 1, model=model, state={})
    assert (path / "adapter" / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(path / "model")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=BATCH).logits, logits, atol=1e-5, rtol=1e-4)
    # the live model still has its adapter (the merge ran on a copy)
    assert any("lora_A" in n for n, _ in model.named_parameters())

    fresh = peft.get_peft_model(tiny_llama(seed=0), config)  # same base, adapter B = 0
    load_checkpoint(path, model=fresh, restore_rng=False)
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(a, b), name


# --------------------------------------------------------------------------- damaged checkpoints, pointer, kills
def _trained(seed=0):
    model = tiny_llama(seed=seed)
    optimizer, scheduler = make_opt(model)
    train_step(model, optimizer, scheduler)
    return model, optimizer, scheduler


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE = {  # name -> (damage the folder, the reason's start)
    "model truncated": (lambda p: _truncate(p / "model" / "model.safetensors"), "model/model.safetensors is truncated or not safetensors ("),
    "model gone": (lambda p: (p / "model" / "model.safetensors").unlink(), "model/ has no .safetensors weights"),
    "state empty": (lambda p: (p / "state.json").write_text(""), "state.json is not valid JSON (Expecting value"),
    "state without step": (lambda p: (p / "state.json").write_text('{"data": 1}'), "state.json has no integer 'step'"),
    "state gone": (lambda p: (p / "state.json").unlink(), "has no state.json"),
    "optimizer tensors truncated": (lambda p: _truncate(p / "optimizer.safetensors"), "optimizer.safetensors is truncated or not safetensors"),
    "optimizer tensors gone": (lambda p: (p / "optimizer.safetensors").unlink(), "optimizer.safetensors is missing (optimizer.json refers to"),
    "optimizer tensors of another run": (
        lambda p: ckpt_mod.save_file({"x": torch.zeros(1)}, str(p / "optimizer.safetensors")), "optimizer.safetensors lacks"),
    "optimizer json garbage": (lambda p: (p / "optimizer.json").write_text("{not json"), "optimizer.json is not valid JSON"),
    "scheduler gone": (lambda p: (p / "scheduler.json").unlink(), "scheduler.json is missing"),
    "rng gone": (lambda p: (p / "rng.safetensors").unlink(), "rng.safetensors is missing"),
    "model config garbage": (lambda p: (p / "model" / "config.json").write_bytes(b"\x00\x01"), "model/config.json is not valid JSON"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_found_before_anything_loads(tmp_path, damage):
    model, optimizer, scheduler = _trained()
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler, state={"step": 1})
    assert verify_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, require_step=True) == {"step": 1}
    hurt, reason = DAMAGE[damage]
    hurt(path)
    fresh = tiny_llama(seed=1)
    fresh_opt, fresh_sched = make_opt(fresh)
    before = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, require_step=True)
    assert e.value.reason.startswith(reason) and str(e.value) == f"checkpoint {path}: {e.value.reason}"
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match=r"^train.resume: .*; give a checkpoint folder"):  # what resume calls
        find_checkpoint(str(path), tmp_path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    if damage != "state without step":  # load_checkpoint takes any state; resuming needs a step
        with pytest.raises(CheckpointError):
            load_checkpoint(path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters()))  # nothing was loaded


def test_auto_skips_damaged_checkpoints_with_one_warning_each(tmp_path, capsys):
    model, optimizer, scheduler = _trained()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, optimizer=optimizer, scheduler=scheduler, state={"step": step})
    parts = dict(model=model, optimizer=optimizer, scheduler=scheduler)
    assert find_checkpoint("auto", tmp_path, **parts) == tmp_path / "step_3"
    _truncate(tmp_path / "step_3" / "model" / "model.safetensors")
    (tmp_path / "step_2" / "state.json").write_text("")
    capsys.readouterr()  # transformers' save progress bars
    assert find_checkpoint("auto", tmp_path, **parts) == tmp_path / "step_1"
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"seekrl: warning: skipping checkpoint {tmp_path / 'step_3'}: model/model.safetensors is truncated or not safetensors "
        "(Error while deserializing header: incomplete metadata, file not fully covered)",
        f"seekrl: warning: skipping checkpoint {tmp_path / 'step_2'}: state.json is not valid JSON "
        "(Expecting value: line 1 column 1 (char 0))",
    ]
    # resume_checkpoint loads the intact one
    fresh = tiny_llama(seed=1)
    path, state = resume_checkpoint("auto", tmp_path, model=fresh, optimizer=make_opt(fresh)[0], warn=lambda m: None)
    assert (path, state) == (tmp_path / "step_1", {"step": 1})
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    # none intact: one error line naming the folder and the fix
    (tmp_path / "step_1" / "rng.json").write_text("[")
    with pytest.raises(CheckpointError) as e:
        find_checkpoint("auto", tmp_path, warn=lambda m: None, **parts)
    assert str(e.value) == (f"train.resume=auto: none of the 3 checkpoints in {tmp_path} is intact (warnings above); "
                            "move them away to start over, or set train.resume to a checkpoint folder")


def test_pointer_is_preferred_and_pruning_keeps_it(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (5, 6):
        save_checkpoint(tmp_path, step, model=model, state={"step": step}, keep_last=2)
    # a run resumed from an older checkpoint saves step 3: keep_last never deletes it, the pointer names it
    save_checkpoint(tmp_path, 3, model=model, state={"step": 3}, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_3", "step_6"]
    assert find_checkpoint("auto", tmp_path, model=model) == tmp_path / "step_3"
    # a pointer to a damaged checkpoint: the newest intact one, with one warning
    (tmp_path / "step_3" / "model" / "model.safetensors").write_bytes(b"")
    warnings = []
    assert find_checkpoint("auto", tmp_path, model=model, warn=warnings.append) == tmp_path / "step_6"
    assert warnings == [f"skipping checkpoint {tmp_path / 'step_3'}: model/model.safetensors is truncated or not safetensors "
                        "(Error while deserializing header: header too small)"]
    # a pointer to a folder that is gone
    shutil.rmtree(tmp_path / "step_3")
    warnings.clear()
    assert find_checkpoint("auto", tmp_path, model=model, warn=warnings.append) == tmp_path / "step_6"
    assert warnings == [f"{tmp_path / 'latest'} names step_3, which does not exist; using the newest intact checkpoint"]
    # no step_<N> folder at all (a save killed before its first rename): a fresh run
    empty = tmp_path / "empty"
    (empty / "step_1.tmp").mkdir(parents=True)
    assert find_checkpoint("auto", empty) is None and find_checkpoint("never", tmp_path) is None


def test_explicit_resume_paths_and_kinds(tmp_path):
    model = torch.nn.Linear(2, 2)
    sft = save_checkpoint(tmp_path / "sft", 4, model=model, state={"step": 4, "kind": "sft"})
    with pytest.raises(CheckpointError) as e:
        find_checkpoint("/nonexistent/step_3", tmp_path, model=model)
    assert str(e.value) == ("train.resume: '/nonexistent/step_3' does not exist; give a checkpoint folder "
                            "(runs/<name>/checkpoints/step_<N>), auto or never")
    (sft / "rng.safetensors").write_bytes(b"12345678")
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(str(sft), tmp_path, model=model, kind="sft")
    assert str(e.value).startswith(f"train.resume: '{sft}' is not an intact checkpoint: rng.safetensors is truncated or not safetensors")
    save_checkpoint(tmp_path / "sft", 4, model=model, state={"step": 4, "kind": "sft"})  # whole again
    assert find_checkpoint(str(sft), tmp_path, model=model, kind="sft") == sft
    with pytest.raises(CheckpointError) as e:  # an SFT checkpoint given to `seekrl train`
        find_checkpoint(str(sft), tmp_path, model=model, kind="rl")
    assert str(e.value) == (f"train.resume: '{sft}' is a checkpoint of seekrl sft, not of seekrl train; "
                            f"to start from its weights, set model.path={sft / 'model'}")
    with pytest.raises(CheckpointError, match="train.resume=auto: .* is a checkpoint of seekrl sft"):
        find_checkpoint("auto", tmp_path / "sft", model=model, kind="rl")
    # weights of another model: one line, not load_state_dict's multi-line report
    with pytest.raises(CheckpointError) as e:
        resume_checkpoint(str(sft), tmp_path, model=torch.nn.Linear(3, 3), kind="sft")
    assert str(e.value).startswith(f"train.resume: {sft} does not fit this run (") and "\n" not in str(e.value)


KILLER = r"""
import os, shutil, signal, sys
import torch
from seekrl.train import checkpoint as ck
from seekrl.train import checkpoint_tree as tree

root, where = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)

def die():
    os.kill(os.getpid(), signal.SIGKILL)

real_save_file, real_write_latest, real_rmtree = tree.save_file, ck._write_latest, shutil.rmtree

def save_file(tensors, filename, *args, **kwargs):  # the kill lands in the middle of writing a file
    real_save_file(tensors, filename, *args, **kwargs)
    if where == "optimizer" and filename.endswith("step_3.tmp/optimizer.safetensors"):
        os.truncate(filename, os.path.getsize(filename) // 2)
        die()

def write_latest(root_, name):  # the folder is renamed, the pointer not yet replaced
    if where == "pointer" and name == "step_3":
        (root_ / "latest.tmp").write_text("step_")
        die()
    real_write_latest(root_, name)

def rmtree(path, *args, **kwargs):  # pruning step_1 after step_3 was saved: half of its files deleted
    if where == "prune" and str(path).endswith("step_1.old"):
        files = sorted(p for p in ck.Path(path).rglob("*") if p.is_file())
        for f in files[: len(files) // 2]:
            f.unlink()
        die()
    real_rmtree(path, *args, **kwargs)

tree.save_file, ck._write_latest, ck.shutil.rmtree = save_file, write_latest, rmtree
for step in range(1, 6):
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    ck.save_checkpoint(root, step, model=model, optimizer=optimizer, state={"step": step}, keep_last=2)
"""


@pytest.mark.parametrize("where, expected", [("optimizer", "step_2"), ("pointer", "step_2"), ("prune", "step_3")])
def test_killed_while_saving_leaves_an_intact_checkpoint(tmp_path, where, expected):
    import subprocess
    import sys

    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    root = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(root), where], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr  # SIGKILL, from inside the save
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    warnings = []
    path, state = resume_checkpoint("auto", root, model=model, optimizer=optimizer, warn=warnings.append)
    assert path == root / expected and state == {"step": int(expected[5:])} and warnings == []
    assert all(p.isfinite().all() for p in model.parameters()) and optimizer.state
    # the next save clears what the kill left (.tmp, .old, latest.tmp) and moves the pointer
    save_checkpoint(root, int(expected[5:]) + 1, model=model, optimizer=optimizer, state={"step": 0}, keep_last=2)
    assert not [p.name for p in root.iterdir() if p.suffix in (".tmp", ".old") and p.is_dir()]
    assert (root / "latest").read_text() == f"step_{int(expected[5:]) + 1}\n"


def test_model_folder_is_a_checkpoints_model_folder_and_leaves_other_paths_alone(tmp_path):
    from seekrl.train.checkpoint import model_folder

    step = tmp_path / "checkpoints" / "step_4"
    (step / "model").mkdir(parents=True)
    (step / "model" / "config.json").write_text("{}")
    assert model_folder(step) == step / "model"          # the checkpoint folder means its weights
    assert model_folder(step / "model") == step / "model"
    (step / "config.json").write_text("{}")              # a folder that is a model itself stays as it is
    assert model_folder(step) == step
    assert model_folder(tmp_path / "missing") == tmp_path / "missing"
