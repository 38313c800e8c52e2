# The tests of the example programs (examples/ builds them): the migration,
# the bench's smoke run, the RL-loop demo and the oracle against Hugging Face
# transformers. Included by tests/CMakeLists.txt when the examples are built.
# Every test that matches output also requires its exit status
# (gk_add_output_test; Note [Output-matched tests check the exit status] in
# tests/support/expect_output.cmake).
set(_examples ${PROJECT_SOURCE_DIR}/examples)

# A kernel author's migration (examples/migration/router_kernel.h): step 2 is
# built and run; steps 0 and 1 are compile-fail tests that check the messages
# the author gets.
gk_add_compile_check(migration.step0_no_descriptor ${_examples}/migration/migration_demo.cpp
  "graphkeep: RouterLayer::kernel_ has a class type graphkeep cannot look into" -DGK_MIGRATION_STEP=0)
gk_add_compile_check(migration.step1_no_roles ${_examples}/migration/migration_demo.cpp
  "graphkeep: TopKRouterKernel::expert_bias_ is an at::Tensor with no role" -DGK_MIGRATION_STEP=1)
gk_add_output_test(migration.step2_demo LABELS unit COMMAND gk-migration-demo
  REGEX "kept their captured addresses: yes. new values: yes")

# gk-online-bench at the tiny size on the CPU (docs/performance.md).
# (By its file: the target may be defined after tests/, in bench/.)
if(TARGET gk-online-bench OR GRAPHKEEP_BUILD_BENCH)
  gk_add_output_test(bench.online_smoke LABELS unit
    COMMAND $<TARGET_FILE:gk-online-bench> --model tiny --device cpu --batch 4
    REGEX "\"drift\":0,\"batch\":4,")
endif()

# gk-decode-bench at the tiny size on the CPU: the row's keys and its run.
if(TARGET gk-decode-bench OR GRAPHKEEP_BUILD_BENCH)
  gk_add_output_test(bench.decode_smoke LABELS unit
    COMMAND $<TARGET_FILE:gk-decode-bench> --model tiny --device cpu --batch 4 --kv-len 16 --steps 5
    REGEX "\"model\":\"tiny\",\"format\":\"dense\",\"batch\":4,\"kv_len\":16,\"decode_step_ms\":[0-9.]+,\"gpu_step_ms\":[0-9.]+")
  gk_add_output_test(bench.lora_smoke LABELS unit
    COMMAND $<TARGET_FILE:gk-lora-bench> --model tiny --device cpu --batch 4 --rank 4 --steps 5 --swaps 2
            --work ${CMAKE_BINARY_DIR}/lora-bench-work
    REGEX "\"model\":\"tiny\",\"format\":\"dense\",\"rank\":4,.*\"swap_pause_ms\":[0-9.]+,.*\"exact\":true")
endif()

# bench_delta at the tiny size on the CPU: a patch staged and committed
# serves what a full reload of its target serves, bit for bit.
if(TARGET bench_delta OR GRAPHKEEP_BUILD_BENCH)
  gk_add_output_test(bench.delta_smoke LABELS unit
    COMMAND $<TARGET_FILE:bench_delta> --model tiny --device cpu --densities adamw:1e-4,0.01 --max-batch 8
    REGEX "\"change\":\"adamw:1e-4\".*\"exact\":true.*\"change\":\"0.01\".*\"exact\":true")
endif()

# The RL-loop demo (README's first command) on the CPU replay backend, with
# the built-in model: every reload's replay equals a fresh engine built from
# the same checkpoint, dense and FP8; with one slot left out of copy-back,
# the capture manifest catches the drift, and replaying anyway gives tokens
# that differ from a fresh engine (exit status 3); a slot name that is no
# slot, and a directory that is no model, are refused (exit status 1).
set(_work ${CMAKE_BINARY_DIR}/demo-work)
set(_equals "replay after reload equals a fresh engine")
gk_add_output_test(demo.rl_loop LABELS unit COMMAND gk-rl-demo --steps 3 --device cpu --work ${_work}/dense
  REGEX "SUMMARY: 3 reloads, [0-9]+ slots tracked, drift 0, .* ${_equals}")
