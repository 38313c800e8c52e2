#!/usr/bin/env bash
# Builds what test_online_reload needs under ThreadSanitizer and runs it
# (.ci/run calls this after scripts/sanitize.sh; scripts/setup.sh must have
# run). The online reload stages on one thread while another replays the
# captured graphs and commits between replays (Note [Online reload threading]
# in reload/staged_reload.cpp); this is the run that checks the engine's own
# synchronisation. libtorch is not instrumented: what is reported from inside
# it is suppressed by tests/tsan.supp, with the reason next to each entry.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${GK_TSAN_BUILD_DIR:-build-tsan}
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DGRAPHKEEP_CUDA=OFF -DGRAPHKEEP_SANITIZE=thread \
  -DGRAPHKEEP_BUILD_EXAMPLES=OFF -DGRAPHKEEP_BUILD_BENCH=OFF -DPython3_EXECUTABLE="$(command -v python3)"
cmake --build "$BUILD" -j"$(nproc)" --target test_online_reload
echo "tsan: build took $(( $(date +%s) - start )) s"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$PWD/tests/tsan.supp"
# Fewer stage/commit/abort rounds than the main stage's 1,000, on a smaller
# model: TSan slows the replayed kernels about tenfold, and the replays must
# still overlap each stage several times.
export GK_ONLINE_ITERS=${GK_ONLINE_ITERS:-300} GK_ONLINE_HIDDEN=${GK_ONLINE_HIDDEN:-64}
ctest --test-dir "$BUILD" -R '^test_online_reload$' --output-on-failure
