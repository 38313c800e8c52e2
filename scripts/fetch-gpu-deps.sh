#!/usr/bin/env bash
# On the build machine: downloads the Debian packages that the GPU machine
# lacks (Boost 1.81, doctest, nlohmann-json, Google Benchmark, xxHash) into .devdeps/
# (git-ignored), to carry to the GPU machine. See scripts/gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
grep -qxF '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -qq
(cd .devdeps && apt-get download libboost1.81-dev doctest-dev nlohmann-json3-dev libbenchmark-dev libbenchmark1debian libxxhash-dev libxxhash0 2>&1 \
  | grep -v 'unsandboxed' || true)
ls -la .devdeps
# The oracle's Python packages (transformers and what it imports), at the
# versions installed here, as wheels for the GPU machine's Python 3.12:
# scripts/gpu-hf.sh unpacks them there to build the medium-size references.
PINS=$(python3 -m pip freeze 2>/dev/null | grep -iE '^(transformers|tokenizers|huggingface.hub|safetensors|regex|pyyaml|tqdm|requests|urllib3|idna|charset.normalizer|certifi|numpy|hf.xet|packaging|filelock)==' || true)
mkdir -p .devdeps/wheels
python3 -m pip download --quiet --disable-pip-version-check --no-deps -d .devdeps/wheels $PINS --python-version 3.12 \
  --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
du -sh .devdeps/wheels
