#!/usr/bin/env bash
# On the GPU machine: builds the Python package graphkeep with pip against its
# torch (2.11, CUDA 13), then runs tests/python's gpu tests (the audit on a
# transformers Llama and on the vLLM-like layer, the engine on CUDA) and the
# audit's cost on the 35 decode graphs of an 8B-shaped decoder.
#
# What must travel (carry [".devdeps"]): the Debian packages of scripts/gpu.sh
# (Boost, nlohmann-json) and the oracle's wheels (transformers 4.57.6 and what it
# imports), both fetched by scripts/fetch-gpu-deps.sh. scikit-build-core,
# pybind11 and pytest are in the machine's image; where one is missing or too
# old, put its wheel into .devdeps/wheels too (pip download, as that script does).
#
#   bash scripts/gpu-python.sh            logs and audit_cost.json go to $OUT
#   GK_BENCH=0 bash scripts/gpu-python.sh   the tests only (GK_PYTEST=0: the benchmark only)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOG=${OUT:-/tmp}
source scripts/gpu-env.sh
if ls .devdeps/wheels/*.whl > /dev/null 2>&1; then
  rm -rf /tmp/gk-pysite && mkdir -p /tmp/gk-pysite
  for w in .devdeps/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/gk-pysite; done
  export PYTHONPATH=/tmp/gk-pysite${PYTHONPATH:+:$PYTHONPATH}
fi
{
  echo "== $(date -u) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
  python3 -c 'import torch, transformers, scikit_build_core, pybind11, pytest; print("torch", torch.__version__, "transformers", transformers.__version__, "scikit-build-core", scikit_build_core.__version__, "pybind11", pybind11.__version__, "pytest", pytest.__version__)'
} 2>&1 | tee "$LOG/gpu-python-env.txt"
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -Cbuild-dir=/tmp/gk-pybuild -Ccmake.build-type=Release . \
  > "$LOG/pip-build.log" 2>&1 || { grep -E "error|Error" "$LOG/pip-build.log" | head -40; tail -20 "$LOG/pip-build.log"; exit 1; }
echo "== pip install took $(( $(date +%s) - start )) s"
cd /tmp
rc=0 brc=0
if [ "${GK_PYTEST:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider -rA -s -m gpu "$REPO/tests/python" 2>&1 | tee "$LOG/pytest-gpu.log"
  rc=${PIPESTATUS[0]}
fi
if [ "${GK_BENCH:-1}" = 1 ]; then
  python3 "$REPO/tests/python/bench_audit_cost.py" --out "$LOG/audit_cost.json" 2>&1 | tee "$LOG/audit-cost.log"
  brc=${PIPESTATUS[0]}
fi
[ "$rc" -ne 0 ] && exit "$rc"
exit "$brc"