gk_add_output_test(demo.rl_loop_fp8 LABELS unit
  COMMAND gk-rl-demo --steps 3 --device cpu --quant fp8 --work ${_work}/fp8
  REGEX "SUMMARY: 3 reloads, [0-9]+ slots tracked, drift 0, .* ${_equals}")
# Online reload: each checkpoint staged on another thread while the demo
# keeps decoding; every output served meanwhile must equal the old weights'
# output bitwise, and the commit must then equal a fresh engine.
gk_add_output_test(demo.rl_loop_online LABELS unit
  COMMAND gk-rl-demo --steps 3 --device cpu --quant fp8 --online --work ${_work}/online
  REGEX "SUMMARY: 3 online reloads \\(staged while serving\\), [0-9]+ slots tracked, drift 0, .* ${_equals}")
# Weight patches: each step the trainer publishes the ~2% of elements it
# changed; the engine applies them exactly (the served label is the patch's
# target), dense by reload() and FP8 staged while serving.
gk_add_output_test(demo.rl_loop_delta LABELS unit
  COMMAND gk-rl-demo --steps 3 --device cpu --delta --work ${_work}/delta
  REGEX "patch step2 -> step3: [0-9]+ tensors, density 0\\.0[0-9]+ .*serving step3 .*SUMMARY: 3 patch reloads, [0-9]+ slots tracked, drift 0, .* ${_equals}")
gk_add_output_test(demo.rl_loop_delta_online LABELS unit
  COMMAND gk-rl-demo --steps 2 --device cpu --quant fp8 --delta --online --work ${_work}/delta_online
  REGEX "0 differed from the old weights' output.*layers scattered .[1-9][0-9]* derived blocks recomputed., 0 re-ran PWAL. serving step2 .*SUMMARY: 2 online patch reloads \\(staged while serving\\), [0-9]+ slots tracked, drift 0, .* ${_equals}")
# LoRA: each step the trainer publishes a random adapter; one commit swaps
# every projection's A and B (a patch, no PWAL), and the served tokens equal
# a fresh engine's with that adapter (docs/lora.md).
gk_add_output_test(demo.rl_loop_lora LABELS unit
  COMMAND gk-rl-demo --steps 3 --device cpu --lora --work ${_work}/lora
  REGEX "step 3/3  adapter swap: [1-9][0-9]* tensors, [1-9][0-9]* layers scattered, 0 re-ran PWAL.*tokens == a fresh engine with the new adapter.*SUMMARY: 3 adapter swaps, [0-9]+ slots tracked, drift 0, .* ${_equals}")
gk_add_output_test(demo.rl_loop_lora_online_fp8 LABELS unit
  COMMAND gk-rl-demo --steps 2 --device cpu --lora --online --quant fp8 --work ${_work}/lora_fp8
  REGEX "SUMMARY: 2 online adapter swaps \\(staged while serving\\), [0-9]+ slots tracked, drift 0, .* ${_equals}")
# W4A16: the packed int4 words and the scales are declared by groups of
# input channels, so a patch requantizes the groups it touches and re-runs
# no PWAL.
gk_add_output_test(demo.rl_loop_delta_w4a16 LABELS unit
  COMMAND gk-rl-demo --steps 2 --device cpu --quant w4a16 --delta --work ${_work}/delta_w4a16
  REGEX "layers scattered .[1-9][0-9]* derived blocks recomputed., 0 re-ran PWAL.*layers scattered .[1-9][0-9]* derived blocks recomputed., 0 re-ran PWAL.*SUMMARY: 2 patch reloads, [0-9]+ slots tracked, drift 0, .* ${_equals}")
