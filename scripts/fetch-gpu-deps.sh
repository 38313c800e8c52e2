#!/usr/bin/env bash
# On the build machine: downloads the Debian packages that the GPU machine
# lacks (Boost 1.81, doctest, nlohmann-json, Google Benchmark) into .devdeps/
# (git-ignored), to carry to the GPU machine. See scripts/gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
grep -qxF '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -qq
(cd .devdeps && apt-get download libboost1.81-dev doctest-dev nlohmann-json3-dev libbenchmark-dev libbenchmark1debian 2>&1 \
  | grep -v 'unsandboxed' || true)
ls -la .devdeps
