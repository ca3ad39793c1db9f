"""seekrl.models: tiny tokenizer and model, loading, chat encoding, and the PPO critic."""

from __future__ import annotations

import copy

import pytest
import torch

from seekrl.models import (
    CHATML_TEMPLATE,
    ValueModel,
    encode_chat,
    ensure_chat_template,
    load_model,
    make_tiny_model,
    make_value_model,
    save_tiny,
    train_tiny_tokenizer,
)

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 12 + 30?"},
]


# ------------------------------------------------------------------------------ tokenizer


@pytest.mark.parametrize(
    "text",
    [
        "the quick brown fox",
        "  two leading spaces and   three inside",
        "new\nlines\n\nand\ttabs\t",
        "<search> capital of France </search>",
        "trailing space ",
        "Q: 12+30=? A: 42.",
        "spaces before punctuation , . ? ! 's n't",
    ],
)
def test_tiny_tokenizer_round_trips_exactly(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.unk_token_id not in ids


def test_tiny_tokenizer_vocab_is_small_and_unseen_chars_are_unk(tiny_tokenizer):
    assert len(tiny_tokenizer) <= 128
    ids = tiny_tokenizer.encode("caf\u00e9 \u4e2d", add_special_tokens=False)
    assert tiny_tokenizer.unk_token_id in ids


def test_tiny_tokenizer_special_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|pad|>"
    assert tok.pad_token_id != tok.eos_token_id
    for special in ("<|im_start|>", "<|im_end|>", "<|pad|>"):
        ids = tok.encode(special, add_special_tokens=False)
        assert ids == [tok.convert_tokens_to_ids(special)]
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)


def test_tiny_tokenizer_is_deterministic(tiny_texts, tiny_tokenizer):
    again = train_tiny_tokenizer(tiny_texts, vocab_size=128)
    assert again.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()
    other = train_tiny_tokenizer(tiny_texts[:2] + ["zzzz zzzz zzzz zzzz"], vocab_size=128)
    assert other.backend_tokenizer.to_str() != tiny_tokenizer.backend_tokenizer.to_str()


def test_chat_template_renders_chatml(tiny_tokenizer):
    ids = encode_chat(tiny_tokenizer, MESSAGES, add_generation_prompt=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    expected = (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tiny_tokenizer.decode(ids) == expected
    no_gen = encode_chat(tiny_tokenizer, MESSAGES, add_generation_prompt=False)
    assert tiny_tokenizer.decode(no_gen) == expected[: -len("<|im_start|>assistant\n")]
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_encode_chat_without_template_explains_the_fix(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    with pytest.raises(ValueError, match="ensure_chat_template"):
        encode_chat(tok, MESSAGES)
    ensure_chat_template(tok)
    assert tok.chat_template == CHATML_TEMPLATE
    assert encode_chat(tok, MESSAGES) == encode_chat(tiny_tokenizer, MESSAGES)


# ------------------------------------------------------------------------------ tiny model


def test_tiny_model_init_is_seeded_and_leaves_global_rng_alone(tiny_tokenizer, tiny_model):
    state = torch.random.get_rng_state()
    same = make_tiny_model(tiny_tokenizer, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, a), b in zip(tiny_model.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), name
    other = make_tiny_model(tiny_tokenizer, seed=1)
    assert not torch.equal(other.model.embed_tokens.weight, tiny_model.model.embed_tokens.weight)


def test_tiny_model_config(tiny_tokenizer, tiny_model):
    cfg = tiny_model.config
    assert cfg.vocab_size == len(tiny_tokenizer)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert cfg.eos_token_id == tiny_tokenizer.eos_token_id
    assert cfg.pad_token_id == tiny_tokenizer.pad_token_id
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())
    logits = tiny_model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 3, len(tiny_tokenizer))


def test_save_tiny_and_load_model_round_trip(tmp_path, tiny_tokenizer, tiny_model):
    save_tiny(tiny_model, tiny_tokenizer, tmp_path / "m")
    model, tok = load_model(str(tmp_path / "m"))
    assert encode_chat(tok, MESSAGES) == encode_chat(tiny_tokenizer, MESSAGES)
    assert tok.eos_token_id == tiny_tokenizer.eos_token_id and tok.pad_token_id == tiny_tokenizer.pad_token_id
    ids = torch.tensor([encode_chat(tok, MESSAGES)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, tiny_model(ids).logits, rtol=0, atol=0)


def test_load_model_tiny(tiny_texts, tiny_tokenizer, tiny_model):
    model, tok = load_model("tiny", tiny_texts=tiny_texts, tiny_hidden=64, tiny_layers=2, tiny_vocab=128, seed=0)
    assert tok.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()
    assert torch.equal(model.lm_head.weight, tiny_model.lm_head.weight)
    half, _ = load_model("tiny", tiny_texts=tiny_texts, dtype="bfloat16")
    assert next(half.parameters()).dtype == torch.bfloat16
    shaped, _ = load_model("tiny", tiny_texts=tiny_texts, tiny_hidden=64, tiny_heads=8, tiny_intermediate=96)
    assert (shaped.config.num_attention_heads, shaped.config.num_key_value_heads, shaped.config.intermediate_size) == (8, 8, 96)
    assert shaped.model.layers[0].mlp.up_proj.weight.shape == (96, 64) and model.config.intermediate_size == 256


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(path="tiny"), "tiny_texts"),
        (dict(path="/no/such/folder"), "is not a folder with config.json, a .gguf file, 'tiny' or 'smollm2'"),
        (dict(path="/no/such/model.gguf"), "does not exist"),
        (dict(path="tiny", tiny_texts=["ab"], dtype="float64"), "model.dtype"),
    ],
)
def test_load_model_errors_name_the_problem(kwargs, message):
    path = kwargs.pop("path")
    with pytest.raises(ValueError, match=message):
        load_model(path, **kwargs)


