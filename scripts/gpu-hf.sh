#!/usr/bin/env bash
# The engine on the GPU machine (issue 16): builds gk-hf-check and gk-rl-demo
# against its libtorch and runs them with CUDA graphs. The transformers
# references cannot be made there (no package installs): make them here and
# carry them in .devdeps/hfref (git-ignored):
#
#   for a in llama qwen3 qwen3_moe; do
#     python3 tests/hf/make_reference.py --arch $a --out .devdeps/hfref/$a --dtype bfloat16 --steps 2
#   done
#   # then, through the device tool, with carry [".devdeps"]:
#   bash scripts/gpu-hf.sh
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export GK_TARGETS="gk-hf-check gk-rl-demo"
export GK_CTEST_ARGS="-R no_ctest_here"
export GK_AFTER="
for a in llama qwen3 qwen3_moe; do for f in dense fp8 w4a16; do
  echo \"== hf-check \$a \$f\"; ./examples/gk-hf-check --ref $REPO/.devdeps/hfref/\$a --device cuda --format \$f; done; done
echo '== negative: one FP8 scale left out of copy-back'
./examples/gk-hf-check --ref $REPO/.devdeps/hfref/llama --device cuda --format fp8 --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ | tail -3
echo '== demo dense'; ./examples/gk-rl-demo --steps 3 --work /tmp/gk-demo-dense | tail -6
echo '== demo fp8'; ./examples/gk-rl-demo --steps 3 --quant fp8 --work /tmp/gk-demo-fp8 | tail -6
echo '== demo w4a16'; ./examples/gk-rl-demo --steps 3 --quant w4a16 --work /tmp/gk-demo-w4a16 | tail -6
echo '== demo unprotected'; ./examples/gk-rl-demo --steps 2 --quant fp8 --work /tmp/gk-demo-unprot --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ | tail -2
"
bash scripts/gpu.sh
