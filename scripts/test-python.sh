#!/usr/bin/env bash
# Builds the Python package graphkeep with pip and runs its pytest suite
# (tests/python; tests marked gpu skip without a CUDA device).
#
# pip builds over the CMake build tree that scripts/setup.sh configured with
# -DGRAPHKEEP_PYTHON=ON (scikit-build-core's build-dir), so the layers are
# compiled once: after the main build, pip only reconfigures, links nothing
# new and installs. The package goes into a virtual environment under the
# build directory that sees the system's packages (torch, transformers), so
# the machine's own Python stays as it was. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${GK_BUILD_DIR:-build}
PY=${PYTHON:-python3}
VENV=$BUILD_DIR/pyenv
[ -f "$BUILD_DIR/CMakeCache.txt" ] || { echo "test-python: run scripts/setup.sh -DGRAPHKEEP_PYTHON=ON first" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt")
start=$(date +%s)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  -Cbuild-dir="$BUILD_DIR" -Ccmake.build-type="${build_type:-Release}" .
echo "test-python: pip install took $(( $(date +%s) - start )) s"
# From the build directory: the source tree's python/graphkeep (no extension) must not shadow the installed package.
cd "$BUILD_DIR" && exec "pyenv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/python" "$@"
