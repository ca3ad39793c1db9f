"""Tiny verifiable tasks that a small random model can learn with RL on a CPU in minutes.

`tiny:copy` — "copy: 3 7 1" → "3 7 1", scored by word-level F1 (qa_f1 on the whole
completion): partial credit from the first step, so the reward rises smoothly as the policy
learns to emit the prompt's digits and to stop. `tiny:add` — "add 3 4" → "7", scored by the
math rewards. Both are seeded and split into train/test by seed, and the ground truth lives in
`Task.answer`, never in the prompt's reward path.
"""

from __future__ import annotations

import random

from seekrl.types import Task

__all__ = ["KINDS", "make_tiny_tasks", "tiny_corpus"]

KINDS = ("copy", "add")


def make_tiny_tasks(kind: str = "copy", n: int = 512, seed: int = 0, split: str = "train") -> list[Task]:
    if kind not in KINDS:
        raise ValueError(f"unknown tiny task '{kind}'; choose one of {', '.join(KINDS)} (e.g. data.train=tiny:copy)")
    rng = random.Random(f"{kind}-{split}-{seed}")
    tasks = []
    for i in range(n):
        if kind == "copy":
            digits = [str(rng.randrange(10)) for _ in range(rng.randint(1, 3))]
            question, answer = "copy: " + " ".join(digits), " ".join(digits)
        else:
            a, b = rng.randrange(10), rng.randrange(10)
            question, answer = f"add {a} {b}", str(a + b)
        tasks.append(
            Task(
                id=f"tiny-{kind}-{split}-{i}",
                prompt=[{"role": "user", "content": question}],
                answer=answer,
                source=f"tiny_{kind}",
                meta={"answer_format": "plain"},
            )
        )
    return tasks


def tiny_corpus(tasks: list[Task]) -> list[str]:
    """Texts to train the tiny tokenizer on: prompts and answers (so every answer is spellable)."""
    texts = []
    for t in tasks:
        texts.extend(m["content"] for m in t.prompt)
        texts.append(str(t.answer))
    return texts
