#!/usr/bin/env bash
# The GPU run: builds graphkeep on the GPU machine against its PyTorch 2.11
# (libtorch, CUDA 13, nvcc 13, g++ 13) and runs the tests labelled gpu.
# See ../shared/device/README.md: the Debian packages of the header-only
# dependencies travel in .devdeps/ (scripts/fetch-gpu-deps.sh fetches them).
#
#   bash scripts/gpu.sh                     build everything, run ctest -L gpu
#   GK_TARGETS="test_sites" bash scripts/gpu.sh
#   GK_AFTER="build/bench/bench_x ..." bash scripts/gpu.sh   extra commands after the tests
# Logs go to $OUT (when set) so they come back from the device tool.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
BUILD=${GK_BUILD_DIR:-/tmp/gk-build}
LOG=${OUT:-/tmp}
{
  echo "== $(date -u) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
  echo "== g++ $(g++ -dumpversion), nvcc $(nvcc --version | tail -2 | head -1), torch $(python3 -c 'import torch;print(torch.__version__)')"
} | tee "$LOG/gpu-env.txt"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${GK_CMAKE_ARGS:-} > "$LOG/configure.log" 2>&1 \
  || { tail -50 "$LOG/configure.log"; exit 1; }
targets=()
for t in ${GK_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" > "$LOG/build.log" 2>&1 || { grep -E "error|Error" "$LOG/build.log" | head -40; exit 1; }
echo "== build ok"
ctest --test-dir "$BUILD" -L gpu --output-on-failure ${GK_CTEST_ARGS:-} 2>&1 | tee "$LOG/ctest-gpu.log"
rc=${PIPESTATUS[0]}
if [ -n "${GK_AFTER:-}" ]; then
  echo "== after: $GK_AFTER"
  (cd "$BUILD" && eval "$GK_AFTER") 2>&1 | tee "$LOG/after.log"
fi
exit "$rc"
