"""Whole GRPO steps on the in-process engine against a vLLM server: the same run, one after the other.

    python bench/grpo_engines.py --steps 3 CONFIG OVERRIDES...               # local, then vllm
    python bench/grpo_engines.py --steps 3 --arms vllm,local CONFIG OVERRIDES...

The same `seekrl train CONFIG OVERRIDES` (one run folder per arm under `--out`, the first
`--steps` steps of it: `train.max_steps_this_run`, so the learning-rate schedule is the whole
run's), once per arm, each alone with every core:

- `local`: the engine as the config says (in the trainer's process; `engine.dtype` as given);
- `vllm`: the same config with the engine keys `demo.grpo_engine=vllm` gives the HotpotQA recipe's
  GRPO stages (`engine.servers=1 engine.server_kind=vllm`, `--max-model-len` = model.max_context
  unless engine.server_args gives it; vLLM's CPU build from `make vllm`): the run starts the
  server, samples on it, syncs the weights to it after every update, and stops it.

Per arm: the wall time of the whole command (model load and the server's start included), and over
its steps the step, rollout and weight-sync seconds, the sampled tokens (the two engines sample other
tokens, so their episodes differ in length: compare seconds per sampled token too), the mean reward
and the engine / trainer log-prob gap (`mismatch/kl`). A run that passes `--timeout` seconds is
stopped (recipes/children.py: its whole process group, the server included) and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seekrl.observe.loggers import read_metrics  # noqa: E402 (after the path)
from child_arm import add_run_arguments, fresh_out  # noqa: E402
from seekrl.config import load_config  # noqa: E402
from seekrl.recipes.children import Child, run_at_once, steps_done  # noqa: E402
from seekrl.recipes.hotpotqa import grpo_engine_overrides  # noqa: E402

def _arm_overrides(arm: str, config: str, overrides: list[str]) -> list[str]:
    """The engine keys of an arm: none for local; for vllm, those `demo.grpo_engine=vllm` gives the
    HotpotQA recipe's GRPO stages (recipes/hotpotqa.py `grpo_engine_overrides`)."""
    if arm == "local":
        return []
    if arm == "vllm":
        return grpo_engine_overrides(load_config(config, [*overrides, "demo.grpo_engine=vllm"]))
    raise SystemExit(f"bench/grpo_engines.py: unknown arm '{arm}'; use local or vllm")


def _summary(rows: list[dict], wall: float) -> dict:
    steps = [r for r in rows if r.get("step", 0) > 0 and "time/step_s" in r]
    total = lambda key: sum(r.get(key, 0.0) for r in steps)  # noqa: E731
    sampled = int(total("tokens/sampled"))
    sync = max((r.get("engine/weight_sync_s", 0.0) for r in steps), default=0.0)  # a running total
    return {"steps": len(steps), "wall_s": round(wall, 1), "step_s": round(total("time/step_s"), 1),
            "rollout_s": round(total("time/rollout_s"), 1), "weight_sync_s": round(sync, 1), "sampled_tokens": sampled,
            "step_ms_per_sampled_token": round(1000 * total("time/step_s") / max(1, sampled), 1),
            "per_step_s": [round(r["time/step_s"], 1) for r in steps],
            "reward_mean": round(total("reward/mean") / max(1, len(steps)), 4),
            "mismatch_kl": round(max((r.get("mismatch/kl", 0.0) for r in steps), default=0.0), 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(ap, "runs/bench/grpo_engines")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--arms", default="local,vllm", help="comma-separated: local, vllm (run in this order)")
    args = ap.parse_args()
    out, config = fresh_out(args)
    result = {}
    for arm in args.arms.split(","):
        over = [*args.overrides, *_arm_overrides(arm, config, args.overrides), f"log.dir={out}", f"log.name={arm}",
                f"train.max_steps_this_run={args.steps}", "log.progress=false"]
        kid = Child(arm, [sys.executable, "-m", "seekrl.cli", "train", config, *over], out / f"{arm}.log",
                    done=steps_done(out / arm), total=args.steps)
        start = time.perf_counter()
        run_at_once([kid], args.threads, timeout_s=args.timeout)
        result[arm] = _summary(read_metrics(out / arm), time.perf_counter() - start)
        print(json.dumps({arm: result[arm]}), flush=True)
    print("| arm | steps | wall s (with start-up) | step s | rollout s | weight sync s | sampled tokens | ms a sampled token "
          "| mean reward | max mismatch/kl |\n|---|---|---|---|---|---|---|---|---|---|")
    for arm, r in result.items():
        print(f"| {arm} | {r['steps']} | {r['wall_s']} | {r['step_s']} | {r['rollout_s']} | {r['weight_sync_s']} | {r['sampled_tokens']:,} "
              f"| {r['step_ms_per_sampled_token']} | {r['reward_mean']} | {r['mismatch_kl']} |")
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
