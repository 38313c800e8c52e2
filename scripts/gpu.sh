#!/usr/bin/env bash
# The one entry point for the GPU machine: one suite per call, each a plain
# function below (suite_<name>), nothing passed around as a string to evaluate.
#
#   bash scripts/gpu.sh deps     ON THE BUILD MACHINE: fills .devdeps/ (git-ignored)
#                                with what the GPU machine lacks, to carry there
#   bash scripts/gpu.sh test     build everything against the GPU machine's
#                                libtorch, run ctest -L gpu
#   bash scripts/gpu.sh hf       the engine on CUDA graphs against Hugging Face
#                                transformers (dense, FP8, W4A16; tiny and medium)
#   bash scripts/gpu.sh online   online reload at Llama-3-8B and Qwen3-30B-A3B shapes
#   bash scripts/gpu.sh decode   the example engine's decode step: its GPU tests, then
#                                against the read roofline and a plain PyTorch decoder
#   bash scripts/gpu.sh record   the recorded run behind docs/gpu-runs.md,
#                                docs/sites.md and docs/performance.md
#   bash scripts/gpu.sh python   the Python package: pip build, gpu pytest, audit cost
#   bash scripts/gpu.sh delta    weight patches: GPU tests, bench_delta at 8B and 30B-A3B
#   bash scripts/gpu.sh lora     LoRA adapters: the swap stress test on CUDA graphs, gk-lora-bench at 8B
#   bash scripts/gpu.sh scaling  streaming reloads of the same bytes in more tensors (gk-online-bench)
#   bash scripts/gpu.sh pack     ON THE BUILD MACHINE: test and bench binaries built here,
#                                into .gpu-bin/ (git-ignored), to carry instead of building there
#   bash scripts/gpu.sh packed   the gpu suites of the carried .gpu-bin/test_* binaries
#
# The GPU machine has PyTorch 2.11 (libtorch, CUDA 13, nvcc 13, g++ 13) but
# no package index: run `deps` here first, then every other suite there
# through the device tool with carry [".devdeps"]. docs/gpu-runs.md records
# every run.
#
# Knobs for every GPU suite:
#   GK_BUILD_DIR   build directory (default /tmp/gk-build)
#   GK_CMAKE_ARGS  extra arguments to the configure step
#   GK_TARGETS     build only these targets (replaces the suite's list;
#                  an empty suite list means everything)
#   GK_CTEST_ARGS  replaces the suite's ctest selection, e.g. "-R test_sites"
# Logs go to $OUT (when set) so they come back from the device tool. Further
# commands after a suite go on the same command line, e.g.
#   bash scripts/gpu.sh test; /tmp/gk-build/bench/bench_manifest_extract --benchmark_min_time=0.2
#
# Adding a suite: write a function suite_<name> below (build what it needs
# with `build`, run its tests with `gpu_ctest`, then its own commands, and
# return the tests' status), and add a line for it above.
# shellcheck disable=SC2317 # the suites are called through "suite_$1"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
BUILD=${GK_BUILD_DIR:-/tmp/gk-build}
LOG=${OUT:-/tmp}

# --- steps shared by the suites ------------------------------------------------

