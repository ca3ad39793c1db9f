#!/usr/bin/env bash
# The Search-R1 paper's ablations at small scale, from the SFT checkpoint of a finished
# `make demo` (runs/demo): GRPO as in the demo (the baseline), GRPO without observation masking,
# PPO instead of GRPO, and 3 retrieved passages instead of 1. Each arm is `seekrl train` (100 steps,
# as measured; the demo runs 60) then `seekrl eval` on the 240 test questions; RESULTS.md has the figures.
#   bash examples/demo_ablations.sh [runs/demo] [runs/ablations]
set -euo pipefail
DEMO=${1:-runs/demo}
OUT=${2:-runs/ablations}
SEEKRL=${SEEKRL:-.venv/bin/seekrl}
CFG=examples/demo_search.yaml
SFT=$DEMO/sft/checkpoints/step_600/model
[ -d "$SFT" ] || { echo "no SFT checkpoint at $SFT; run 'make demo' first" >&2; exit 2; }
COMMON=(data.train="$DEMO/world/train.jsonl" data.eval="$DEMO/world/test.jsonl" tools.retriever="$DEMO/index" log.dir="$OUT")
arm() {  # name, overrides...
  local name=$1; shift
  "$SEEKRL" train "$CFG" "${COMMON[@]}" model.path="$SFT" log.name="$name" train.steps=100 train.save_every=25 "$@"
  "$SEEKRL" eval "$CFG" "${COMMON[@]}" model.path="$OUT/$name/checkpoints/step_100/model" log.name="$name" "$@"
}
arm grpo
arm no_mask rollout.mask_observations=false
arm ppo algo.name=ppo train.critic_lr=1e-3
arm topk3 tools.topk=3
# the SFT model with 3 passages, for the topk3 arm's "before"
"$SEEKRL" eval "$CFG" "${COMMON[@]}" model.path="$SFT" log.name=sft_topk3 tools.topk=3
