"""On-policy distillation: the teacher's log-probs of the student's own tokens as a dense reward.

Pure tensor functions on padded tensors (`_B` batch, `_T` tokens; mask 1 = the token was sampled
by the student, i.e. it is trained). No model, no I/O.

The student samples; the teacher scores the sampled tokens; each sampled token's reward is the
negative per-token reverse KL (Thinking Machines 2025, "On-Policy Distillation"; Qwen3's
on-policy distillation stage, Qwen Team 2025):

    reverse_kl_t = log π_student(x_t | x_<t) - log π_teacher(x_t | x_<t)      (a one-sample estimate
                                                                               of KL(π_s || π_t) at t)
    A_t = A_task_t + coef * (log π_teacher - log π_student)_t                  (sampled tokens)
    A_t = 0                                                                    (mask 0: inserted tokens)

Each token's advantage is its own reward (no return-to-go over later tokens: Thinking Machines'
discount of 0), with no baseline: the reverse KL is already centred where the student agrees
with the teacher (a teacher equal to the student gives 0 everywhere). `algo.name=distill` is
this alone (`A_task = 0`); any other estimator with `algo.distill_coef > 0` adds the term to its
own advantages (a task reward mixed with the teacher's). Tokens the student did not sample
(tool output, masked) get advantage 0 whatever the teacher says of them: the teacher scores the
whole sequence, but only the student's own tokens are judged.

- `reverse_kl(student_logp_BT, teacher_logp_BT, mask_BT)`: per-token log p_s - log p_t, 0 where mask is 0.
- `distill_advantages(student_logp_BT, teacher_logp_BT, mask_BT, coef, adv_BT=None)`: the advantages above.
- `mean_reverse_kl(...)`: the mean per sampled token (the `distill/reverse_kl` metric).

Masked positions are selected out with `where`, so a teacher log-prob of -inf (or vLLM's -9999
floor) on an inserted token cannot leak in as NaN.

Run the tests: `python -m pytest tests/unit/test_distill.py -q`.
"""

from __future__ import annotations

import torch

__all__ = ["reverse_kl", "distill_advantages", "mean_reverse_kl"]


def reverse_kl(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Per-token reverse KL sample `log p_student - log p_teacher` on the sampled tokens (mask 1), 0 elsewhere.

    Its expectation over the student's samples is KL(π_student || π_teacher) at each position:
    positive where the student puts more mass on its token than the teacher would, negative where less."""
    m = mask_BT.bool()
    return torch.where(m, student_logp_BT.float() - teacher_logp_BT.float(), torch.zeros((), dtype=torch.float32))


def distill_advantages(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, mask_BT: torch.Tensor,
                       coef: float = 1.0, adv_BT: torch.Tensor | None = None) -> torch.Tensor:
    """`adv_BT + coef * (log p_teacher - log p_student)` on the sampled tokens, 0 where mask is 0.

    `adv_BT`: another estimator's advantages to add the term to (None: the teacher's reward
    alone, `algo.name=distill`). `coef` is `algo.distill_coef`. A masked token's advantage is 0
    even where `adv_BT` is not."""
    m = mask_BT.bool()
    dense = -coef * reverse_kl(student_logp_BT, teacher_logp_BT, mask_BT)
    base = adv_BT.float() if adv_BT is not None else torch.zeros_like(dense)
    return torch.where(m, base + dense, torch.zeros((), dtype=torch.float32))


def mean_reverse_kl(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Mean per-token reverse KL over the sampled tokens (0 when there are none)."""
    n = mask_BT.bool().sum()
    return float(reverse_kl(student_logp_BT, teacher_logp_BT, mask_BT).sum() / n.clamp(min=1))
