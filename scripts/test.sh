#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite with ctest,
# then build the Python package with pip and run its pytest suite.
# GPU tests (label gpu) report "skipped" on a machine without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh -DGRAPHKEEP_PYTHON=ON "$@"
ctest --test-dir "${GK_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" ${GK_CTEST_ARGS:-}
# The Python package: pip over the same build tree, then pytest (tests/python).
bash scripts/test-python.sh
