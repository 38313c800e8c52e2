#!/usr/bin/env bash
# Online reload on the GPU machine (issue 17): gk-online-bench at Llama-3-8B
# shapes (bf16, and FP8 made by PWAL) and, unless GK_MOE=0, the
# Qwen3-30B-A3B-like MoE in streaming mode; then gk-rl-demo --online on CUDA
# graphs. Rows go to $OUT/online_h200.json (one JSON object per line).
#   through the device tool, with carry [".devdeps"]: bash scripts/gpu-online.sh
# Narrower: GK_FORMATS="dense" GK_MOE=0 GK_DEMO=0 GK_SAFETENSORS=0 GK_SLOTS=0 GK_ONLINE_TARGETS=gk-online-bench
# More: GK_MOE_ARGS="--stage-window-ms 12000" GK_ONLINE_EXTRA="./examples/gk-online-bench ... --json \$OUT/x.json" 
#           GK_ONLINE_CTEST="-R none" bash scripts/gpu-online.sh
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp}
export GK_TARGETS="${GK_ONLINE_TARGETS:-gk-online-bench gk-rl-demo test_cuda_graph test_online_engine}"
export GK_CTEST_ARGS="${GK_ONLINE_CTEST:--R (test_cuda_graph|test_online_engine_gpu)$}"
export GK_AFTER="
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if [ \"${GK_SLOTS:-1}\" = 1 ]; then
  # The 8B model's slot count (32 layers) with tiny tensors: graphkeep's own host work per slot.
  echo '== gk-online-bench tiny --layers 32'
  timeout 120 ./examples/gk-online-bench --model tiny --layers 32 --reps 9 --stage-window-ms 500 --json $LOG/online_h200.json
fi
for f in ${GK_FORMATS:-dense fp8}; do
  st=; [ \"\$f\" = dense ] && [ \"${GK_SAFETENSORS:-1}\" = 1 ] && st=\"--safetensors-dir /tmp/gk-st-8b\"
  echo \"== gk-online-bench llama8b \$f \$st\"; timeout 240 ./examples/gk-online-bench --model llama8b --format \$f \$st --json $LOG/online_h200.json
  rm -rf /tmp/gk-st-8b
done
if [ \"${GK_MOE:-1}\" = 1 ]; then
  # Staging adopts the trainer's tensors, so it may fit beside the model;
  # without the plain baseline (a second 57 GiB model does not fit). If it
  # does not fit, the streaming reload alone.
  echo '== gk-online-bench qwen3moe30b dense (no plain baseline)'
  timeout 270 ./examples/gk-online-bench --model qwen3moe30b --format dense --no-plain ${GK_MOE_ARGS:-} --json $LOG/online_h200.json || {
    echo '== gk-online-bench qwen3moe30b dense (streaming only)'
    timeout 240 ./examples/gk-online-bench --model qwen3moe30b --format dense --streaming-only --json $LOG/online_h200.json; }
fi
if [ \"${GK_DEMO:-1}\" = 1 ]; then
  echo '== gk-rl-demo --online fp8'; ./examples/gk-rl-demo --online --steps 3 --quant fp8 --work /tmp/gk-demo-online | tail -8
fi
${GK_ONLINE_EXTRA:-}
"
bash scripts/gpu.sh
