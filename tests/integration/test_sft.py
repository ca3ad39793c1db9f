"""SFT (seekrl/train/sft.py): assistant-only masking, micro-batching, a tiny run that learns.

- tokenize_chat's mask-1 tokens are exactly the assistant contents + their end-of-turn tokens;
  system / user / tool text and role headers are masked;
- a template that rewrites earlier turns fails the prefix check with ChatTemplateError;
- the micro-batched gradient equals one big batch's, and equals HF's own masked-label loss;
- malformed rows raise DataError naming file:line and the field;
- 60 steps on a synthetic copy task cut the loss by more than half, greedy generation of the
  checkpoint (loaded with AutoModelForCausalLM) reproduces training answers, and
  `train.resume=auto` continues the run.
"""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

from seekrl.config import load_config
from seekrl.errors import DataError
from seekrl.jobs import sft
from seekrl.models import encode_chat
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import undocumented
from seekrl.train.plan import plan_micro_batches
from seekrl.train.sft import ChatTemplateError, load_sft_rows, step_loss, tokenize_chat, tokenize_text

CONV = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "Question: capital of France?"},
    {"role": "assistant", "content": "<search> capital of France </search>"},
    {"role": "tool", "content": "<information> Paris is the capital </information>"},
    {"role": "assistant", "content": "<answer> Paris </answer>"},
]


def _masked_runs(tokenizer, ids, mask):
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tokenizer.decode(cur))
            cur = []
    if cur:
        runs.append(tokenizer.decode(cur))
    return runs


def test_only_assistant_tokens_are_trained(tiny_tokenizer):
    ids, mask = tokenize_chat(tiny_tokenizer, CONV)
    assert ids == encode_chat(tiny_tokenizer, CONV, add_generation_prompt=False)  # the whole rendering, in order
    assert _masked_runs(tiny_tokenizer, ids, mask) == [
        "<search> capital of France </search><|im_end|>",
        "<answer> Paris </answer><|im_end|>",
    ]
    masked_text = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert "Paris is the capital" in masked_text and "be brief" in masked_text and "<|im_start|>assistant\n" in masked_text