# Unpacks the carried Debian packages (header-only dependencies) into
# /tmp/devdeps and points CMake at them and at PyTorch's own libtorch.
gpu_env() {
  local deb torch_cmake
  mkdir -p /tmp/devdeps
  for deb in .devdeps/*.deb; do
    [ -e "$deb" ] || { echo "gpu.sh: no .devdeps/*.deb: run 'bash scripts/gpu.sh deps' on the build machine and carry .devdeps" >&2; return 1; }
    dpkg -x "$deb" /tmp/devdeps
  done
  torch_cmake=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  export CMAKE_PREFIX_PATH="$torch_cmake:/tmp/devdeps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="/tmp/devdeps/usr/include${CPATH:+:$CPATH}"
  export TORCH_CUDA_ARCH_LIST=9.0
}

# build [TARGET...]: configures $BUILD (RelWithDebInfo) and builds the targets
# (all of them when none is given; GK_TARGETS replaces the list).
build() {
  local cmake_args=() names=("$@") targets=() t
  gpu_env || return 1
  {
    echo "== $(date -u) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    echo "== g++ $(g++ -dumpversion), nvcc $(nvcc --version | tail -2 | head -1), torch $(python3 -c 'import torch;print(torch.__version__)')"
  } | tee "$LOG/gpu-env.txt"
  read -ra cmake_args <<< "${GK_CMAKE_ARGS:-}"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}" > "$LOG/configure.log" 2>&1 \
    || { tail -50 "$LOG/configure.log"; return 1; }
  [ -n "${GK_TARGETS+set}" ] && read -ra names <<< "$GK_TARGETS"
  for t in "${names[@]}"; do targets+=(--target "$t"); done
  cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" > "$LOG/build.log" 2>&1 \
    || { grep -E "error|Error" "$LOG/build.log" | head -40; return 1; }
  echo "== build ok"
}

# gpu_ctest [CTEST ARG...]: runs the tests labelled gpu (GK_CTEST_ARGS
# replaces the arguments); returns ctest's status.
gpu_ctest() {
  local args=("$@")
  [ -n "${GK_CTEST_ARGS+set}" ] && read -ra args <<< "$GK_CTEST_ARGS"
  ctest --test-dir "$BUILD" -L gpu --output-on-failure "${args[@]}" 2>&1 | tee "$LOG/ctest-gpu.log"
  return "${PIPESTATUS[0]}"
}

# --- the suites ----------------------------------------------------------------

# On the build machine: what the GPU machine lacks, into .devdeps/.
#   *.deb    Boost 1.81, doctest, nlohmann-json, Google Benchmark (Debian
#            packages; `gpu_env` unpacks them there).
#   wheels/  the oracle's Python packages (transformers and what it imports) at
#            the versions installed here, for the GPU machine's Python 3.12:
#            `hf` unpacks them there to build the medium-size references.
#   hfref/   the tiny transformers references `hf` checks against (made here:
#            the GPU machine has no package index; GK_HFREF=0 skips them).
suite_deps() {
  local pins a
  mkdir -p .devdeps/wheels
  ls /var/lib/apt/lists/*_Packages > /dev/null 2>&1 || apt-get update -qq
  (cd .devdeps && apt-get download libboost1.81-dev doctest-dev nlohmann-json3-dev libbenchmark-dev libbenchmark1debian \
      2>&1 \
    | grep -v 'unsandboxed') || true
  ls .devdeps/*.deb > /dev/null || return 1
  ls -la .devdeps
  pins=$(python3 -m pip freeze 2>/dev/null | grep -iE '^(transformers|tokenizers|huggingface.hub|safetensors|regex|pyyaml|tqdm|requests|urllib3|idna|charset.normalizer|certifi|numpy|hf.xet|packaging|filelock|peft|accelerate|psutil)==')
  # shellcheck disable=SC2086 # one requirement per word
  python3 -m pip download --quiet --disable-pip-version-check --no-deps -d .devdeps/wheels $pins --python-version 3.12 \
    --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    || return 1
  du -sh .devdeps/wheels
  if [ "${GK_HFREF:-1}" = 1 ]; then
    for a in llama qwen3 qwen3_moe; do
      echo "== tiny reference $a"
      python3 tests/hf/make_reference.py --arch "$a" --out ".devdeps/hfref/$a" --dtype bfloat16 --steps 2 || return 1
    done
    python3 tests/hf/make_reference.py --arch llama --rope llama3 --out .devdeps/hfref/llama_rope_llama3 \
      --dtype bfloat16 --steps 2 || return 1
  fi
}

# Builds everything and runs every test labelled gpu.
suite_test() {
  build || return 1
  gpu_ctest
}

# The engine with CUDA graphs against Hugging Face transformers, in dense, FP8
# and W4A16, at two sizes of reference:
#   tiny    carried in .devdeps/hfref/<arch> (made by `deps`);
#   medium  160M parameters dense, 290M MoE (tests/hf/make_reference.py's
#           SIZES): too large to carry, so made there, on its CPUs, with
#           transformers unpacked from .devdeps/wheels, in the background while
#           the C++ build runs; 3 training updates before step 0 (--warmup 3:
#           a random initialization's logits are so small that relative
#           differences there measure rounding noise). GK_MEDIUM=0 skips them.
# Also: the stale-pointer test of the CUDA replay backend, 30 more FP8 engine
# starts (the false capture refusal of docs/gpu-runs.md), one FP8 scale left
# out of copy-back (must fail), and the RL demo in each format.
suite_hf() {
  local tiny=$REPO/.devdeps/hfref med=/tmp/gk-hfmed arches=(llama qwen3 qwen3_moe) formats=(dense fp8 w4a16)
  local pids=() a f i w rc refused
  if [ "${GK_MEDIUM:-1}" = 1 ] && ls .devdeps/wheels/*.whl > /dev/null 2>&1; then
    rm -rf "$med" /tmp/gk-pyref && mkdir -p "$med" /tmp/gk-pyref
    for w in .devdeps/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/gk-pyref; done
    for a in "${arches[@]}"; do
      PYTHONPATH=/tmp/gk-pyref python3 tests/hf/make_reference.py --arch "$a" --size medium --dtype bfloat16 \
        --steps 2 --warmup 3 --threads 4 --out "$med/$a" > "$LOG/medref-$a.log" 2>&1 &
      pids+=($!)
    done
  fi
  build gk-hf-check gk-rl-demo test_cuda_graph test_cuda_graph_addresses || return 1
  gpu_ctest -R cuda_graph
  rc=$?
  cd "$BUILD" || return 1
  echo '== stale pointer in kernel-parameter padding'
  ./tests/test_cuda_graph -s -tc='a stale pointer*' 2>&1 | grep -E 'MESSAGE|raw scan|ERROR|test cases|assertions' | head -8
  for a in "${arches[@]}"; do for f in "${formats[@]}"; do
    echo "== hf-check tiny $a $f"
    ./examples/gk-hf-check --ref "$tiny/$a" --device cuda --format "$f" | tail -4
  done; done
  echo '== 30 more FP8 starts (3 archs x 10)'
  refused=0
  for i in $(seq 10); do for a in "${arches[@]}"; do
    ./examples/gk-hf-check --ref "$tiny/$a" --device cuda --format fp8 > /tmp/start.log 2>&1 \
      || { refused=$((refused + 1)); grep -m3 -E 'refused|node|error' /tmp/start.log; }
  done; done
  echo "FP8 starts failed: $refused of 30"
  echo '== negative: one FP8 scale left out of copy-back'
  ./examples/gk-hf-check --ref "$tiny/llama" --device cuda --format fp8 --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ | tail -3
  for f in "${formats[@]}"; do
    echo "== demo $f"
    ./examples/gk-rl-demo --steps 3 --quant "$f" --work "/tmp/gk-demo-$f" | tail -6
  done
  if [ ${#pids[@]} -gt 0 ]; then
    echo '== waiting for the medium references'
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}"
      echo "exit $?" >> "$LOG/medref-${arches[$i]}.log"
      tail -5 "$LOG/medref-${arches[$i]}.log"
    done
    for a in "${arches[@]}"; do for f in "${formats[@]}"; do
      echo "== hf-check medium $a $f"
      ./examples/gk-hf-check --ref "$med/$a" --device cuda --format "$f" | tail -5
    done; done
  fi
  return "$rc"
}

# Online reload: gk-online-bench at Llama-3-8B shapes (bf16, and FP8 made by
# PWAL) and the Qwen3-30B-A3B-like MoE in streaming mode, then
# gk-rl-demo --online on CUDA graphs. Rows go to $OUT/online_h200.json (one
# JSON object per line). Narrower or more:
#   GK_FORMATS="dense"   llama8b formats (default "dense fp8")
#   GK_SLOTS=0           no 32-layer tiny run (graphkeep's host work per slot)
#   GK_SAFETENSORS=0     llama8b dense without the safetensors-directory source
#   GK_MOE=0             no MoE;  GK_MOE_ARGS="--stage-window-ms 12000" extra MoE args
#   GK_DEMO=0            no demo
#   e.g. GK_FORMATS=dense GK_MOE=0 GK_DEMO=0 GK_SAFETENSORS=0 GK_SLOTS=0 GK_TARGETS=gk-online-bench GK_CTEST_ARGS="-R none"
suite_online() {
  local json=$LOG/online_h200.json bench=./bench/gk-online-bench moe_args=() st=() f rc
  read -ra moe_args <<< "${GK_MOE_ARGS:-}"
  build gk-online-bench gk-rl-demo test_cuda_graph test_online_engine || return 1
  gpu_ctest -R '(test_cuda_graph|test_online_engine_gpu)$'
  rc=$?
  cd "$BUILD" || return 1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  if [ "${GK_SLOTS:-1}" = 1 ]; then
    # The 8B model's slot count (32 layers) with tiny tensors: graphkeep's own host work per slot.
    echo '== gk-online-bench tiny --layers 32'
    timeout 120 "$bench" --model tiny --layers 32 --reps 9 --stage-window-ms 500 --json "$json"
  fi
  for f in ${GK_FORMATS:-dense fp8}; do
    st=()
    [ "$f" = dense ] && [ "${GK_SAFETENSORS:-1}" = 1 ] && st=(--safetensors-dir /tmp/gk-st-8b)
    echo "== gk-online-bench llama8b $f ${st[*]}"
    timeout 240 "$bench" --model llama8b --format "$f" "${st[@]}" --json "$json"
    rm -rf /tmp/gk-st-8b
  done
  if [ "${GK_MOE:-1}" = 1 ]; then
    # Staging adopts the trainer's tensors, so it may fit beside the model;
    # without the plain baseline (a second 57 GiB model does not fit). If it
    # does not fit, the streaming reload alone.
    echo '== gk-online-bench qwen3moe30b dense (no plain baseline)'
    timeout 270 "$bench" --model qwen3moe30b --format dense --no-plain "${moe_args[@]}" --json "$json" || {
      echo '== gk-online-bench qwen3moe30b dense (streaming only)'
      timeout 240 "$bench" --model qwen3moe30b --format dense --streaming-only --json "$json"
    }
  fi
  if [ "${GK_DEMO:-1}" = 1 ]; then
    echo '== gk-rl-demo --online fp8'
    ./examples/gk-rl-demo --online --steps 3 --quant fp8 --work /tmp/gk-demo-online | tail -8
  fi
  return "$rc"
}

# The decode step of the example engine (its fast CUDA path, tokens chosen
# on the device): the GPU tests of the engine (fast path against the
# reference ops and the CPU, manifests, the CUDA sampler, the FP8 staging
# peak, serving while staging 1,000 times, stale KV rows), then per model a
# plain PyTorch decoder of the same shapes (bench/plain_decoder.py) and
# gk-decode-bench in the same run: rows to $OUT/decode_h200.json (and the
# plain decoder's to $OUT/plain_decoder.json), the reference path's row for
# Llama-8B too; then gk-online-bench at 8B bf16 on the fast decoder (at least
# 200 decode steps while staging) to $OUT/online_h200.json. About 7 minutes
# on an H200 from a fresh machine.
#   GK_DECODE_MODELS="llama8b qwen3moe30b"  the models (default both)
#   GK_DECODE_FP8=1      also llama8b in FP8
#   GK_DECODE_ONLINE=0   no online row;  GK_DECODE_ONLINE=all: FP8 (share 0.5) and the MoE too
suite_decode() {
  local json=$LOG/decode_h200.json plain=$LOG/plain_decoder.json online=$LOG/online_h200.json m rc
  build test_engine_decode test_online_engine gk-decode-bench gk-online-bench || return 1
  gpu_ctest -R '(test_engine_decode_gpu|test_online_engine_gpu)$'
  rc=$?
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  for m in ${GK_DECODE_MODELS:-llama8b qwen3moe30b}; do
    echo "== plain PyTorch decoder $m"
    timeout 240 python3 bench/plain_decoder.py --model "$m" --batch 64 --kv-len 64 --json "$plain"
    echo "== gk-decode-bench $m"
    timeout 300 "$BUILD/bench/gk-decode-bench" --model "$m" --batch 64 --kv-len 64 --plain-json "$plain" --json "$json" \
      || { echo "== gk-decode-bench $m, the measured batch's graph only"
           timeout 240 "$BUILD/bench/gk-decode-bench" --model "$m" --batch 64 --kv-len 64 --graphs batch \
             --plain-json "$plain" --json "$json"; }
    if [ "$m" = llama8b ]; then
      echo "== gk-decode-bench $m, reference path"
      timeout 240 "$BUILD/bench/gk-decode-bench" --model "$m" --batch 64 --kv-len 64 --steps 20 --reference \
        --plain-json "$plain" --json "$json"
      if [ "${GK_DECODE_FP8:-0}" = 1 ]; then
        echo "== gk-decode-bench $m fp8"
        timeout 240 "$BUILD/bench/gk-decode-bench" --model "$m" --format fp8 --batch 64 --kv-len 64 --json "$json"
      fi
    fi
  done
  if [ "${GK_DECODE_ONLINE:-1}" != 0 ]; then
    echo '== gk-online-bench llama8b dense (fast decoder)'
    timeout 240 "$BUILD/bench/gk-online-bench" --model llama8b --format dense --reps 1 --min-stage-steps 200 \
      --json "$online"
    if [ "${GK_DECODE_ONLINE:-1}" = all ]; then
      echo '== gk-online-bench llama8b fp8, stage share 0.5'
      timeout 240 "$BUILD/bench/gk-online-bench" --model llama8b --format fp8 --stage-share 0.5 --reps 1 \
        --min-stage-steps 200 --json "$online"
      echo '== gk-online-bench qwen3moe30b dense (no plain baseline)'
      timeout 300 "$BUILD/bench/gk-online-bench" --model qwen3moe30b --format dense --no-plain --reps 1 \
        --min-stage-steps 200 --json "$online"
    fi
  fi
  return "$rc"
}

# Weight patches on the device: the GPU suites of the content hash, the patch
# layer and the reload engine's patches (scatter kernel, hash kernel, CUDA
# graphs replayed across patch commits), then bench_delta at the 8B shape in
# bf16 and FP8 and at the 30B-A3B MoE shape (its full reload streamed: a
# staged copy does not fit beside it), rows appended to $OUT/delta_h200.json.
#   GK_DELTA_MODELS  which runs (default "dense fp8 moe"; also "w4a16")
suite_delta() {
  local json=$LOG/delta_h200.json m rc
  build test_content_hash test_delta test_patch_reload bench_delta || return 1
  gpu_ctest -R '(test_content_hash_gpu|test_delta_gpu|test_patch_reload_gpu)$'
  rc=$?
  cd "$BUILD" || return 1
  for m in ${GK_DELTA_MODELS:-dense fp8 moe}; do
    case $m in
      dense) echo '== bench_delta llama8b dense'
             timeout 200 ./bench/bench_delta --model llama8b --format dense \
               --densities adamw:1e-6,adamw:3e-6,0.01,0.1 --json "$json" ;;
      fp8)   echo '== bench_delta llama8b fp8'
             timeout 150 ./bench/bench_delta --model llama8b --format fp8 \
               --densities adamw:3e-6,0.01 --json "$json" ;;
      w4a16) echo '== bench_delta llama8b w4a16'
             timeout 150 ./bench/bench_delta --model llama8b --format w4a16 \
               --densities adamw:3e-6,0.01 --json "$json" ;;
      moe)   echo '== bench_delta qwen3moe30b dense (streaming full reload)'
             timeout 200 ./bench/bench_delta --model qwen3moe30b --format dense --streaming-full \
               --densities adamw:3e-6,0.01 --json "$json" ;;
    esac
    echo "== exit $?"
  done
  cd "$REPO" || return 1
  return "$rc"
}

# LoRA adapters (docs/lora.md): the adapter stress test on CUDA graphs, then
# gk-lora-bench at the 8B shape, rank 16 on every projection, batch 64, rows
# appended to $OUT/lora_h200.json (the keys the LoRA issue names; the rows go in docs/data).
suite_lora() {
  local rc
  build test_online_engine gk-lora-bench || return 1
  gpu_ctest -R 'test_online_engine_gpu$'
  rc=$?
  cd "$BUILD" || return 1
  echo '== gk-lora-bench llama8b rank 16'
  timeout 300 ./bench/gk-lora-bench --model llama8b --rank 16 --batch 64 --work "$BUILD/lora-bench" \
    --json "$LOG/lora_h200.json"
  echo "== exit $?"
  cd "$REPO" || return 1
  return "$rc"
}

# Cost per tensor or per byte: the streaming reload (trainer's tensors
# adopted) of llama8b, of the same bytes in 11.6x the tensors (llama8b-e32)
# and of DeepSeek-V3's tensor count at reduced width (dsv3-count), each
# beside a device copy of its bytes; rows appended to $OUT/scaling_h200.json.
#   GK_SCALING_MODELS  which (default "llama8b llama8b-e32 dsv3-count")
suite_scaling() {
  local m
  build gk-online-bench || return 1
  for m in ${GK_SCALING_MODELS:-llama8b llama8b-e32 dsv3-count}; do
    echo "== gk-online-bench $m --streaming-only"
    timeout 200 "$BUILD/bench/gk-online-bench" --model "$m" --format dense --streaming-only --reps 5 \
      --json "$LOG/scaling_h200.json" | tail -6
    echo "== exit $?"
  done
}

# The recorded run: `test` (build everything, ctest -L gpu), the gpu tests
# again verbosely (each site's child outcome), the RL demo on CUDA graphs, and
# the GPU benchmarks. Only these files go to $OUT (the build's own logs go to
# a temporary directory):
#   gpu_ctest.txt gpu_tests.txt demo_cuda.txt demo_cuda_unprotected.txt
#   gpu_reload.json plan_resolution.json manifest_extract.json
suite_record() {
  local R=$LOG rc
  local LOG  # `build` and `gpu_ctest` log here instead (bash scopes dynamically)
  LOG=$(mktemp -d)
  suite_test > "$R/gpu_ctest.txt" 2>&1
  rc=$?
  ctest --test-dir "$BUILD" -L gpu -V 2>&1 \
    | grep -E "TEST CASE|MESSAGE|child:|test cases:|assertions:|Test +#|Passed|Failed|Skipped" > "$R/gpu_tests.txt"
  cd "$BUILD" || return 1
  ./examples/gk-rl-demo --steps 5 > "$R/demo_cuda.txt" 2>&1
  echo "exit $?" >> "$R/demo_cuda.txt"
  ./examples/gk-rl-demo --steps 2 --quant fp8 --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ \
    > "$R/demo_cuda_unprotected.txt" 2>&1
  echo "exit $?" >> "$R/demo_cuda_unprotected.txt"
  { ./bench/bench_reload --device cuda --reps 9 --json "$R/gpu_reload.json" &&
    ./bench/bench_plan_resolution --benchmark_out="$R/plan_resolution.json" --benchmark_out_format=json \
      --benchmark_min_time=0.2 &&
    ./bench/bench_manifest_extract --benchmark_out="$R/manifest_extract.json" --benchmark_min_time=0.2
  } > /dev/null 2>&1 || echo "a benchmark failed" >> "$R/gpu_ctest.txt"
  tail -4 "$R/gpu_ctest.txt"
  grep -c MESSAGE "$R/gpu_tests.txt"
  tail -2 "$R/demo_cuda.txt" "$R/demo_cuda_unprotected.txt"
  return "$rc"
}

# The Python package (tests/python): pip builds graphkeep against the GPU
# machine's torch, then the gpu-marked pytest tests (the audit on a
# transformers Llama and on the vLLM-like layer, the engine on CUDA) and the
# audit's cost on the 35 decode graphs of an 8B-shaped decoder
# (audit_cost.json), and make_patch and publish timed from Python at 8B
# (patch_time.json; C++'s in patch_time_cpp.json where .gpu-bin is
# carried). scikit-build-core, pybind11 and pytest are in the machine's
# image; transformers comes from .devdeps/wheels.
#   GK_PYTEST=0  the benchmark only;  GK_BENCH=0  the tests only
suite_python() {
  local w rc=0 brc=0 start
  gpu_env || return 1
  if ls .devdeps/wheels/*.whl > /dev/null 2>&1; then
    rm -rf /tmp/gk-pysite && mkdir -p /tmp/gk-pysite
    for w in .devdeps/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/gk-pysite; done
    export PYTHONPATH=/tmp/gk-pysite${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c 'import torch, transformers, scikit_build_core, pybind11, pytest; print("torch", torch.__version__, "transformers", transformers.__version__, "scikit-build-core", scikit_build_core.__version__, "pybind11", pybind11.__version__, "pytest", pytest.__version__)' \
    2>&1 | tee "$LOG/gpu-python-env.txt"
  start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -Cbuild-dir=/tmp/gk-pybuild -Ccmake.build-type=Release . \
    > "$LOG/pip-build.log" 2>&1 || { grep -E "error|Error" "$LOG/pip-build.log" | head -40; return 1; }
  echo "== pip install took $(( $(date +%s) - start )) s"
  if [ "${GK_PYTEST:-1}" = 1 ]; then
    # First: the extension built here shares torch's libstdc++ (the engine's
    # crash on this machine points at a copy of its own; docs/gpu-runs.md).
    (cd /tmp && python3 -m pytest -q -p no:cacheprovider -rA "$REPO/tests/python/test_extension_runtime.py") 2>&1 \
      | tee "$LOG/pytest-runtime.log"
    (cd /tmp && python3 -m pytest -q -p no:cacheprovider -rA -s -m gpu "$REPO/tests/python") 2>&1 | tee "$LOG/pytest-gpu.log"
    rc=${PIPESTATUS[0]}
  fi
  if [ "${GK_BENCH:-1}" = 1 ]; then
    (cd /tmp && python3 "$REPO/tests/python/bench_audit_cost.py" --out "$LOG/audit_cost.json") 2>&1 | tee "$LOG/audit-cost.log"
    brc=${PIPESTATUS[0]}
    # make_patch and publish from Python at 8B; with binaries carried
    # (.gpu-bin, `pack` naming the delta benchmark), C++'s make_patch in the same call.
    (cd /tmp && python3 "$REPO/tests/python/bench_patch_time.py" --out "$LOG/patch_time.json") 2>&1 | tee "$LOG/patch-time.log"
    [ "${PIPESTATUS[0]}" -ne 0 ] && brc=1
    if [ -x .gpu-bin/run ] && [ -e .gpu-bin/bench_delta ]; then
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True .gpu-bin/run bench_delta --model llama8b --densities 0.01,0.01 \
        --json "$LOG/patch_time_cpp.json" 2>&1 | tail -3
    fi
  fi
  [ "$rc" -ne 0 ] && return "$rc"
  return "$brc"
}

# On the build machine: binaries of this machine's build (GK_PACK_BUILD,
# default build/), made for sm_90 against the same PyTorch (2.11, CUDA 13) as
# the GPU machine's, into .gpu-bin/ with .gpu-bin/run, which runs one of them
# there against that
# machine's PyTorch: carry [".gpu-bin"] and no build is needed there (a build
# there takes 150-200 s of device time). GK_PACK: the binaries, paths in the
# build directory (default the patch layer's tests and bench_delta).
#   bash scripts/gpu.sh pack                      (here)
#   bash scripts/gpu.sh packed; .gpu-bin/run bench_delta --model llama8b   (there)
suite_pack() {
  local from=${GK_PACK_BUILD:-build} b archs
  archs=$(sed -n 's/^GRAPHKEEP_CUDA_ARCHITECTURES:STRING=//p' "$from/CMakeCache.txt" 2>/dev/null)
  [ "$archs" = 90 ] || { echo "gpu.sh pack: $from is built for CUDA architectures '$archs', not 90" >&2; return 1; }
  rm -rf .gpu-bin && mkdir -p .gpu-bin/lib
  for b in ${GK_PACK:-tests/test_delta tests/test_patch_reload tests/test_content_hash bench/bench_delta}; do
    cp "$from/$b" .gpu-bin/ || return 1
  done
  # The rows' commit (bench_args.h reads it); -dirty: built from uncommitted changes.
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' 2>/dev/null || echo -dirty)" > .gpu-bin/COMMIT
  cat > .gpu-bin/run <<'RUN'
#!/usr/bin/env bash
# Runs one packed binary against this machine's PyTorch (made by scripts/gpu.sh pack).
here=$(cd "$(dirname "$0")" && pwd)
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || exit 1
export LD_LIBRARY_PATH="$here/lib:$torch_lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/$1" "${@:2}"
RUN
  chmod +x .gpu-bin/run
  du -sh .gpu-bin
}

# On the GPU machine, with .gpu-bin carried: each packed test binary's gpu
# suites; returns the first failure's status.
suite_packed() {
  local t rc=0 r
  [ -x .gpu-bin/run ] || { echo "gpu.sh: no .gpu-bin/run: run 'bash scripts/gpu.sh pack' on the build machine and carry .gpu-bin" >&2; return 1; }
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for t in .gpu-bin/test_*; do
    echo "== $(basename "$t") -ts='gpu*'"
    .gpu-bin/run "$(basename "$t")" -ts='gpu*'
    r=$?
    [ "$rc" -eq 0 ] && rc=$r
  done
  return "$rc"
}

# --- dispatch ------------------------------------------------------------------

suite=${1:-}
if [ -z "$suite" ] || ! declare -F "suite_$suite" > /dev/null; then
  echo "usage: bash scripts/gpu.sh SUITE   (suites: $(declare -F | sed -n 's/^declare -f suite_//p' | tr '\n' ' '))" >&2
  exit 2
fi
mkdir -p "$LOG"
"suite_$suite" 2>&1 | tee "$LOG/gpu-$suite.log"
exit "${PIPESTATUS[0]}"
