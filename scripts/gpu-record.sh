#!/usr/bin/env bash
# The recorded GPU run behind docs/gpu-runs.md, docs/sites.md and
# docs/performance.md: scripts/gpu.sh (build, ctest -L gpu), then the gpu
# tests again verbosely (each site's child outcome), the RL demo on CUDA
# graphs, and the GPU benchmarks. Few files go to $OUT:
#   gpu_ctest.txt gpu_tests.txt demo_cuda.txt demo_cuda_unprotected.txt
#   gpu_reload.json plan_resolution.json manifest_extract.json
set -uo pipefail
cd "$(dirname "$0")/.."
R=${OUT:-/tmp/gk-record}
mkdir -p "$R"
B=${GK_BUILD_DIR:-/tmp/gk-build}
OUT=$(mktemp -d) bash scripts/gpu.sh > "$R/gpu_ctest.txt" 2>&1
rc=$?
ctest --test-dir "$B" -L gpu -V 2>&1 | grep -E "TEST CASE|MESSAGE|child:|test cases:|assertions:|Test +#|Passed|Failed|Skipped" > "$R/gpu_tests.txt"
(cd "$B" && ./examples/gk-rl-demo --steps 5 > "$R/demo_cuda.txt" 2>&1; echo "exit $?" >> "$R/demo_cuda.txt")
(cd "$B" && ./examples/gk-rl-demo --steps 2 --quant fp8 --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ > "$R/demo_cuda_unprotected.txt" 2>&1
 echo "exit $?" >> "$R/demo_cuda_unprotected.txt")
(cd "$B" && ./bench/bench_reload --device cuda --reps 9 --json "$R/gpu_reload.json" && \
  ./bench/bench_plan_resolution --benchmark_out="$R/plan_resolution.json" --benchmark_out_format=json \
    --benchmark_min_time=0.2 && \
  ./bench/bench_manifest_extract --benchmark_out="$R/manifest_extract.json" --benchmark_min_time=0.2) \
  > /dev/null 2>&1 || echo "a benchmark failed" >> "$R/gpu_ctest.txt"
tail -4 "$R/gpu_ctest.txt"; grep -c MESSAGE "$R/gpu_tests.txt"; tail -2 "$R/demo_cuda.txt" "$R/demo_cuda_unprotected.txt"
exit "$rc"
