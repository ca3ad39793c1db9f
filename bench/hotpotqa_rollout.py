"""Episodes per minute of the HotpotQA recipe's rollout with the real model, and the share of the
machine's peak it reaches: the in-process engine with and without the KV cache kept across turns
(`rollout.reuse_kv_tokens`), and vLLM's CPU build as an engine server (`engine.servers=1
engine.server_kind=vllm`, its prefix caching on; `make vllm` first), side by side in one run.

    python bench/hotpotqa_rollout.py --model runs/hotpotqa/sft/checkpoints/step_30/model --recipe-dir runs/hotpotqa
    python bench/hotpotqa_rollout.py ... --questions 8 --group 8 --arms 0,40000 --threads 2
    python bench/hotpotqa_rollout.py ... --arms 40000,vllm      # the in-process engine against vLLM
    python bench/hotpotqa_rollout.py ... --arms 40000@bfloat16,vllm@bfloat16   # both engines in bf16
    python bench/hotpotqa_rollout.py ... --arms 40000,40000@bfloat16 --questions 16 --group 1 --branches 8
                                      # the engine on a bf16 copy (engine.dtype), GRPO's rollout with answer branches

Each arm samples the same `--questions` training questions × `--group` episodes at the recipe's
rollout settings (examples/hotpotqa_smollm2_recipe.yaml: temperature 0.7, 2 searches, 40 tokens a
turn, BM25 top 3 with 40-word passages), seeded per episode, with `seekrl eval`'s evaluator (the
workflow and engine the GRPO stage uses; nothing is trained). Printed per arm: wall seconds,
episodes per minute, sampled tokens per second, prefilled and reused tokens, and the rollout's
useful FLOP rate (2 × parameters × (sampled + prefilled tokens)) as a fraction of this process's
measured fp32 matmul peak (bench/mfu.py `matmul_peak`). `--greedy` measures what `seekrl eval`
does instead: temperature 0, at most one engine batch of episodes in flight (build.eval_in_flight),
e.g. `--questions 100 --group 1 --greedy`; `--branches K` samples GRPO's rollout with answer
branches (rollout.answer_branches, at `--branch-temperature`). An arm `N@bfloat16` is the
in-process engine on a bfloat16 copy of the weights (engine.dtype; its FLOP rate is still taken
against the fp32 peak), `vllm@bfloat16` the vLLM server started with `--dtype bfloat16`. The
fp32 in-process arms' tokens agree (the reuse is exact to float rounding), so their work differs
only by the prefill the store saves. The vLLM arm
samples other tokens (its own sampler and kernels); its time includes nothing of the server's
start-up, and its prefilled tokens are unknown (prefix caching happens inside the server), so its
FLOP rate counts the sampled tokens only: a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


VLLM = ["engine.servers=1", "engine.server_kind=vllm", "engine.server_args=[--max-model-len,1536]"]


def arm(args, name: str) -> dict:
    from seekrl.build import build_eval, rollout_workflow
    from seekrl.config import load_config
    from seekrl.evaluate import evaluate

    d = Path(args.recipe_dir)
    reuse, _, dtype = name.partition("@")  # "40000@bfloat16" / "vllm@bfloat16": the engine in bf16 (engine.dtype)
    vllm = reuse == "vllm"
    cfg = load_config(str(ROOT / "examples" / "hotpotqa_smollm2_recipe.yaml"), [
        f"model.path={args.model}", f"data.eval={d / 'data' / 'train.jsonl'}", f"data.max_eval={args.questions}",
        f"tools.retriever={d / 'index'}", f"log.dir={args.out_dir}", f"log.name={'' if vllm else 'reuse'}{name.replace('@', '_')}",
        "log.progress=false", f"rollout.reuse_kv_tokens={0 if vllm else int(reuse)}", "model.freeze_layers=0",
        "train.mixed_precision=fp32", *(VLLM if vllm else []), *([f"engine.dtype={dtype}"] if dtype else []),
        f"rollout.answer_branches={args.branches}",  # the recipe's own default is 4: the bench's --branches decides
        *([f"rollout.branch_temperature={args.branch_temperature}", f"rollout.branch_from={args.branch_from}"]
          if args.branches > 1 else [])])
    run = build_eval(cfg)  # (vLLM: the server is up when this returns)
    try:
        params = run.params if args.greedy else dataclasses.replace(run.params, temperature=cfg.rollout.temperature)
        workflow = rollout_workflow(run.workflow, cfg.rollout.answer_branches, cfg.rollout.branch_temperature, cfg.rollout.branch_from)
        t0 = time.perf_counter()
        metrics, groups = asyncio.run(evaluate(workflow, run.engine, run.tasks, args.group, params, run.primary_reward,
                                               max_in_flight=run.max_in_flight if args.greedy else None))
        trajs = [t for g in groups for t in g.trajectories]
        wall = time.perf_counter() - t0
        stats = {} if vllm else dict(run.engine.stats)
    finally:
        run.close()
    n_params = _n_params(args.model)
    sampled = sum(t.num_sampled for t in trajs) if vllm else stats["tokens"]
    prefilled = stats.get("prefill_tokens")
    return {"arm": name, "vllm": vllm, "episodes": len(trajs), "wall_s": wall, "episodes_per_min": 60 * len(trajs) / wall,
            "sampled_tokens": sampled, "prefill_tokens": prefilled, "reused_tokens": stats.get("reused_tokens"),
            "sampled_tok_per_s": sampled / wall, "flops": 2 * n_params * (sampled + (prefilled or 0)), "em": metrics.get("eval/em"),
            "tokens_digest": hash(tuple(tuple(t.completion_ids) for t in trajs))}


def _n_params(model_dir: str) -> int:
    """The model's parameters, tied weights once (built on the meta device: no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def _n(value) -> str:
    return "—" if value is None else f"{value:,}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the recipe's SFT checkpoint (DIR/sft/checkpoints/step_N/model)")
    p.add_argument("--recipe-dir", required=True, help="the recipe's folder (its data/ and index/)")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--arms", default="0,40000", help="comma-separated rollout.reuse_kv_tokens values of the in-process "
                   "engine, `vllm` for a vLLM engine server; `@bfloat16` after either: that engine in bf16")
    p.add_argument("--greedy", action="store_true", help="as seekrl eval samples: greedy, one engine batch in flight")
    p.add_argument("--branches", type=int, default=1, help="rollout.answer_branches of GRPO's rollout (1: none)")
    p.add_argument("--branch-temperature", type=float, default=1.0, help="rollout.branch_temperature with --branches > 1")
    p.add_argument("--branch-from", choices=("turn", "answer"), default="turn", help="rollout.branch_from with --branches > 1")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out-dir", default="runs/bench/hotpotqa_rollout")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import torch
    from mfu import matmul_peak

    torch.set_num_threads(args.threads)
    peak = matmul_peak(2048, torch.float32, "cpu")
    rows = [arm(args, a.strip()) for a in args.arms.split(",")]
    print(f"CPU, {args.threads} threads: fp32 matmul peak {peak / 1e9:.1f} GFLOP/s; {args.questions} questions x {args.group} episodes")
    print("| engine (rollout.reuse_kv_tokens) | wall s | episodes/min | sampled tok/s | prefilled tokens | reused tokens | GFLOP/s (share of peak) | EM |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        rate = r["flops"] / r["wall_s"]
        r["share_of_peak"] = rate / peak
        label = (f"vLLM server ({r['arm'].replace('@', ', engine.dtype=')}; sampled tokens only)" if r["vllm"]
                 else f"in-process ({r['arm'].replace('@', ', engine.dtype=')})")
        print(f"| {label} | {r['wall_s']:.1f} | {r['episodes_per_min']:.1f} | {r['sampled_tok_per_s']:.1f} | "
              f"{_n(r['prefill_tokens'])} | {_n(r['reused_tokens'])} | {rate / 1e9:.1f} ({100 * r['share_of_peak']:.1f}%) | {r['em']:.3f} |")
    local = [r for r in rows if not r["vllm"] and "@" not in r["arm"]]  # a bf16 engine samples other tokens
    same = len({r["tokens_digest"] for r in local}) <= 1
    if len(local) > 1:
        print(f"same sampled tokens in every in-process arm: {same}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "peak_flops": peak, "rows": rows, "same_tokens": same}, indent=2))


if __name__ == "__main__":
    main()