gk_add_output_test(demo.rl_loop_w4a16 LABELS unit
  COMMAND gk-rl-demo --steps 2 --device cpu --quant w4a16 --work ${_work}/w4a16
  REGEX "SUMMARY: 2 reloads, [0-9]+ slots tracked, drift 0, .* ${_equals}")
gk_add_output_test(demo.rl_loop_unprotected LABELS unit EXIT 3
  COMMAND gk-rl-demo --steps 2 --device cpu --quant fp8 --work ${_work}/unprotected
          --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_
  REGEX "SUMMARY: unprotected slot model.layers.0.self_attn.qkv_.fp8_.scale_ -> drift caught by the manifest. replayed without the check, [1-9][0-9]* of [0-9]+ tokens differ")
gk_add_output_test(demo.rl_loop_bad_slot LABELS unit EXIT 1
  COMMAND gk-rl-demo --device cpu --work ${_work}/bad --unprotect model.layers.0.self_attn.no_such_slot
  REGEX "unprotected_slots names 'model.layers.0.self_attn.no_such_slot', which is no slot of the model. closest: 'model.layers.0.self_attn.")
gk_add_output_test(demo.rl_loop_bad_model LABELS unit EXIT 1 COMMAND gk-rl-demo --device cpu --model ${_examples}
  REGEX "examples/config.json: cannot open the model's config")

# The engine against Hugging Face transformers (tests/hf/README.md): for each
# architecture, tests/hf/make_reference.py builds a tiny float32 model in
# transformers, saves step0..step2 checkpoints (sharded, with AdamW updates in
# between) and transformers' logits; gk-hf-check serves step0, compares prefill
# (eager) and decode (35 captured graphs), then reloads step1 and step2 without
# recapture and compares again, in the dense, FP8 and W4A16 formats. Llama is
# untied, Qwen3 tied, Qwen3-MoE untied. The negative check leaves the FP8
# scale of one layer out of copy-back: the manifest catches the drift, and the
# graphs replayed anyway leave the tolerance.
set(_hfref ${CMAKE_BINARY_DIR}/hfref)
# gk-hf-check's line on the rotary tables: the served model's and every
# rope_scaling preset's (linear, dynamic, llama3) equal transformers' bit for bit.
set(_rope_ok "rope: tables bitwise equal to transformers': ")
foreach(arch llama qwen3 qwen3_moe)
  set(_extra "")
  if(arch STREQUAL "qwen3")
    set(_extra --tied)
  endif()
  add_test(NAME hf.reference.${arch}
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/hf/make_reference.py --arch ${arch}
                   --out ${_hfref}/${arch} --steps 2 ${_extra})
  set_tests_properties(hf.reference.${arch} PROPERTIES LABELS unit FIXTURES_SETUP hfref_${arch})
  foreach(format dense fp8 w4a16)
    gk_add_output_test(hf.check.${arch}.${format} LABELS unit
      COMMAND gk-hf-check --ref ${_hfref}/${arch} --device cpu --format ${format}
      REGEX "${_rope_ok}the served model's \\(default, 16 positions\\), default .*step2: reloaded in [0-9.]+ ms without recapture, drift 0.*\\| ok\nHF-CHECK PASS")
    set_tests_properties(hf.check.${arch}.${format} PROPERTIES FIXTURES_REQUIRED hfref_${arch})
    # The steps as weight patches, bitwise against full reloads (gk-hf-check --patch).
    # Every format's layers declare every derived tensor (the MoE's stride
    # arrays from_shapes, FP8 weights and scales by blocks of one row, W4A16
    # packed words and scales by blocks of one group: Note [Declared
    # derivations]), so no layer re-runs PWAL, and quantized patches
    # recompute only the rows or groups they touch.
    set(_rerun "0")
    set(_blocks "[1-9][0-9]*")
    if(format STREQUAL "dense")
      set(_blocks "0")
    endif()
    gk_add_output_test(hf.check.${arch}.${format}.patch LABELS unit
      COMMAND gk-hf-check --ref ${_hfref}/${arch} --device cpu --format ${format} --patch --max-batch 8
      REGEX "patch step1->step2 on step0: refused: .*base hash.*step1: patch of [0-9]+ tensors, [0-9]+ elements, [0-9]+ bytes \\([0-9]+ layers scattered, ${_rerun} re-run, ${_blocks} blocks recomputed, .*step2: patch of [0-9]+ tensors, [0-9]+ elements, [0-9]+ bytes \\([0-9]+ layers scattered, ${_rerun} re-run, ${_blocks} blocks recomputed, .* slots bitwise equal, content version equal, decode logits bitwise equal to a full reload's .*\\| ok\nHF-CHECK PASS")
    set_tests_properties(hf.check.${arch}.${format}.patch PROPERTIES FIXTURES_REQUIRED hfref_${arch})
  endforeach()
