"""Shared fixtures: a tiny tokenizer and a tiny random Llama, built once per test session.

`tiny_tokenizer` / `tiny_model` are session-scoped and shared: do not train or modify them in a
test. Tests that change weights take `fresh_tiny_model` (a deep copy, function-scoped).
Building both takes well under a second.
"""

from __future__ import annotations

import copy
import os
import string

# Before torch loads: OpenMP threads that spin-wait at barriers make small ops 10-100x slower
# whenever the 2 cores are shared (another process, or the trainer and engine threads at once).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

# A full disk fails every test that writes a model and can stall the rest until CI's time limit:
# with less than this free where the tests write, stop at once with one line. A run on a fresh
# machine writes about 1.5 GiB there (measured 2026-11-27: 0.55 GB of temporary folders at the
# peak, the 0.5 GB dequantized SmolLM2 cache, 0.45 GB of torch.compile kernels);
# SEEKRL_TEST_MIN_FREE_GIB overrides the floor.
MIN_FREE_GIB = float(os.environ.get("SEEKRL_TEST_MIN_FREE_GIB", "2"))


def pytest_sessionstart(session):
    import shutil
    import tempfile

    for where in sorted({tempfile.gettempdir(), os.path.expanduser("~")}):
        free = shutil.disk_usage(where).free / 2**30
        if free < MIN_FREE_GIB:
            pytest.exit(f"only {free:.2f} GiB free on the disk of {where}, and the tests need {MIN_FREE_GIB:g} GiB "
                        "(temporary folders, model caches, compiled kernels): free space there, or set TMPDIR and "
                        "HOME to a disk that has it", returncode=1)


# Every printable ASCII character occurs, so any ASCII prompt round-trips through the tokenizer.
TINY_TEXTS = [
    string.ascii_lowercase + " " + string.ascii_uppercase + " " + string.digits,
    string.punctuation + "\n\t",
    "Question: what is the capital of France? <search> capital of France </search>",
    "<information> Paris is the capital and largest city of France. </information>",
    "<think> the answer is in the document </think> <answer> Paris </answer>",
    "Question: what is 12 + 30? <think> 12 + 30 = 42 </think> <answer> 42 </answer>",
    "the quick brown fox jumps over the lazy dog",
]


@pytest.fixture(scope="session")
def tiny_texts() -> list[str]:
    return list(TINY_TEXTS)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_texts):
    from seekrl.models import train_tiny_tokenizer

    return train_tiny_tokenizer(tiny_texts, vocab_size=128)


# Chat templates of thinking models, in ChatML: the next turn's rendering drops the <think> block of
# earlier assistant turns, so a turn's prompt is not a prefix of the next one's.
THINK_DROPPING_TEMPLATE = (  # every earlier assistant turn (DeepSeek-R1, QwQ)
    "{%- for message in messages %}"
    "{%- set content = message['content'] or '' %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip() %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
QWEN3_LIKE_TEMPLATE = (  # only the assistant turns before the last user message (Qwen3: tool turns keep theirs)
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] or '' %}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


@pytest.fixture(scope="session")
def think_templates() -> dict[str, str]:
    return {"drop_all": THINK_DROPPING_TEMPLATE, "qwen3_like": QWEN3_LIKE_TEMPLATE}


@pytest.fixture(scope="session")
def think_tokenizer(tiny_texts):
    """The tiny tokenizer with THINK_DROPPING_TEMPLATE as its chat template."""
    from seekrl.models import train_tiny_tokenizer

    tok = train_tiny_tokenizer(tiny_texts, vocab_size=128)
    tok.chat_template = THINK_DROPPING_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    """Llama, hidden 64, 2 layers, fp32, seed 0. Shared: do not modify."""
    from seekrl.models import make_tiny_model

    return make_tiny_model(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=0).eval()


@pytest.fixture
def fresh_tiny_model(tiny_model):
    """A private copy of `tiny_model` that a test may train or modify."""
    return copy.deepcopy(tiny_model)


@pytest.fixture(scope="session")
def sharp_tiny(tiny_tokenizer):
    """`sharp_tiny(seed)`: a tiny model with large weights, so that greedy outputs and samples
    depend on the weights (a fresh tiny model repeats one token). A new model per call."""
    import torch

    from seekrl.models import make_tiny_model

    def make(seed: int, std: float = 0.25):
        model = make_tiny_model(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, std, generator=gen)
        return model.eval()

    return make
