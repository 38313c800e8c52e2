#!/usr/bin/env bash
# README command 1: set up, build, and run the main demo.
# CPU by default; with a CUDA device present the demo captures real CUDA graphs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
"${GK_BUILD_DIR:-build}"/examples/gk-rl-demo "$@"
