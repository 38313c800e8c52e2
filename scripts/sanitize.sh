#!/usr/bin/env bash
# Builds graphkeep's CPU parts and unit tests under AddressSanitizer and
# UndefinedBehaviorSanitizer and runs them (.ci/run calls this after the main
# test run; scripts/setup.sh must have run). libtorch itself is not
# instrumented: leak reports and ODR checks against it are switched off.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${GK_ASAN_BUILD_DIR:-build-asan}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DGRAPHKEEP_CUDA=OFF -DGRAPHKEEP_SANITIZE=address,undefined \
  -DGRAPHKEEP_BUILD_EXAMPLES=OFF -DGRAPHKEEP_BUILD_BENCH=OFF -DPython3_EXECUTABLE="$(command -v python3)"
# Only what the unit tests below run (not the soak test or the fuzz
# targets): a unit test added without its target here fails the run loudly
# ("Could not find executable").
cmake --build "$BUILD" -j"$(nproc)" --target test_registry test_safetensors safetensors_check test_hf_checkpoint hf_checkpoint_check test_reload \
  test_sites test_sites_moe test_sites_scales test_sites_marlin test_distributed test_fail_closed \
  test_structure_fuzz test_online_reload test_content_hash content_hash_check test_delta gk-patch test_patch_reload
export ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The structure fuzzer runs longer here than in the main stage (1,000
# structures there): a different stretch of seed 1414's sequence.
export GK_FUZZ_FIRST=1000 GK_FUZZ_ITERS=1500
ctest --test-dir "$BUILD" -L unit --output-on-failure -j"$(nproc)"
