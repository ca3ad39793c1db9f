#!/usr/bin/env bash
# The GPU checks of the engine servers, in one go (BENCHMARKS.md, "Engine servers"):
#   bash bench/gpu_engine_check.sh OUTDIR
# Run from the repository root on a CUDA machine where seekrl imports (pip install -e . or
# PYTHONPATH=.). It writes its figures and logs to OUTDIR:
#   1. `seekrl serve engine` vs LocalEngine in-process vs transformers' generate, tokens/s at 1, 8
#      and 32 concurrent clients, and the disk weight sync time, on a Qwen2.5-0.5B-shaped model
#      in bfloat16 (bench/engine_server.py);
#   2. the tiny GRPO run on the GPU, in-process and with engine.servers=2 (trainer and both
#      servers on the one GPU), 100 steps each: the learning curves and step times side by side.
set -uo pipefail
OUT=${1:-/tmp/seekrl-gpu}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"

python bench/engine_server.py --model qwen0.5b-random --device cuda --dtype bfloat16 --max-new 128 --requests 4 \
  --clients 1,8,32 --max-batch-size 64 --syncs 5 --hf --out "$OUT/engine_qwen05b.json" > "$OUT/engine_qwen05b.txt" 2>&1
tail -12 "$OUT/engine_qwen05b.txt"

common=(examples/tiny_grpo.yaml model.device=cuda train.steps=100 data.eval=null log.dir="$OUT/runs" log.progress=false
        log.tensorboard=false log.samples_every=0)
for arm in local remote; do
  extra=()
  [ "$arm" = remote ] && extra=(engine.servers=2)
  start=$SECONDS
  python -m seekrl train "${common[@]}" log.name="tiny_$arm" "${extra[@]}" > "$OUT/tiny_$arm.log" 2>&1
  echo "tiny GRPO $arm: exit $? in $((SECONDS - start)) s"
  cp "$OUT/runs/tiny_$arm/metrics.jsonl" "$OUT/tiny_${arm}_metrics.jsonl" 2>/dev/null
done
python - "$OUT" <<'EOF'
import json, sys
for arm in ("local", "remote"):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/tiny_{arm}_metrics.jsonl")]
    except OSError:
        print(arm, "no metrics"); continue
    r = [d["reward/mean"] for d in rows if "reward/mean" in d]
    q = max(1, len(r) // 4)
    steps = [d["time/step_s"] for d in rows if "time/step_s" in d]
    print(f"{arm}: {len(r)} steps, reward first quarter {sum(r[:q]) / q:.3f}, last quarter {sum(r[-q:]) / q:.3f}, "
          f"mean step {sum(steps) / len(steps):.3f} s, server failures {rows[-1].get('engine/server_failures', 0)}")
EOF
echo "servers left: $(pgrep -fc 'seekrl serve engine' || true)"
