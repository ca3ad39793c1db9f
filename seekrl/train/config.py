"""The `train:` config section: optimisation, checkpoints, resume, and the trainer ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from seekrl.schema import Range

__all__ = ["TrainConfig"]

_LR = "a finite number >= 0 (e.g. 1e-6 for a real model, 1e-3 for the tiny one; 0 freezes it)"


@dataclass
class TrainConfig:
    steps: Annotated[int, Range(ge=0)] = 100
    """RL steps."""
    lr: Annotated[float, Range(ge=0, text=_LR)] = 1e-6
    """Policy learning rate (AdamW)."""
    critic_lr: Annotated[float, Range(ge=0, text=_LR)] = 1e-5
    """Critic learning rate (PPO)."""
    weight_decay: Annotated[float, Range(ge=0, hint="e.g. 0.0 or 0.01")] = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """constant | cosine (after warmup)."""
    min_lr_ratio: Annotated[float, Range(ge=0, le=1, hint="the cosine floor as a fraction of train.lr")] = 0.0
    """Cosine floor as a fraction of lr."""
    max_grad_norm: Annotated[float, Range(gt=0, hint="e.g. 1.0; 1e6 clips nothing")] = 1.0
    """Gradient clipping norm."""
    ppo_epochs: Annotated[int, Range(ge=1)] = 1
    """Passes over each batch."""
    minibatches: Annotated[int, Range(ge=1)] = 1
    """Optimizer steps per epoch (the batch is split into this many minibatches, each of whole groups: a task's rows together)."""
    minibatch_size: Annotated[int, Range(ge=0)] = 0
    """Tasks (groups) per optimizer step, as verl's ppo_mini_batch_size counts prompts: a batch of N groups makes ceil(N / minibatch_size) minibatches (fewer when algo.filter_zero_std drops groups); it must divide the batch's tasks (rollout.batch_size / rollout.group_size); 0: train.minibatches decides."""
    micro_batch_tokens: Annotated[int, Range(ge=1)] = 8192
    """Token budget of one forward/backward micro-batch (padded tokens)."""
    share_prefix: bool = True
    """Run each distinct prompt once per micro-batch and its G completions on its KV cache (exact; off under gradient checkpointing)."""
    packing: bool = True
    """Pack a micro-batch's sequences end to end into rows (varlen, attention kept within each sequence by a 4-D mask) instead of padding them, when that saves >= 10% of the rows; exact; SDPA or eager attention (others pad)."""
    length_buckets: Annotated[int, Range(ge=0, text=">= 0 (0: every micro-batch at its exact lengths)")] = 8
    """Round each micro-batch's sequence lengths (the padded or packed row length, the shared prompt, the completions on it) up to one of N values per doubling (8: steps of 1/8 of a power of two, at most 12.5% more tokens), so that a run meets far fewer tensor shapes. On a CPU oneDNN compiles and caches kernels for every shape it meets: in 20 SmolLM2-135M updates shaped like the HotpotQA recipe's, the trainer's resident memory grew 1.74 -> 2.69 GiB at exact lengths and 1.69 -> 2.21 GiB rounded, and an update took 21.4 s rounded against 26.0 s (BENCHMARKS.md, "Tensor shapes and resident memory"). Exact: padding is masked. 0: exact lengths."""
    skip_zero_advantage: bool = True
    """Leave out of the policy update the rows whose every trained token has advantage 0 (a group without reward spread, or under algo.branch_credit=local an answer set without spread): their gradient is exactly 0, and they still count in the loss's token or sequence normaliser, so the update is the same (float rounding aside) for less compute. Rows are kept when the loss has a term that does not vanish with the advantage (algo.kl_in=loss with a KL coefficient, algo.entropy_coef > 0). The update's actor/*, entropy and mismatch/* metrics are then measured over the rows it ran (train/skipped_rows: the share left out)."""
    recompute_logprobs: Literal["auto", "always", "never"] = "auto"
    """Old log-probs: auto (reuse the engine's when exact: local fp32 engine sharing weights; otherwise, with one optimizer step a batch in sync mode and nothing reading them before the update, the update's own forward pass detached: one pass fewer) | always (a separate forward pass) | never."""
    agreement_rows: Annotated[int, Range(ge=0, text=">= 0 (0: no check when the engine's log-probs are reused)")] = 1
    """When the engine's log-probs are reused as old log-probs, the trainer recomputes this many completions per step and compares (mismatch/kl); when they are recomputed anyway, all are compared."""
    agreement_max_kl: Annotated[float, Range(gt=0, text="a finite number > 0 (e.g. 0.02)")] = 0.02
    """A step whose engine-vs-trainer KL on the sampled tokens (mismatch/kl) passes this counts in mismatch/disagree and warns once: a broken weight sync or a wrong engine cannot train silently."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1, text=f"in 0..{2**32 - 1} (what numpy and torch both accept)")] = 0
    """Seed for data order, sampling and init."""
    save_every: Annotated[int, Range(ge=0, text=">= 0 (0: a checkpoint only at the end)")] = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_last: Annotated[int, Range(ge=1)] = 2
    """Checkpoints to keep."""
    resume: str = "auto"
    """auto (continue from the run folder's last checkpoint) | never | a checkpoint path."""
    max_steps_this_run: int = 0
    """Stop after this many steps in this process (0: no limit); for preemption tests and time slicing."""
    max_nonfinite: Annotated[int, Range(ge=0, text=">= 0 (0: never stop on nan/inf updates)")] = 3
    """An update whose loss or gradient norm is nan/inf is skipped (weights untouched, counted in train/nonfinite_skipped); after this many such steps in a row the run stops with exit 2, its checkpoints holding the last finite weights (0: never stop)."""
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend under torchrun / seekrl launch: auto (nccl on CUDA, gloo on CPU) | gloo | nccl."""
    fsdp: Literal["full", "hybrid", "none"] = "full"
    """With several trainer ranks: full (FSDP2 fully_shard: parameters, gradients and optimizer state sharded over all ranks) | hybrid (sharded within a node, replicated across nodes) | none (every rank holds the whole model; gradients all-reduced). One process: ignored."""
    dist_timeout_s: Annotated[float, Range(gt=0, text="> 0 seconds")] = 1800.0
    """Longest wait of a rank for the others (a collective, the controller's rollout): a rank that died or hangs ends the job after this, naming the rank."""
    mixed_precision: Literal["auto", "bf16", "bf16_if_native", "fp32"] = "auto"
    """Trainer compute dtype: auto (several ranks on CUDA: bf16 compute with fp32 master weights and reductions; otherwise fp32) | bf16 (also one process, CPU or CUDA: the decoder under torch.autocast bf16, weights, AdamW state and the LM head's log-probs fp32; old log-probs recomputed under train.recompute_logprobs=auto; a warning where the device has no native bf16) | bf16_if_native (bf16 where the device computes it natively: a CPU with avx512_bf16 or AMX, a bf16 GPU; fp32 elsewhere, e.g. an AVX2-only CPU, which emulates bf16 up to 46x slower) | fp32."""