def test_prompt_completion_rows_equal_messages_rows(tmp_path, tiny_tokenizer):
    path = tmp_path / "pc.jsonl"
    rows = [
        {"prompt": CONV[:2], "completion": CONV[2:]},
        {"messages": CONV},
        {"prompt": "Question: capital of France?", "completion": "Paris"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs = load_sft_rows(path)
    assert convs[0] == convs[1] == CONV
    assert convs[2] == [{"role": "user", "content": "Question: capital of France?"}, {"role": "assistant", "content": "Paris"}]


def test_text_rows_train_every_token_and_an_eos(tmp_path, tiny_tokenizer):
    path = tmp_path / "mixed.jsonl"
    rows = [{"text": "Paris is the capital of France."}, {"messages": CONV}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs = load_sft_rows(path)
    assert convs == ["Paris is the capital of France.", CONV]
    ids, mask = tokenize_text(tiny_tokenizer, convs[0])
    assert ids[-1] == tiny_tokenizer.eos_token_id and all(mask) and len(mask) == len(ids)
    assert tiny_tokenizer.decode(ids[:-1]) == "Paris is the capital of France."


def test_template_that_rewrites_earlier_turns_is_rejected(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # the last message is rendered in ChatML, earlier ones as "role: content": prefixes disagree
    tok.chat_template = (
        "{%- for m in messages %}{%- if loop.last %}{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{%- else %}{{- m['role'] + ': ' + m['content'] + '\n' }}{%- endif %}{%- endfor %}"
    )
    with pytest.raises(ChatTemplateError, match="not a prefix"):
        tokenize_chat(tok, CONV)


def _examples(tokenizer, n=7, seed=0):
    rng = random.Random(seed)
    words = ["the quick brown fox", "capital of France", "12 + 30 = 42", "Paris", "lazy dog"]
    out = []
    for _ in range(n):
        conv = [{"role": "user", "content": rng.choice(words)}]
        for _ in range(rng.randint(1, 3)):
            conv.append({"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(1, 3)))})
            conv.append({"role": "tool", "content": rng.choice(words)})
        out.append(tokenize_chat(tokenizer, conv[:-1]))
    return out


def _grads(model, fn):
    model.zero_grad(set_to_none=True)
    fn()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_micro_batches_give_the_one_batch_gradient(fresh_tiny_model, tiny_tokenizer):
    model, pad = fresh_tiny_model.train(), tiny_tokenizer.pad_token_id
    examples = _examples(tiny_tokenizer)
    assert len(plan_micro_batches([len(i) for i, _ in examples], 60)) > 2
    losses = {}
    one = _grads(model, lambda: losses.__setitem__("one", step_loss(model, examples, 10**6, pad, "cpu", backward=True)[0]))
    many = _grads(model, lambda: losses.__setitem__("many", step_loss(model, examples, 60, pad, "cpu", backward=True)[0]))

    def hf_reference():  # HF's own mean over labels != -100, one padded batch
        L = max(len(i) for i, _ in examples)
        ids = torch.full((len(examples), L), pad)
        attn = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for b, (i, m) in enumerate(examples):
            ids[b, : len(i)], attn[b, : len(i)] = torch.tensor(i), 1
            labels[b, : len(i)] = torch.where(torch.tensor(m) == 1, torch.tensor(i), -100)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        losses["hf"] = float(loss.detach())

    ref = _grads(model, hf_reference)
    assert losses["one"] == pytest.approx(losses["many"], rel=1e-5) and losses["one"] == pytest.approx(losses["hf"], rel=1e-5)
    assert one.keys() == many.keys() == ref.keys()
    for name in one:
        torch.testing.assert_close(many[name], one[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(ref[name], one[name], rtol=1e-4, atol=1e-6, msg=name)


def test_malformed_rows_name_file_line_and_field(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    cases = [
        ({"txt": "no messages"}, "'messages'"),
        ({"text": "  "}, "'text' must be a non-empty string"),
        ({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}, "'content'"),
        ({"prompt": [{"role": "user", "content": "q"}]}, "'completion'"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
    ]
    for k, (bad, field) in enumerate(cases):
        path = tmp_path / f"bad{k}.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(DataError, match=f"bad{k}.jsonl:2") as info:
            load_sft_rows(path)
        assert field in str(info.value)


def _copy_rows(n=64, seed=0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"messages": [{"role": "user", "content": f"copy: {a} {b}"}, {"role": "assistant", "content": f"{a} {b}"}]})
    return rows


def test_sft_learns_a_copy_task_and_checkpoints_load(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = _copy_rows()
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [
        f"data.train={data}", f"data.eval={data}", "data.max_eval=16", f"log.dir={tmp_path}", "log.name=sft",
        "log.progress=false", "train.lr=3e-3", "rollout.batch_size=16", "train.micro_batch_tokens=256",
        "train.save_every=30", "train.keep_last=1", "model.device=cpu",
    ]
    run = sft(load_config(None, [*overrides, "train.steps=60"]))
    assert (run / "config.yaml").is_file() and (run / "tensorboard").is_dir()
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == list(range(61))
    first, last = metrics[1]["loss"], metrics[-1]["loss"]
    assert last < 0.5 * first, (first, last)
    assert metrics[-1]["eval/loss"] < 0.5 * metrics[0]["eval/loss"]
    for key in ("lr", "tokens/s", "time/step_s", "memory/rss_gib"):
        assert metrics[-1][key] > 0
    assert undocumented({k for m in metrics for k in m}) == []

    folder = run / "checkpoints" / "step_60" / "model"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_60"]  # keep_last=1, and the pointer
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    right = 0
    for row in rows[:8]:
        prompt = encode_chat(tok, row["messages"][:1])
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
        right += tok.decode(out, skip_special_tokens=True) == row["messages"][1]["content"]
    assert right >= 4, right

    # train.resume=auto continues from step 60: only steps 61..64 are added
    sft(load_config(None, [*overrides, "train.steps=64"]))
    assert [m["step"] for m in read_metrics(run)] == list(range(65))


def test_sft_on_text_rows_is_language_modeling(tmp_path):
    """Plain-text rows (continued pretraining): a tiny model learns a corpus whose second half of
    each row repeats its first half (so the loss can fall below the entropy of the words)."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta"]
    rows = []
    for _ in range(64):
        span = " ".join(rng.choice(words) for _ in range(4))
        rows.append({"text": f"{span} | {span}"})
    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [f"data.train={data}", "data.eval=null", f"log.dir={tmp_path}", "log.name=lm", "log.progress=false",
                 "train.lr=3e-3", "rollout.batch_size=16", "model.device=cpu", "train.steps=60", "train.save_every=0"]
    run = sft(load_config(None, overrides))
    metrics = read_metrics(run)
    assert metrics[-1]["loss"] < 0.5 * metrics[1]["loss"], (metrics[1]["loss"], metrics[-1]["loss"])
    # every token of a row is trained, not just an assistant span: the label count is the row lengths
    assert metrics[-1]["tokens/assistant"] > 16 * 8


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_micro_batches_give_the_padded_loss_and_gradient(fresh_tiny_model, tiny_tokenizer, attn):
    """Varlen packing in SFT (train.packing): the same loss and gradients as right padding."""
    model, pad = fresh_tiny_model.train(), tiny_tokenizer.pad_token_id
    model.config._attn_implementation = attn
    examples = _examples(tiny_tokenizer)
    assert len({len(i) for i, _ in examples}) > 3  # lengths differ: padding would waste tokens
    from seekrl.train.packing import saves_rows

    assert saves_rows([len(i) for i, _ in examples])  # so the packed layout is the one measured
    losses = {}
    padded = _grads(model, lambda: losses.__setitem__("padded", step_loss(model, examples, 10**6, pad, "cpu", backward=True)[0]))
    packed = _grads(model, lambda: losses.__setitem__("packed", step_loss(model, examples, 10**6, pad, "cpu", backward=True,
                                                                           pack=True)[0]))
    assert losses["packed"] == pytest.approx(losses["padded"], abs=1e-5)
    for n, g in padded.items():
        torch.testing.assert_close(packed[n], g, rtol=0, atol=1e-5 * max(1.0, g.abs().max().item()), msg=n)