endforeach()
# Llama 3.1+'s rope scaling, "llama3" (make_reference.py --rope llama3: an
# original context of 8 positions, below the 12 compared; the first frequency
# kept, the second smoothed, the rest divided by the factor): served as
# transformers computes it, its rotary tables bitwise transformers'.
add_test(NAME hf.reference.llama_rope_llama3
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/hf/make_reference.py --arch llama --rope llama3
                 --out ${_hfref}/llama_rope_llama3 --steps 2)
set_tests_properties(hf.reference.llama_rope_llama3 PROPERTIES LABELS unit FIXTURES_SETUP hfref_llama_rope_llama3)
foreach(format dense fp8)
  gk_add_output_test(hf.check.llama_rope_llama3.${format} LABELS unit
    COMMAND gk-hf-check --ref ${_hfref}/llama_rope_llama3 --device cpu --format ${format}
    REGEX "${_rope_ok}the served model's \\(llama3, 16 positions\\), default .*step2: reloaded in [0-9.]+ ms without recapture, drift 0.*\\| ok\nHF-CHECK PASS")
  set_tests_properties(hf.check.llama_rope_llama3.${format} PROPERTIES FIXTURES_REQUIRED hfref_llama_rope_llama3)
endforeach()
# The same checkpoints served with plain RoPE (rope_scaling set to null, as
# the engine's old refusal advised): the tables differ and the logits leave
# the tolerance (0.2 % relative at step 0, 11 % at step 2, measured).
add_test(NAME hf.plain_rope_reference.setup
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/hf/strip_rope_scaling.py
                 ${_hfref}/llama_rope_llama3 ${_hfref}/llama_rope_llama3_plain)
set_tests_properties(hf.plain_rope_reference.setup PROPERTIES LABELS unit FIXTURES_REQUIRED hfref_llama_rope_llama3
                     FIXTURES_SETUP hfref_llama_rope_llama3_plain)
gk_add_output_test(hf.check.llama_rope_llama3.plain_rope LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_hfref}/llama_rope_llama3_plain --device cpu
  REGEX "rope: tables DIFFER from transformers': the served model's \\(default, 16 positions\\) \\| OUT OF TOLERANCE\nstep0: [^\n]*\\| OUT OF TOLERANCE\n.*HF-CHECK FAIL")
set_tests_properties(hf.check.llama_rope_llama3.plain_rope PROPERTIES FIXTURES_REQUIRED hfref_llama_rope_llama3_plain)
gk_add_output_test(hf.check.llama.fp8_unprotected LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_hfref}/llama --device cpu --format fp8
          --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_
  REGEX "step1: reloaded with model.layers.0.self_attn.qkv_.fp8_.scale_ unprotected: drift caught by the capture manifest.*decode \\(graphs\\) max\\|diff\\| [0-9.e-]+ \\(rel [0-9.e-]+\\), argmax [0-9]+/24( \\| transformers [^|]*)? \\| OUT OF TOLERANCE")
