#!/usr/bin/env bash
# README command 1: set up, build, and run the main demo.
# CPU by default; with a CUDA device present the demo captures real CUDA graphs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the demo and what it links: the library's layers it uses, not the
# tests, fuzzers, benchmarks or compile checks.
GK_BUILD_TARGETS=gk-rl-demo bash scripts/setup.sh
"${GK_BUILD_DIR:-build}"/examples/gk-rl-demo --work "${GK_BUILD_DIR:-build}/gk-demo-model" "$@"
