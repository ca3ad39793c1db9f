"""Model FLOP utilisation of a GRPO update, next to this machine's measured matmul peak, in one run.

    python bench/mfu.py                                  # tiny and SmolLM2-135M, fp32, all cores
    python bench/mfu.py --models smollm2 --threads 2 --out runs/bench/mfu.json
    python bench/mfu.py --device cuda --dtype bfloat16   # on a GPU: bf16 against the GPU's bf16 matmul peak

Peak: the median FLOP/s of `--peak-size`² float matmuls (`torch.mm`, 2n³ FLOPs each) in this
process, with the same threads and dtype, timed right before the models.

Update: `PolicyTrainer.update` (forward, backward, clipping, AdamW step: what an RL step's
update costs, nothing left out) on a fixed GRPO batch: `--prompts` distinct prompts of
`--prompt` tokens × `--group` samples of `--completion` tokens each, one optimizer step with
the whole batch in micro-batches of `--micro-batch-tokens`. Median of `--steps` after one
warm-up step.

FLOPs counted (the useful work, the same whatever the trainer's layout):
  6 × (decoder matmul parameters) × (tokens the decoder must see: each distinct prompt once, as
      the shared-prefix pass runs it, plus every completion)
  + 6 × (vocab × hidden) × (completion tokens: the head runs only where a token is scored)
  + attention: 6 × layers × (heads × head_dim) × (causal query·key pairs) × 2 (scores and values)
Embedding lookups, norms, activations and the optimizer count as zero. MFU = FLOPs / update time
/ peak FLOP/s.

Cheaper updates, side by side in one run (`--arms`, each `PRECISION:FROZEN`):

    python bench/mfu.py --models smollm2 --threads 2 --arms fp32:0,bf16:0,fp32:15,bf16:15

`PRECISION` is train.mixed_precision (fp32 | bf16: the decoder under bf16 autocast) and `FROZEN`
model.freeze_layers. Each arm also reports its log-prob gap to the fp32 arm's on the same batch
(mean and max |Δ log p| over the completion tokens, and the mean k3 KL): what the trainer's bf16
costs in agreement with an fp32 engine. The FLOPs column counts the full model's work for every arm
(a frozen arm does less: its "MFU" is then an equivalent, for comparing speed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmul_peak(n: int, dtype, device: str, repeats: int = 5) -> float:
    import torch

    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    torch.mm(a, b)  # warm-up
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def count_flops(model, trajs) -> dict:
    cfg = model.config
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    vocab = cfg.vocab_size
    embed = model.get_input_embeddings().weight.numel()
    head_params = vocab * hidden
    decoder_params = sum(p.numel() for p in model.parameters()) - embed
    if not getattr(cfg, "tie_word_embeddings", False):
        decoder_params -= head_params  # the untied head is counted on its own below
    prompts = {tuple(t.prompt_ids) for t in trajs}
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(t.completion_ids) for t in trajs)
    pairs = sum(len(p) * (len(p) + 1) // 2 for p in prompts)  # causal pairs inside each prompt
    pairs += sum(len(t.completion_ids) * len(t.prompt_ids) + len(t.completion_ids) * (len(t.completion_ids) + 1) // 2
                 for t in trajs)
    flops = {
        "decoder": 6 * decoder_params * (prompt_tokens + completion_tokens),
        "head": 6 * head_params * completion_tokens,
        "attention": 6 * layers * heads * head_dim * pairs * 2,
    }
    return {"flops": sum(flops.values()), "parts": flops, "decoder_params": decoder_params, "head_params": head_params,
            "tokens": prompt_tokens + completion_tokens, "completion_tokens": completion_tokens}


def measure(name: str, args, precision: str = "fp32", frozen: int = 0, reference=None) -> dict:
    import torch

    from seekrl.build import policy_trainer
    from seekrl.config import Config
    from seekrl.models import load_model
    from seekrl.observe.stats import StatsTracker
    from seekrl.train.batch import TokenBatch, pad_completion
    from seekrl.types import Task, Trajectory

    texts = ["the quick brown fox jumps over the lazy dog " * 4]
    from seekrl.train.compute import set_autocast

    model, tok = load_model(name, tiny_texts=texts, tiny_hidden=256, tiny_layers=2, tiny_vocab=512, dtype=args.dtype,
                            device=args.device, freeze_layers=frozen)
    cfg = Config()
    cfg.train.lr, cfg.train.micro_batch_tokens, cfg.train.mixed_precision = 1e-6, args.micro_batch_tokens, precision
    set_autocast(model, torch.bfloat16 if precision == "bf16" else None)
    rng = random.Random(0)
    vocab = min(model.config.vocab_size, 30000)
    trajs = []
    for k in range(args.prompts):
        task = Task(id=str(k), prompt=[{"role": "user", "content": "x"}], answer="y")
        prompt = [rng.randrange(10, vocab) for _ in range(args.prompt)]
        for _ in range(args.group):
            n = args.completion
            trajs.append(Trajectory(task, prompt, [rng.randrange(10, vocab) for _ in range(n)], [1] * n, [-2.0] * n, [0] * n))
    adv = [[rng.uniform(-1, 1)] * len(t.completion_ids) for t in trajs]
    trainer = policy_trainer(cfg, model, tok.pad_token_id, total_steps=args.steps + 1)
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC, batch.adv_BC = batch.behav_logp_BC, pad_completion(adv, batch.width)
    logp = trainer.logprobs(batch)  # before any update: the arm's log-probs of the same weights
    t0 = time.perf_counter()
    trainer.logprobs(batch)  # warm: what recomputing a step's old log-probs costs (train/offpolicy.py)
    logprob_s = time.perf_counter() - t0
    gap = {}
    if reference is not None:
        d = (logp - reference)[batch.token_mask_BC]
        gap = {"logp_gap_mean": float(d.abs().mean()), "logp_gap_max": float(d.abs().max()),
               "kl_k3": float((torch.exp(d) - 1 - d).mean())}
    times = []
    for i in range(args.steps + 1):
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.update(batch, StatsTracker())
        if args.device == "cuda":
            torch.cuda.synchronize()
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    counted = count_flops(model, trajs)
    seconds = statistics.median(times)
    return {"model": name, "arm": f"{precision}:{frozen}", "seconds": seconds, "achieved_flops": counted["flops"] / seconds,
            **counted, "tokens_per_s": counted["tokens"] / seconds, "logprob_s": logprob_s, **gap, "_logp": logp}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny (hidden 256, 2 layers, vocab 512), smollm2")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--completion", type=int, default=128)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--peak-size", type=int, default=2048)
    p.add_argument("--arms", default="fp32:0", help="comma-separated PRECISION:FROZEN (train.mixed_precision:model.freeze_layers)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    dtype = getattr(torch, args.dtype)
    peak = matmul_peak(args.peak_size, dtype, args.device)
    rows = []
    for m in (m.strip() for m in args.models.split(",") if m.strip()):
        reference = None
        for arm in args.arms.split(","):
            precision, frozen = arm.split(":")
            rows.append(measure(m, args, precision, int(frozen), reference))
            reference = rows[-1]["_logp"] if reference is None else reference  # the first arm is the reference
    for r in rows:
        r.pop("_logp")
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {args.threads} threads"
    print(f"{device}, {args.dtype}: {args.peak_size}x{args.peak_size} matmul peak {peak / 1e9:.1f} GFLOP/s")
    print("| model | arm (precision:frozen) | update s | old log-prob pass s | tokens/s | counted GFLOP (decoder + head + attention) | achieved GFLOP/s | MFU "
          "| mean / max abs log-prob gap to the first arm | k3 KL |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        r["mfu"] = r["achieved_flops"] / peak
        parts = " + ".join(f"{v / 1e9:.1f}" for v in r["parts"].values())
        gap = f"{r['logp_gap_mean']:.2e} / {r['logp_gap_max']:.2e} | {r['kl_k3']:.1e}" if "kl_k3" in r else "- | -"
        print(f"| {r['model']} | {r['arm']} | {r['seconds']:.2f} | {r['logprob_s']:.2f} | {r['tokens_per_s']:.0f} | {r['flops'] / 1e9:.1f} ({parts}) | "
              f"{r['achieved_flops'] / 1e9:.1f} | {100 * r['mfu']:.1f}% | {gap} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "device": device, "peak_flops": peak, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
