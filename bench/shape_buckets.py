"""Policy updates at exact sequence lengths and at rounded ones (`train.length_buckets`): resident memory and time, side by side in one run.

    python bench/shape_buckets.py                                   # SmolLM2-135M, 40 updates an arm
    python bench/shape_buckets.py --model runs/hotpotqa/sft/checkpoints/step_70/model --updates 60

On a CPU, oneDNN compiles a kernel for each tensor shape a bf16 matmul meets and keeps it in its
primitive cache (up to 1,024 of them). The micro-batches of a GRPO update have new lengths every
step (packed rows as long as their longest sequence), so at exact lengths the cache, and the
trainer's resident memory, grow step after step. Each arm is a child process that runs
`--updates` policy updates (the trainer's own `PolicyTrainer.update`: packed shared-prefix
micro-batches of `train.micro_batch_tokens`, the decoder under bf16 autocast where native,
`model.freeze_layers=--freeze-layers`) on synthetic episodes shaped
like the HotpotQA recipe's: 4 questions × 4 episodes × 4 answer branches, prompts of 120-256
tokens, two turns of a 5-40-token query and a 60-200-token tool output, then an answer. Every
arm draws the same episodes (`--seed`). The arms differ only in `train.length_buckets`: 0 (exact
lengths) and 8 (the default: 8 lengths per doubling), and optionally in oneDNN's primitive cache
capacity (`--arms 0,8,8:256`: ONEDNN_PRIMITIVE_CACHE_CAPACITY=256 in the third).

It prints, per arm, the resident memory after the first update and after the last (after
`malloc_trim`, as the trainer's `memory/rss_gib`), the peak (VmHWM), the mean seconds an update
(the first left out), the episodes' tokens, and a markdown row for BENCHMARKS.md. The arms run
one after the other, each with the machine to itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

CHILD = r"""
import json, random, sys, time
from seekrl import memory  # importing seekrl applies seekrl/memory.py's settings, before torch
import torch
from seekrl.build import policy_trainer
from seekrl.train.compute import set_autocast, trainer_precision
from seekrl.config import load_config
from seekrl.models import load_policy
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.types import Task, Trajectory

model_path, buckets, updates, frozen, seed, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
cfg = load_config(None, [f"model.path={model_path}", "model.max_context=1280", f"model.freeze_layers={frozen}", f"train.length_buckets={buckets}",
                         "train.micro_batch_tokens=2048", "train.mixed_precision=bf16_if_native", "train.lr=1e-7",
                         "rollout.max_new_tokens=40", "rollout.max_prompt_tokens=256"])
model, tok = load_policy(cfg.model)  # model.freeze_layers applied
set_autocast(model, torch.bfloat16 if trainer_precision(cfg.train.mixed_precision, "cpu") == "bf16" else None)
trainer = policy_trainer(cfg, model, tok.pad_token_id, total_steps=updates)
rng = random.Random(seed)
V = len(tok)

def ids(n):
    return [rng.randrange(100, V) for _ in range(n)]

def episode(prompt):
    t = Trajectory(Task(id="q", prompt=[], answer=""), prompt, [], [], [], [])
    for _ in range(2):
        q = rng.randint(5, 40)
        t.append(ids(q), sampled=True, logprobs=[-1.0] * q, version=0)
        t.append(ids(rng.randint(60, 200)), sampled=False, version=0)
    return t

def branches(t):  # rollout.answer_branches: the history copied in and masked, then an answer of its own
    out = []
    for _ in range(4):
        b = Trajectory(t.task, t.prompt_ids, [], [], [], [])
        b.append(list(t.completion_ids), sampled=False, version=0)
        a = rng.randint(3, 12)
        b.append(ids(a), sampled=True, logprobs=[-1.0] * a, version=0)
        out.append(b)
    return out

rss, times, tokens = [], [], 0
for u in range(updates):
    trajs = []
    for _ in range(4):
        prompt = ids(rng.randint(120, 256))
        for _ in range(4):
            trajs += branches(episode(prompt))
    batch = TokenBatch.from_trajectories(trajs)
    batch.old_logp_BC = trainer.logprobs(batch)
    batch.adv_BC = pad_completion([[rng.choice([-1.0, 1.0])] * len(t.completion_ids) for t in trajs], batch.width)
    t0 = time.perf_counter()
    trainer.update(batch, StatsTracker())
    times.append(time.perf_counter() - t0)
    tokens += sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajs)
    rss.append(memory.release()["memory/rss_gib"])
    print(f"update {u + 1}/{updates}: {times[-1]:.1f} s, resident {rss[-1]:.2f} GiB", file=sys.stderr, flush=True)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
print("BENCH " + json.dumps({"rss": rss, "times": times, "peak_gib": hwm, "tokens": tokens}))
"""


def arm(model: str, spec: str, args) -> dict:
    """One arm: `spec` is train.length_buckets, optionally `:N` for oneDNN's primitive cache capacity."""
    buckets, _, capacity = spec.partition(":")
    cmd = [sys.executable, "-c", CHILD, model, buckets, str(args.updates), str(args.freeze_layers), str(args.seed),
           str(args.threads)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
    if capacity:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=args.timeout, env=env)  # its progress on stderr
    except subprocess.TimeoutExpired:
        sys.exit(f"arm {spec}: no result in {args.timeout:.0f} s; raise --timeout or lower --updates")
    line = next((x for x in p.stdout.splitlines() if x.startswith("BENCH ")), None)
    if p.returncode or line is None:
        sys.exit(f"arm {spec} failed (exit {p.returncode}); its error is above")
    return json.loads(line[6:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="model.path (default: smollm2)")
    ap.add_argument("--updates", type=int, default=40, help="policy updates an arm (default 40)")
    ap.add_argument("--freeze-layers", type=int, default=15, help="model.freeze_layers (default 15, the recipe's: the top 15 of SmolLM2's 30 train)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: every core)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="0,8", help="the arms, comma-separated: train.length_buckets, with :N for "
                    "ONEDNN_PRIMITIVE_CACHE_CAPACITY=N (default 0,8; e.g. 0,8,8:256)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds an arm may take (default 3600)")
    args = ap.parse_args()
    arms = {spec: arm(args.model, spec, args) for spec in args.arms.split(",")}
    print(f"\n{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} threads, {args.model}, {args.updates} updates an arm\n")
    print("| train.length_buckets[:oneDNN cache capacity] | resident after update 1, GiB | after the last, GiB | peak, GiB | s an update | episode tokens |")
    print("|---|---|---|---|---|---|")
    for b, r in arms.items():
        times = r["times"][1:] or r["times"]
        print(f"| {b} | {r['rss'][0]:.2f} | {r['rss'][-1]:.2f} | {r['peak_gib']:.2f} | {sum(times) / len(times):.2f} | {r['tokens']:,} |")
    for b, r in arms.items():
        print(f"{b}: resident every 5 updates " + " ".join(f"{x:.2f}" for x in r["rss"][::5]))


if __name__ == "__main__":
    main()
