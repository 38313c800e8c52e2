#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for graphkeep and builds it.
#   - installs the missing Debian packages (apt-get) and PyTorch 2.11.0 (pip);
#   - configures with CMake (Ninja) into ${GK_BUILD_DIR:-build} and builds
#     everything, or only ${GK_BUILD_TARGETS} when set.
# Extra arguments go to the CMake configure step, e.g. -DGRAPHKEEP_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${GK_BUILD_DIR:-build}
PY=${PYTHON:-python3}
TORCH_VERSION=2.11.0

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pkgs=(cmake ninja-build g++ clang libclang-rt-14-dev libboost1.81-dev doctest-dev nlohmann-json3-dev libbenchmark-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION (pip)"
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
fi
# The Python package's build and test tools (scripts/test-python.sh): pip
# builds graphkeep with scikit-build-core and pybind11, pytest runs tests/python.
"$PY" -c "import scikit_build_core, pybind11, pytest" 2>/dev/null ||
  "$PY" -m pip install --quiet --disable-pip-version-check "scikit-build-core>=0.10" "pybind11>=2.12" "pytest>=7"
# Optional Python packages used by some tests (reference implementations).
# A pinned entry (pkg==version) is reinstalled when the installed version differs
# (transformers: the oracle of tests/hf/make_reference.py; peft: the oracle of
# the LoRA adapters, tests/python/test_lora.py).
for mod_pkg in "safetensors:safetensors" "numpy:numpy" "transformers:transformers==4.57.6" \
               "peft:peft==0.21.2"; do
  mod=${mod_pkg%%:*}; pkg=${mod_pkg##*:}
  want=""; case "$pkg" in *==*) want=${pkg##*==} ;; esac
  "$PY" -c "import $mod, sys; sys.exit(0 if '$want' in ('', $mod.__version__) else 1)" 2>/dev/null ||
    "$PY" -m pip install --quiet --disable-pip-version-check "$pkg" || true
done

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${GK_BUILD_TYPE:-RelWithDebInfo}" -DPython3_EXECUTABLE="$(command -v "$PY")" "$@"
# GK_BUILD_TARGETS: build only these targets (the demo builds only itself).
cmake --build "$BUILD_DIR" -j"$(nproc)" ${GK_BUILD_TARGETS:+--target $GK_BUILD_TARGETS}