set_tests_properties(hf.check.llama.fp8_unprotected PROPERTIES FIXTURES_REQUIRED hfref_llama)
# The same for a stride array of the grouped MoE kernel (layer 0's
# SwigluExperts, rebuilt by every PWAL): the manifest reports the moved
# address after the first reload and refuses replay. The strides have the
# same values after every PWAL and the slot plan keeps the captured storage
# alive, so the graphs replayed anyway still match (what breaks vLLM is the
# freed storage; tests/sites_moe_test.cpp). The second reload is refused
# (the slot no longer points at its captured storage) and leaves the served
# model at step 1: out of tolerance against step 2's logits.
gk_add_output_test(hf.check.qwen3_moe.strides_unprotected LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_hfref}/qwen3_moe --device cpu --unprotect model.layers.0.mlp.experts_.strides_.ab_strides1
  REGEX "step1: reloaded with model.layers.0.mlp.experts_.strides_.ab_strides1 unprotected: drift caught by the capture manifest \\(after the reload, [0-9]+ captured address\\(es\\) are not covered. replay is refused.*decode \\(graphs\\) max\\|diff\\| [0-9.e-]+ \\(rel [0-9.e-]+\\), argmax 24/24 \\| ok\nstep2: reloaded with model.layers.0.mlp.experts_.strides_.ab_strides1 unprotected: drift caught by the capture manifest \\(model.layers.0.mlp.experts_.strides_.ab_strides1 no longer points at its captured storage.*\\| OUT OF TOLERANCE\nHF-CHECK FAIL")
set_tests_properties(hf.check.qwen3_moe.strides_unprotected PROPERTIES FIXTURES_REQUIRED hfref_qwen3_moe)

# Checkpoints the engine must refuse, each leaving the served model unchanged
# (every later step still matches transformers): another architecture, a
# shard the index names but the directory lacks, a tensor of another shape,
# an unsupported model_type, a rope scaling the engine does not implement,
# one it implements but the served model does not have (the captured rotary
# tables would stay the old ones), a max_position_embeddings below the
# engine's max_len (as at start-up).
set(_bad ${_hfref}/bad)
add_test(NAME hf.bad_checkpoints.setup
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/hf/make_bad_checkpoints.py ${_hfref}/llama ${_bad})
set_tests_properties(hf.bad_checkpoints.setup PROPERTIES LABELS unit FIXTURES_REQUIRED hfref_llama
                     FIXTURES_SETUP hfref_bad)
gk_add_output_test(hf.check.llama.refused_reloads LABELS unit
  COMMAND gk-hf-check --ref ${_hfref}/llama --device cpu
          --bad-reload ${_hfref}/qwen3/step1 --bad-reload ${_bad}/missing_shard
          --bad-reload ${_bad}/wrong_shape --bad-reload ${_bad}/model_type --bad-reload ${_bad}/rope_scaling
          --bad-reload ${_bad}/rope_changed --bad-reload ${_bad}/max_position
  REGEX "qwen3/step1: refused: .*/config.json: model_type is qwen3 but the served model has llama.*missing_shard: refused: .*model-00002-of-00003.safetensors.*wrong_shape: refused: .*model.layers.0.self_attn.k_proj.weight.*has shape \\[16, 64\\], but the model expects \\[32, 64\\].*model_type: refused: .*unsupported model_type 'mistral'.*: the engine cannot serve this model\nbad reload .*rope_scaling: refused: .*/config.json: unsupported rope_scaling.rope_type 'yarn' .*: the engine cannot serve this model\nbad reload .*rope_changed: refused: .*/config.json: rope_scaling is [^\n]*linear[^\n]* but the served model has null.*max_position: refused: .*/config.json: max_position_embeddings is 8, below the engine's max_len 16.*step2: reloaded in [0-9.]+ ms without recapture, drift 0.*\\| ok\nHF-CHECK PASS")
set_tests_properties(hf.check.llama.refused_reloads PROPERTIES FIXTURES_REQUIRED "hfref_llama;hfref_qwen3;hfref_bad")

