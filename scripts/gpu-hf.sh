#!/usr/bin/env bash
# The engine on the GPU machine (issue 16): builds gk-hf-check, gk-rl-demo and
# the CUDA graph tests against its libtorch and checks the engine with CUDA
# graphs against Hugging Face transformers, in dense, FP8 and W4A16.
#
# Two sizes of reference:
#   tiny    made here (the GPU machine has no package index) and carried in
#           .devdeps/hfref/<arch> (git-ignored):
#             for a in llama qwen3 qwen3_moe; do
#               python3 tests/hf/make_reference.py --arch $a --out .devdeps/hfref/$a --dtype bfloat16 --steps 2
#             done
#   medium  160M parameters dense, 290M MoE (tests/hf/make_reference.py's
#           SIZES): too large to carry, so made there, on its CPUs, with
#           transformers unpacked from the wheels that scripts/fetch-gpu-deps.sh
#           puts in .devdeps/wheels. Built in the background while the C++
#           build runs, with 3 training updates before step 0 (--warmup 3:
#           a random initialization's logits are so small that relative
#           differences there measure rounding noise). GK_MEDIUM=0 skips them.
# Then, through the device tool, with carry [".devdeps"]:
#   bash scripts/gpu-hf.sh
# Also run: the stale-pointer test of the CUDA replay backend, and 30 more
# FP8 engine starts (the false capture refusal of docs/gpu-runs.md).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
LOG=${OUT:-/tmp}
MED=/tmp/gk-hfmed
if [ "${GK_MEDIUM:-1}" = 1 ] && ls .devdeps/wheels/*.whl > /dev/null 2>&1; then
  rm -rf "$MED" /tmp/gk-pyref && mkdir -p "$MED" /tmp/gk-pyref
  for w in .devdeps/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/gk-pyref; done
  for a in llama qwen3 qwen3_moe; do
    (PYTHONPATH=/tmp/gk-pyref python3 tests/hf/make_reference.py --arch $a --size medium --dtype bfloat16 \
       --steps 2 --warmup 3 --threads 4 --out "$MED/$a" > "$LOG/medref-$a.log" 2>&1; echo "exit $?" >> "$LOG/medref-$a.log") &
  done
fi
export GK_TARGETS="gk-hf-check gk-rl-demo test_cuda_graph test_cuda_graph_addresses"
export GK_CTEST_ARGS="-R cuda_graph"
export GK_AFTER="
echo '== stale pointer in kernel-parameter padding'
./tests/test_cuda_graph -s -tc='a stale pointer*' 2>&1 | grep -E 'MESSAGE|raw scan|ERROR|test cases|assertions' | head -8
for a in llama qwen3 qwen3_moe; do for f in dense fp8 w4a16; do
  echo \"== hf-check tiny \$a \$f\"; ./examples/gk-hf-check --ref $REPO/.devdeps/hfref/\$a --device cuda --format \$f | tail -4; done; done
echo '== 30 more FP8 starts (3 archs x 10)'
refused=0; for i in 1 2 3 4 5 6 7 8 9 10; do for a in llama qwen3 qwen3_moe; do
  ./examples/gk-hf-check --ref $REPO/.devdeps/hfref/\$a --device cuda --format fp8 > /tmp/start.log 2>&1 || { refused=\$((refused+1)); grep -m3 -E 'refused|node|error' /tmp/start.log; }
done; done; echo \"FP8 starts failed: \$refused of 30\"
echo '== negative: one FP8 scale left out of copy-back'
./examples/gk-hf-check --ref $REPO/.devdeps/hfref/llama --device cuda --format fp8 --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ | tail -3
echo '== demo dense'; ./examples/gk-rl-demo --steps 3 --work /tmp/gk-demo-dense | tail -6
echo '== demo fp8'; ./examples/gk-rl-demo --steps 3 --quant fp8 --work /tmp/gk-demo-fp8 | tail -6
echo '== demo w4a16'; ./examples/gk-rl-demo --steps 3 --quant w4a16 --work /tmp/gk-demo-w4a16 | tail -6
if [ -d $MED ]; then
  echo '== waiting for the medium references'
  while [ \$(cat $LOG/medref-*.log 2>/dev/null | grep -c '^exit ') -lt 3 ]; do sleep 5; done
  for a in llama qwen3 qwen3_moe; do tail -5 $LOG/medref-\$a.log; done
  for a in llama qwen3 qwen3_moe; do for f in dense fp8 w4a16; do
    echo \"== hf-check medium \$a \$f\"; ./examples/gk-hf-check --ref $MED/\$a --device cuda --format \$f | tail -5; done; done
fi
"
bash scripts/gpu.sh
