// gk-lora-bench: LoRA adapters in the example engine's decode graphs
// (docs/lora.md): what an adapter costs a decode step, and what a swap
// costs as users meet it (stage_adapter + commit).
//
// Builds the engine for a model shape with random weights made on the
// device (the same weights for every build: at::manual_seed), captures the
// measured batch's decode graph, and writes two random adapters (rank
// --rank on every projection; attention only for a MoE shape) under --work:
//
//   decode_step_no_adapter_ms  LlmEngine::decode (greedy) without an adapter
//   decode_step_ms             the same with adapter 1 served
//   stage_ms, swap_pause_ms    stage_adapter(2) and its commit (the pause),
//                              the best of --swaps swaps back and forth
//   adapter_bytes              one adapter's A and B
//   decode_step_aten_expand_ms  decode_step_ms with the expand as ATen ops
//                              instead of one CUDA kernel
//                              (LoraProjection::Kernels::aten)
//   decode_step_unjoined_ms    decode_step_ms with the shrink as a GEMM of
//                              its own (Kernels::fused_expand), where the
//                              default joins it to the base GEMM
//   parts_ms, parts_no_adapter_ms  the GPU time of one eager forward by part
//                              (demo::PartTimer; "lora" is the adapter's
//                              GEMMs and expands), with and without it
//   exact                      after the swaps, the logits equal a fresh
//                              engine's with the same adapter, and swapping
//                              back gives adapter 1's logits, bit for bit
//
//   gk-lora-bench --model llama8b --rank 16 --batch 64 --json lora_h200.json
//   gk-lora-bench --model tiny --device cpu --batch 4           (a smoke run anywhere)
//
// One JSON object per run, appended as a line to --json.
#include "bench_args.h"
#include "bench_models.h"
#include "bench_parts.h"
#include "engine/compare.h"
#include "engine/llm_engine.h"
#include "engine/lora.h"
#include "engine/lora_projection.h"

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  gkbench::CommonArgs common(/*default_batch=*/64);
  std::int64_t rank = 16, kv_len = 64;
  int steps = 50, swaps = 5;
  std::string work = "gk-lora-bench";
  try {
    for (gkbench::ArgWalker a(argc, argv); a.next();) {
      if (a.common(common)) continue;
      if (a.flag() == "--rank") rank = std::stoll(a.value());
      else if (a.flag() == "--kv-len") kv_len = std::stoll(a.value());
      else if (a.flag() == "--steps") steps = std::stoi(a.value());
      else if (a.flag() == "--swaps") swaps = std::stoi(a.value());
      else if (a.flag() == "--work") work = a.value();
      else throw std::invalid_argument("unknown option " + a.flag());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-lora-bench: %s\nusage: gk-lora-bench [--model llama8b|qwen3moe30b|tiny] "
                         "[--format dense|fp8|w4a16] [--device auto|cpu|cuda] [--batch B] [--rank R] [--kv-len L] "
                         "[--steps N] [--swaps N] [--work DIR] [--json FILE]\n",
                 e.what());
    return 2;
  }
  try {
    at::NoGradGuard no_grad;
    const bool cuda = common.device == "cuda" || (common.device == "auto" && gk::runtime::cuda_device_available());
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    const demo::HfConfig cfg = gkbench::model_config(common.model);
    const demo::WeightFormat format = demo::parse_weight_format(common.format);
    const std::vector<gkbench::Shape> shapes = gkbench::checkpoint_shapes(cfg, device);
    const std::int64_t batch = common.batch;
    std::printf("gk-lora-bench: %s, %s, rank %lld, batch %lld, device %s\n", common.model.c_str(),
                common.format.c_str(), static_cast<long long>(rank), static_cast<long long>(batch),
                device.str().c_str());
    std::fflush(stdout);
    demo::LoraConfig lora;
    lora.rank = rank;
    lora.alpha = 2.0 * static_cast<double>(rank);
    lora.targets = cfg.is_moe() ? std::vector<std::string>{"k_proj", "o_proj", "q_proj", "v_proj"}
                                : std::vector<std::string>{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                                           "up_proj", "v_proj"};
    const demo::LoraShapes lshapes{cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim,
                                   cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size, cfg.is_moe()};
    const std::string dirs[2] = {work + "/a1", work + "/a2"};
    std::size_t adapter_bytes = 0;
    for (int i = 0; i < 2; ++i) {
      const std::vector<gk::NamedTensor> t = demo::random_lora_tensors(lshapes, lora, 100 + i, cfg.dtype);
      if (i == 0)
        for (const gk::NamedTensor& x : t) adapter_bytes += x.value.nbytes();
      demo::write_lora_adapter(dirs[i], lora, t);
    }
    auto build = [&](const std::string& adapter) {
      demo::LlmEngineOptions opts;
      opts.max_len = kv_len;
      opts.batch_sizes = {batch};
      opts.adapter = adapter;
      at::manual_seed(1);  // the same base weights for every engine
      gkbench::RandomDeviceSource src(shapes, device);
      return std::make_unique<demo::LlmEngine>(cfg, device, format, src, opts);
    };
    const at::Tensor tokens = at::arange(batch, at::kLong).mul(7).remainder(cfg.vocab_size);
    const at::Tensor pos = at::full({batch}, kv_len - 1, at::kLong);
    // The GPU time of one eager forward by part (the second of two: the first warms up).
    auto parts_of = [&](demo::LlmEngine& e) {
      nlohmann::ordered_json parts = nlohmann::ordered_json::object();
      for (const auto& [part, t] : gkbench::eager_parts(e, device, tokens, pos)) parts[part] = gkbench::rounded(t, 4);
      return parts;
    };
    double plain_ms = 0;
    nlohmann::ordered_json plain_parts;
    {
      auto eng = build("");
      plain_ms = gkbench::mean_ms(steps, [&] { (void)eng->decode(tokens, pos); });
      plain_parts = parts_of(*eng);
    }
    // The other kernel choices (Note [LoRA in the decode graphs]), each in
    // its own engine: the expand as ATen ops, and the shrink unjoined.
    using Kernels = demo::LoraProjection::Kernels;
    auto other = [&](Kernels k, double& ms, nlohmann::ordered_json& parts) {
      if (!device.is_cuda()) return;
      auto e = [&] {
        const demo::LoraProjection::ScopedKernels scoped(k);
        return build(dirs[0]);
      }();
      ms = gkbench::mean_ms(steps, [&] { (void)e->decode(tokens, pos); });
      parts = parts_of(*e);
    };
    double aten_ms = 0, unjoined_ms = 0;
    nlohmann::ordered_json aten_parts, unjoined_parts;
    other(Kernels::aten, aten_ms, aten_parts);
    other(Kernels::fused_expand, unjoined_ms, unjoined_parts);
    auto eng = build(dirs[0]);
    const double adapter_ms = gkbench::mean_ms(steps, [&] { (void)eng->decode(tokens, pos); });
    const nlohmann::ordered_json adapter_parts = parts_of(*eng);
    // The exactness checks decode at position 0, which attends only the row
    // the step itself writes: the rows below a later position hold what the
    // graphs' capture left there under the adapter of the engine's start.
    const at::Tensor pos0 = at::zeros({batch}, at::kLong);
    const at::Tensor logits1 = eng->decode_logits(tokens, pos0);
    double stage_ms = 1e30, pause_ms = 1e30;
    int at = 0;
    for (int i = 0; i < 2 * swaps; ++i) {
      at = 1 - at;
      const gk::Stopwatch stage_watch;
      gk::StagedReload s = eng->stage_adapter(dirs[at]);
      const double st = stage_watch.elapsed_ms();
      const gk::Stopwatch pause_watch;
      (void)eng->commit(std::move(s));
      const double pa = pause_watch.elapsed_ms();
      stage_ms = std::min(stage_ms, st);
      pause_ms = std::min(pause_ms, pa);
    }
    // `at` is 0 again after an even number of swaps: adapter 1's logits.
    const bool back = demo::bitwise_equal(eng->decode_logits(tokens, pos0), logits1);
    eng->reload_adapter(dirs[1]);
    const at::Tensor logits2 = eng->decode_logits(tokens, pos0);
    eng.reset();
    const bool moved = !demo::bitwise_equal(logits2, logits1);
    const bool fresh = demo::bitwise_equal(build(dirs[1])->decode_logits(tokens, pos0), logits2);
    const bool exact = back && moved && fresh;
    if (!exact)
      std::printf("not exact: back to adapter 1 %s, adapter 2 differs from 1 %s, equals a fresh engine %s\n",
                  back ? "yes" : "NO", moved ? "yes" : "NO", fresh ? "yes" : "NO");
    std::string targets;
    for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : ",") + t;
    const auto num = gkbench::rounded;
    const nlohmann::ordered_json row = {
        {"model", common.model},
        {"format", common.format},
        {"rank", rank},
        {"targets", targets},
        {"batch", batch},
        {"adapter_bytes", adapter_bytes},
        {"swap_pause_ms", num(pause_ms, 4)},
        {"stage_ms", num(stage_ms, 3)},
        {"decode_step_ms", num(adapter_ms, 4)},
        {"decode_step_no_adapter_ms", num(plain_ms, 4)},
        {"adapter_over_no_adapter", num(adapter_ms / plain_ms, 3)},
        {"decode_step_aten_expand_ms", device.is_cuda() ? nlohmann::ordered_json(num(aten_ms, 4)) : nullptr},
        {"parts_ms", adapter_parts},
        {"decode_step_unjoined_ms", device.is_cuda() ? nlohmann::ordered_json(num(unjoined_ms, 4)) : nullptr},
        {"parts_aten_expand_ms", aten_parts},
        {"parts_unjoined_ms", unjoined_parts},
        {"parts_no_adapter_ms", plain_parts},
        {"exact", exact},
        {"swaps", 2 * swaps},
        {"device", device.str()},
    };
    std::printf("%s\n", row.dump().c_str());
    if (!common.json.empty()) std::ofstream(common.json, std::ios::app) << row.dump() << "\n";
    return exact ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-lora-bench: %s\n", e.what());
    return 1;
  }
}
