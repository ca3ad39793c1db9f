"""Log-probs + entropy of the sampled tokens through the LM head: full float32 logits vs chunked.

    python bench/head_logprob.py                          # SmolLM2-135M's head: hidden 576, vocab 49,152
    python bench/head_logprob.py --tokens 8192 --out runs/bench/head_logprob.json

Both arms compute, for `--tokens` completion tokens, log_softmax(h W^T / T)[target] and the
entropy, then the backward of `sum(logp) - 0.01 sum(ent)` into the hidden states and the head
weight (fp32) — what the trainer does per micro-batch. `full` is the plain path (the
`(tokens, vocab)` float32 logits, logsumexp, gather, entropy, autograd); `chunked` is
`seekrl.algo.head_logprob.head_logprob_entropy`. Each arm runs in its own child process so that
its peak resident memory (ru_maxrss) is its own; the figure reported is the peak minus the
process's resident memory just before the first call (inputs and the head weight included in
the baseline). Time is the median of `--repeats` forward+backward calls.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args) -> None:
    import torch

    from seekrl.algo.head_logprob import head_logprob_entropy
    from seekrl.algo.losses import entropy_from_logits

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, generator=g).requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g)

    def full():
        z = torch.nn.functional.linear(h, w).float()
        logp = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, -1)
        return logp, entropy_from_logits(z)

    def chunked():
        return head_logprob_entropy(h, w, None, targets, 1.0, entropy=True)

    fn = full if args.arm == "full" else chunked
    base = _rss_mib()
    times = []
    for _ in range(args.repeats):
        h.grad = w.grad = None
        t0 = time.perf_counter()
        logp, ent = fn()
        (logp.sum() - 0.01 * ent.sum()).backward()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"arm": args.arm, "seconds": statistics.median(times), "peak_extra_mib": peak - base,
                      "logp_sum": float(logp.sum()), "grad_w_norm": float(w.grad.norm())}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        return worker(args)
    rows = []
    for arm in ("full", "chunked"):
        cmd = [sys.executable, __file__, "--arm", arm] + [f"--{k}={getattr(args, k)}" for k in ("tokens", "hidden", "vocab", "threads", "repeats")]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
        if out.returncode:
            sys.exit(f"bench/head_logprob.py: the {arm} arm failed: {out.stderr.strip().splitlines()[-1:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full, chunked = rows
    full_logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(f"{args.tokens} tokens, hidden {args.hidden}, vocab {args.vocab} ({full_logits_mib:.0f} MiB of float32 logits), "
          f"{args.threads} threads")
    print("| arm | forward+backward s | peak extra MiB |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['seconds']:.3f} | {r['peak_extra_mib']:.0f} |")
    summary = {"speedup": full["seconds"] / chunked["seconds"], "memory_ratio": chunked["peak_extra_mib"] / full["peak_extra_mib"],
               "same_result": abs(full["logp_sum"] - chunked["logp_sum"]) < 1e-2 * max(1.0, abs(full["logp_sum"]))}
    print(f"chunked: {summary['speedup']:.2f}x the speed, {summary['memory_ratio']:.2f}x the peak extra memory")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
