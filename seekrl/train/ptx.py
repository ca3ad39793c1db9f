"""PPO-ptx: a supervised loss on fixed episodes added to every policy update (InstructGPT's PPO-ptx;
OpenRLHF's `--pretrain_data` / `--ptx_coef`).

    seekrl train CONFIG data.ptx=episodes.jsonl algo.ptx_coef=0.2 data.ptx_batch=8

RL moves the whole policy, also where it is not trained: GRPO on one kind of question changes how
the model answers another (RESULTS.md: GRPO on HotpotQA's open questions loses yes/no ones). The
anchor holds chosen behaviour in place: each optimizer step of the policy also back-propagates
`algo.ptx_coef` × the token-mean cross-entropy of the next `data.ptx_batch` examples of
`data.ptx`, a file in `seekrl sft`'s formats (conversations, or agent episodes with masked tool
output, as `seekrl generate` writes them), trained on the same tokens SFT trains on. Its gradient
joins the policy's before clipping and the optimizer step, so AdamW sees one gradient.

The examples are drawn in a fresh permutation each pass, seeded by train.seed and the pass, and
the number drawn so far is the anchor's whole state (the RL checkpoint keeps it): a resumed run
draws what the uninterrupted one would have. With several trainer ranks every rank scores the same
examples (the gradient is then the same on each, and their average is it).

With `data.ptx_tokens=last` only each example's last assistant turn is trained (`last_turn`): an
agent episode's answer, not the searches before it, so the anchor holds the answer's form (a yes/no
answer to a yes/no question) and nothing of the searching. Measured on the HotpotQA recipe
(RESULTS.md, 2026-12-06): trained on answer turns alone, the policy learned to answer at once and
stopped searching; anchor whole episodes where the searching is to be kept.

Metrics: `loss/ptx` (the examples' token-mean cross-entropy), `ptx/tokens` (trained tokens a step).
"""

from __future__ import annotations

import functools
import math

import torch

from seekrl.observe.stats import StatsTracker
from seekrl.train.config import TrainConfig
from seekrl.train.sft import step_loss

__all__ = ["PtxAnchor", "last_turn"]


def last_turn(labels_mask: list[int]) -> list[int]:
    """`labels_mask` with only its last run of trained tokens kept: the last assistant turn (the
    tokens between turns, a tool's output or the chat template's, are untrained, so each turn is
    one run)."""
    end = max((i + 1 for i, m in enumerate(labels_mask) if m), default=0)
    start = end
    while start > 0 and labels_mask[start - 1]:
        start -= 1
    return [int(start <= i < end) for i in range(len(labels_mask))]


class PtxAnchor:
    """The supervised examples of PPO-ptx and the loss they add to each optimizer step."""

    def __init__(self, examples: list[tuple[list[int], list[int]]], *, coef: float, batch: int, seed: int,
                 budget: int, pad_id: int, device: torch.device, pack: bool = False, buckets: int = TrainConfig.length_buckets):
        """`examples`: `(ids, labels_mask)` pairs (train/sft.py `tokenize_examples`), scored as
        `seekrl sft` scores a step (`step_loss`: micro-batches of `budget` padded tokens, `pack`ed
        when possible, lengths rounded by `buckets`; one process's: every rank scores all of them)."""
        if not examples:
            raise ValueError("PPO-ptx needs at least one example")
        self.examples, self.batch, self.seed = examples, batch, seed
        self._loss = functools.partial(step_loss, budget=budget, pad_id=pad_id, device=device, backward=True, pack=pack,
                                       scale=coef, buckets=buckets)
        self.drawn = 0  # examples drawn so far: the whole state

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.examples), generator=g).tolist()

    def next_examples(self) -> list[tuple[list[int], list[int]]]:
        """The next `batch` examples (a pass ends, the next one's permutation continues)."""
        n, out = len(self.examples), []
        order, epoch = None, -1
        for k in range(self.drawn, self.drawn + self.batch):
            if k // n != epoch:
                epoch = k // n
                order = self._order(epoch)
            out.append(self.examples[order[k % n]])
        self.drawn += self.batch
        return out

    def backward(self, model: torch.nn.Module, stats: StatsTracker) -> float:
        """Back-propagate `coef` × the next examples' token-mean cross-entropy into `model`'s
        gradients; return that mean (nan/inf: the caller skips the step, its gradients dropped)."""
        mean, n_label, _ = self._loss(model, self.next_examples())
        if math.isfinite(mean):
            stats.add(**{"loss/ptx": mean, "ptx/tokens": float(n_label)})
        return mean

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = int(state.get("drawn", 0))
