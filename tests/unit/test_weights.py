"""Weight folders for the engine servers: atomic, versioned, pruned, LoRA deltas added for the copy."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from seekrl.engines.weights import prune_weights, weight_folders, write_weights


def test_a_lora_model_is_written_merged_and_left_unmerged(tiny_texts):
    pytest.importorskip("peft")
    from seekrl.models import load_model

    model, tok = load_model("tiny", tiny_texts=tiny_texts, lora_r=4, seed=0)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    ids = torch.tensor([tok.encode("the quick brown fox", add_special_tokens=False)])
    with torch.no_grad():
        expect = model(ids).logits
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        folder = write_weights(model, root, 3, tokenizer=tok)
        plain = AutoModelForCausalLM.from_pretrained(folder)
        assert not any("lora" in k for k in plain.state_dict())
        with torch.no_grad():
            got = plain(ids).logits
        assert (got - expect).abs().max().item() < 1e-4  # the merged weights are the adapted model
    with torch.no_grad():
        again = model(ids).logits
    assert torch.equal(again, expect)  # the training model is untouched (no merge / unmerge rounding)


def test_folders_are_atomic_versioned_and_pruned(tiny_model, tmp_path):
    for v in (0, 1, 2, 3):
        write_weights(tiny_model, tmp_path, v)
    (tmp_path / ".v9-leftover").mkdir()  # a write that was killed half-way
    (tmp_path / "notes").mkdir()
    assert [v for v, _ in weight_folders(tmp_path)] == [0, 1, 2, 3]  # never the temporary
    prune_weights(tmp_path, keep=2)
    assert [v for v, _ in weight_folders(tmp_path)] == [2, 3]
    assert not (tmp_path / ".v9-leftover").exists() and (tmp_path / "notes").exists()
    write_weights(tiny_model, tmp_path, 3)  # a resumed run re-exports its step: replaced, not an error
    assert (tmp_path / "v3" / "model.safetensors").is_file() and (tmp_path / "v3" / "config.json").is_file()
    prune_weights(tmp_path, keep=1, protect=tmp_path / "v2")
    assert [v for v, _ in weight_folders(tmp_path)] == [2, 3]


def test_weights_for_vllm_are_written_untied(tiny_model, tmp_path):
    """vLLM's layer-wise reload skips a tied LM head; the folder it loads carries an explicit one."""
    import json

    from safetensors import safe_open

    assert tiny_model.config.tie_word_embeddings
    tied = write_weights(tiny_model, tmp_path / "tied", 0)
    untied = write_weights(tiny_model, tmp_path / "untied", 0, untie_embeddings=True)
    assert json.loads((tied / "config.json").read_text())["tie_word_embeddings"] is True
    assert not (tied / "model.safetensors.index.json").exists()
    assert json.loads((untied / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(untied / "model-00002-of-00002.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), tiny_model.model.embed_tokens.weight.detach())
    ids = torch.tensor([[3, 5, 7, 9]])
    for folder in (tied, untied):  # both load in transformers to the same model (the untied one through its index)
        again = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            assert torch.equal(again(ids).logits, tiny_model(ids).logits)
