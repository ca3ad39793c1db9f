"""Memory and step time per trainer rank: one process vs N FSDP2 ranks, side by side in one run.

    python bench/memory.py                       # SmolLM2-135M, 1 process vs 2 ranks (gloo, CPU)
    python bench/memory.py --model tiny --ranks 2 --steps 2 --out runs/bench/memory.json

Each arm runs the same GRPO policy update (PolicyTrainer.update: forward, backward, AdamW) on the
same fixed batch of `--seqs` sequences of `--prompt` + `--completion` tokens, `--steps` times, and
reports per rank: bytes of parameters + gradients + optimizer state that the rank holds (exact,
from the tensors: DTensor shards count their local part), peak resident memory of the process
(ru_maxrss: includes loading the full model before it is sharded, and the activations), and the
median update time. The arms run one after the other, so each has the machine to itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def worker(args) -> None:
    import torch

    from seekrl.build import policy_trainer
    from seekrl.config import Config
    from seekrl.models import load_model
    from seekrl.observe.stats import StatsTracker
    from seekrl.parallel.fsdp import shard_model
    from seekrl.parallel.ranks import init_ranks
    from seekrl.train.batch import TokenBatch, pad_completion
    from seekrl.train.batching import FORWARD_METHODS
    from seekrl.types import Task, Trajectory

    torch.set_num_threads(args.threads)
    cfg = Config()
    cfg.train.lr, cfg.train.micro_batch_tokens = 1e-6, args.micro_batch_tokens
    ranks = init_ranks(cfg.train.dist_backend, cfg.train.fsdp, cfg.train.dist_timeout_s)
    texts = ["the quick brown fox jumps over the lazy dog " * 4]
    model, tok = load_model(args.model, tiny_texts=texts, tiny_hidden=256, tiny_layers=4, tiny_vocab=512)
    model = shard_model(model, ranks, "fp32", FORWARD_METHODS)
    rng = random.Random(0)
    vocab = min(model.config.vocab_size, 30000)
    trajs = []
    for k in range(args.seqs // 4):  # 4 samples per prompt, as GRPO groups
        task = Task(id=str(k), prompt=[{"role": "user", "content": "x"}], answer="y")
        prompt = [rng.randrange(10, vocab) for _ in range(args.prompt)]
        for _ in range(4):
            n = args.completion
            trajs.append(Trajectory(task, prompt, [rng.randrange(10, vocab) for _ in range(n)], [1] * n, [-2.0] * n, [0] * n))
    adv = [[rng.uniform(-1, 1)] * len(t.completion_ids) for t in trajs]
    trainer = policy_trainer(cfg, model, tok.pad_token_id, total_steps=args.steps, ranks=ranks)
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC, batch.adv_BC = batch.behav_logp_BC, pad_completion(adv, batch.width)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        trainer.update(batch, StatsTracker())
        times.append(time.perf_counter() - t0)
    state = {
        "params": _bytes(model.parameters()),
        "grads": _bytes(p.grad for p in model.parameters()),
        "optimizer": _bytes(v for st in trainer.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)),
    }
    row = {"rank": ranks.rank, "world": ranks.world, "threads": args.threads, **state, "state_total": sum(state.values()),
           "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "step_s": statistics.median(times),
           "tokens": sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajs)}
    rows = ranks.all_gather_json(row)
    if ranks.is_main:
        Path(args.worker_out).write_text(json.dumps(rows))
    ranks.close()


def run_arm(args, n: int) -> list[dict]:
    """One arm: n = 1 runs with ranks × threads torch threads, so both arms use the same cores."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    threads = args.threads * (args.ranks if n == 1 else 1)
    flags = ["--model", args.model, "--steps", str(args.steps), "--seqs", str(args.seqs), "--prompt", str(args.prompt),
             "--completion", str(args.completion), "--threads", str(threads), "--micro-batch-tokens",
             str(args.micro_batch_tokens), "--worker-out", str(out)]
    if n == 1:
        argv = [sys.executable, __file__, "--worker", *flags]
    else:
        argv = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(n), __file__, "--worker", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(argv, check=True, timeout=args.timeout, env=env, cwd=ROOT)
    rows = json.loads(out.read_text())
    out.unlink()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (SmolLM2-135M-Instruct) or tiny")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--prompt", type=int, default=96)
    p.add_argument("--completion", type=int, default=96)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (2 ranks x 1 thread = the 2 cores); one process gets ranks x threads")
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=None, help="also write the figures as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from rich.console import Console
    from rich.table import Table

    arms = {}
    for n in (1, args.ranks):
        Console(stderr=True).print(f"[bold]arm[/bold]: {n} process(es), {args.steps} updates of {args.model}")
        arms[n] = run_arm(args, n)
    mib = 1 / 2**20
    table = Table(title=f"{args.model}: GRPO update, {args.seqs} x ({args.prompt}+{args.completion}) tokens, "
                        f"{args.threads} thread(s) per rank ({args.threads * args.ranks} for one process)")
    for col in ("ranks", "rank", "params MiB", "grads MiB", "optimizer MiB", "state MiB", "peak RSS MiB", "update s", "tokens/s (all ranks)"):
        table.add_column(col, justify="right")
    for n, rows in arms.items():
        for r in rows:
            table.add_row(str(n), str(r["rank"]), f"{r['params'] * mib:.0f}", f"{r['grads'] * mib:.0f}", f"{r['optimizer'] * mib:.0f}",
                          f"{r['state_total'] * mib:.0f}", f"{r['peak_rss'] * mib:.0f}", f"{r['step_s']:.2f}",
                          f"{r['tokens'] / max(x['step_s'] for x in rows):.0f}")
    Console().print(table)
    one, many = arms[1][0]["state_total"], max(r["state_total"] for r in arms[args.ranks])
    summary = {"state_ratio": many / one, "peak_rss_ratio": max(r["peak_rss"] for r in arms[args.ranks]) / arms[1][0]["peak_rss"],
               "step_time_ratio": max(r["step_s"] for r in arms[args.ranks]) / arms[1][0]["step_s"]}
    Console().print(f"per-rank state {args.ranks} ranks / 1 process: {summary['state_ratio']:.3f}; peak RSS: "
                    f"{summary['peak_rss_ratio']:.3f}; update time: {summary['step_time_ratio']:.3f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "arms": arms, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