# NaN and Inf must fail the oracle (copies of the llama reference, also by
# make_bad_checkpoints.py): a step whose checkpoint is all NaN, one NaN in
# transformers' logits at a prefill position, one +Inf at a decode position.
# A reduction with std::max once dropped the NaN and printed HF-CHECK PASS.
# Non-finite weights (a diverged trainer's checkpoint): refused by default,
# naming the tensor; the engine keeps serving step 0 and step 2 matches.
gk_add_output_test(hf.check.llama.nonfinite_weights_refused LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_bad}/nan_weights --device cpu
  REGEX "step1: refused: weight 'model\\.[^']*' from [^\n]* holds a non-finite value \\(nan at element [0-9]+ of parameter[^\n]*\n(  [^\n]*\n)*step2: [^\n]*\\| ok\nHF-CHECK FAIL")
# Served when allowed: every logit of step 1 is NaN, the NaN weights write NaN
# into the KV cache, and after the good step 2 every output equals
# transformers' again (no stale KV row reaches it: Note [Stale KV rows]).
gk_add_output_test(hf.check.llama.nonfinite_weights LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_bad}/nan_weights --device cpu --allow-non-finite
  REGEX "step1: [^\n]*prefill \\(eager\\) max\\|diff\\| -?nan \\(rel -?nan\\), argmax [0-9]+/12, 3072 non-finite \\| decode \\(graphs\\) max\\|diff\\| -?nan \\(rel -?nan\\), argmax [0-9]+/24, 6144 non-finite \\| OUT OF TOLERANCE\nstep2: [^\n]*\\| ok\nHF-CHECK FAIL")
gk_add_output_test(hf.check.llama.nonfinite_logits_nan LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_bad}/nan_logits --device cpu
  REGEX "step1: [^\n]*prefill \\(eager\\) max\\|diff\\| -?nan \\(rel -?nan\\), argmax [0-9]+/12, 1 non-finite \\|[^\n]*\\| OUT OF TOLERANCE\nstep2: [^\n]*\\| ok\nHF-CHECK FAIL")
gk_add_output_test(hf.check.llama.nonfinite_logits_inf LABELS unit EXIT 1
  COMMAND gk-hf-check --ref ${_bad}/inf_logits --device cpu
  REGEX "step1: [^\n]*\\| ok\nstep2: [^\n]*decode \\(graphs\\) max\\|diff\\| inf \\(rel -?nan\\), argmax [0-9]+/24, 1 non-finite \\| OUT OF TOLERANCE\nHF-CHECK FAIL")
set_tests_properties(hf.check.llama.nonfinite_weights hf.check.llama.nonfinite_weights_refused
                     hf.check.llama.nonfinite_logits_nan
                     hf.check.llama.nonfinite_logits_inf PROPERTIES FIXTURES_REQUIRED hfref_bad)

# The RL demo's patches on the Qwen3-MoE reference checkpoint in FP8: every
# layer, the MoE layers included, takes the scatter (the experts' stride
# arrays from_shapes, the FP8 rows by blocks), and the demo prints each
# layer's landing.
gk_add_output_test(demo.rl_loop_delta_moe_fp8 LABELS unit
  COMMAND gk-rl-demo --steps 2 --device cpu --delta --quant fp8 --model ${_hfref}/qwen3_moe/step0 --work ${_work}/delta_moe
  REGEX "0 re-ran PWAL.*scatter model.layers.0.self_attn: [1-9][0-9]* derived blocks recomputed.*scatter model.layers.[01].mlp: 0 derived blocks recomputed.*0 re-ran PWAL.*SUMMARY: 2 patch reloads, [0-9]+ slots tracked, drift 0, .* ${_equals}")
set_tests_properties(demo.rl_loop_delta_moe_fp8 PROPERTIES FIXTURES_REQUIRED hfref_qwen3_moe)