def test_load_model_lora_and_gradient_checkpointing(tiny_texts):
    pytest.importorskip("peft")
    model, tok = load_model("tiny", tiny_texts=tiny_texts, lora_r=4, lora_alpha=8, gradient_checkpointing=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert model.config.use_cache is False
    model.train()
    ids = torch.tensor([encode_chat(tok, MESSAGES)])
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_B" in n)
    # The engine's path: eval mode, an explicit cache, use_cache=True.
    from transformers import DynamicCache

    model.eval()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    assert out.logits.shape == (1, 1, len(tok)) and cache.get_seq_length() == ids.shape[1]


# ------------------------------------------------------------------------------ critic


def test_value_model_shapes_zero_init_and_gradients(fresh_tiny_model):
    critic = make_value_model(fresh_tiny_model)
    assert isinstance(critic, ValueModel)
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    values = critic(ids, attention_mask=mask)
    assert values.shape == (2, 4) and values.dtype == torch.float32
    assert torch.equal(values, torch.zeros(2, 4))
    (values - 1.0).pow(2).sum().backward()  # zero head: only the head gets a gradient...
    assert critic.value_head.weight.grad.abs().sum() > 0
    assert critic.backbone.layers[0].self_attn.q_proj.weight.grad.abs().sum() == 0
    # ...once the head is non-zero, the gradient reaches the backbone.
    with torch.no_grad():
        critic.value_head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))
    critic.zero_grad()
    (critic(ids, attention_mask=mask) - 1.0).pow(2).sum().backward()
    assert critic.backbone.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_value_model_is_a_copy_initialised_from_the_policy(fresh_tiny_model):
    critic = make_value_model(fresh_tiny_model)
    assert torch.equal(critic.backbone.embed_tokens.weight, fresh_tiny_model.model.embed_tokens.weight)
    with torch.no_grad():
        critic.backbone.embed_tokens.weight.add_(1.0)
    assert not torch.equal(critic.backbone.embed_tokens.weight, fresh_tiny_model.model.embed_tokens.weight)


def test_value_model_with_gradient_checkpointing(fresh_tiny_model):
    critic = make_value_model(fresh_tiny_model)
    critic.gradient_checkpointing_enable()
    critic.train()
    with torch.no_grad():
        critic.value_head.weight.fill_(0.1)
    ids = torch.tensor([[5, 6, 7, 8]])
    ref = critic(ids).detach()
    critic(ids).sum().backward()
    assert critic.backbone.layers[1].mlp.up_proj.weight.grad.abs().sum() > 0
    critic.eval()
    torch.testing.assert_close(critic(ids), ref)


def test_value_model_from_a_lora_policy_drops_the_adapters(tiny_texts):
    pytest.importorskip("peft")
    policy, _ = load_model("tiny", tiny_texts=tiny_texts, lora_r=4)
    critic = make_value_model(policy)
    assert not any("lora" in n for n, _ in critic.named_parameters())
    assert any("lora" in n for n, _ in policy.named_parameters())  # the policy keeps its adapters
    base = policy.get_base_model().model
    assert torch.equal(critic.backbone.layers[0].self_attn.q_proj.weight, base.layers[0].self_attn.q_proj.base_layer.weight)
    assert critic(torch.tensor([[5, 6, 7]])).shape == (1, 3)
