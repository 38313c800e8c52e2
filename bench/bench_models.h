// bench/bench_models.h
//
// The model shapes the example engine's benchmarks serve, and random weights
// for them made on the device (gk-online-bench, gk-decode-bench):
//   llama8b      Llama-3-8B: 32 layers, hidden 4096, 32 heads over 8 KV
//                heads of 128, MLP 14336, vocabulary 128256, bf16
//   qwen3moe30b  Qwen3-30B-A3B-like: 48 layers, hidden 2048, 32 heads over 4
//                KV heads of 128, 128 experts of 768, top 8, vocabulary 151936
//   tiny         the example engine's built-in model (float32)
// Shapes for costs that follow the tensor count, not the bytes:
//   llama8b-e32  the 8B's bytes in 11.6x its tensors (3,363 instead of 291):
//                llama8b's attention, its MLP as 32 Qwen3-MoE experts of
//                448 (32 x 448 = 14336), top 4
//   dsv3-count   DeepSeek-V3's expert tensor count (58 layers x 256 experts x
//                3 projections: 44,544 of its 45,069 tensors) at reduced
//                width: hidden 1024, experts of 256, top 8, 22 GiB
//   moe-narrow   the 30B-A3B's tensor count per layer at 1/16 of its width,
//                4 layers: host costs on a CPU
//   moe-count    the same count at 1/64 of the width (hidden 32, experts of
//                8): next to no bytes, so a CPU run times graphkeep's own host
//                work per tensor and per slot (perf it there)
//   llama1b      a Llama of 1.1B parameters: whole-model memory on a CPU
//
//   demo::HfConfig cfg = gkbench::model_config("llama8b");
//   const auto shapes = gkbench::checkpoint_shapes(cfg, device);
//   gkbench::RandomDeviceSource src(shapes, device);
//   demo::LlmEngine eng(cfg, device, demo::WeightFormat::dense, src, opts);
#pragma once

#include "engine/checkpoint_writer.h"
#include "engine/llm.h"

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/sources/weight_source.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gkbench {

inline demo::HfConfig model_config(const std::string& name) {
  demo::HfConfig c;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.max_position_embeddings = 8192;
  c.dtype = at::kBFloat16;
  if (name == "llama8b") {
    c.model_type = "llama";
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
  } else if (name == "qwen3moe30b") {
    c.model_type = "qwen3_moe";
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.rope_theta = 1000000.0;
  } else if (name == "llama8b-e32") {
    c = model_config("llama8b");
    c.model_type = "qwen3_moe";
    c.num_experts = 32;
    c.num_experts_per_tok = 4;
    c.moe_intermediate_size = 448;
  } else if (name == "dsv3-count") {
    c.model_type = "qwen3_moe";
    c.vocab_size = 32000;
    c.hidden_size = 1024;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 58;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 128;
    c.num_experts = 256;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 256;
  } else if (name == "moe-narrow") {
    c.model_type = "qwen3_moe";
    c.rope_theta = 1000000.0;
    c.vocab_size = 1024, c.hidden_size = 128, c.intermediate_size = 384;
    c.num_attention_heads = 4, c.num_hidden_layers = 4, c.num_key_value_heads = 2, c.head_dim = 128;
    c.num_experts = 128, c.num_experts_per_tok = 8, c.moe_intermediate_size = 48;
  } else if (name == "moe-count") {
    c = model_config("moe-narrow");
    c.vocab_size = 256, c.hidden_size = 32, c.intermediate_size = 64;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 32;
    c.moe_intermediate_size = 8;
  } else if (name == "llama1b") {
    c.model_type = "llama";
    c.vocab_size = 32000, c.hidden_size = 2048, c.intermediate_size = 8192;
    c.num_attention_heads = 16, c.num_hidden_layers = 16, c.num_key_value_heads = 8, c.head_dim = 128;
  } else if (name == "tiny") {
    c = demo::builtin_tiny_config();
  } else {
    throw std::invalid_argument("unknown --model " + name +
                                " (llama8b, qwen3moe30b, llama8b-e32, dsv3-count, moe-narrow, moe-count, llama1b, tiny)");
  }
  return c;
}

struct Shape {
  std::string name;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
  std::int64_t nbytes() const {
    std::int64_t n = static_cast<std::int64_t>(c10::elementSize(dtype));
    for (auto d : shape) n *= d;
    return n;
  }
};

// The checkpoint's tensors, read off a model built on `device` (then freed).
inline std::vector<Shape> checkpoint_shapes(const demo::HfConfig& c, c10::Device device) {
  demo::CausalLM m(c, device, demo::WeightFormat::dense);
  std::vector<Shape> out;
  for (const gk::CheckpointTensor& t : demo::expected_checkpoint(m)) out.push_back({t.name, t.shape, t.dtype});
  return out;
}

inline at::Tensor random_tensor(const Shape& s, c10::Device device) {
  const auto o = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor w = s.name.ends_with("norm.weight") ? 1.0 + 0.05 * at::randn(s.shape, o)
                                                 : at::randn(s.shape, o) * (1.0 / std::sqrt(double(s.shape.back())));
  return w.to(s.dtype);
}

// Yields random tensors made on the device as it goes: peak one tensor.
class RandomDeviceSource final : public gk::WeightSource {
 public:
  RandomDeviceSource(const std::vector<Shape>& shapes, c10::Device device) : shapes_(shapes), device_(device) {}
  std::optional<gk::NamedTensor> next() override {
    if (i_ >= shapes_.size()) return std::nullopt;
    const Shape& s = shapes_[i_++];
    return gk::NamedTensor{s.name, random_tensor(s, device_), 0};
  }
  std::string describe() const override { return "random device weights"; }

 private:
  const std::vector<Shape>& shapes_;
  c10::Device device_;
  std::size_t i_ = 0;
};

// The mean wall time of `steps` calls of `step`, after 3 unmeasured ones.
template <class F>
double mean_ms(int steps, F&& step) {
  for (int i = 0; i < 3; ++i) step();
  const gk::Stopwatch w;
  for (int i = 0; i < steps; ++i) step();
  return w.elapsed_ms() / steps;
}

// v rounded to `digits` decimals (the digits a reader of a JSON row uses).
inline double rounded(double v, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

// The same, or null for what a run did not measure (negative, NaN or infinite).
inline nlohmann::ordered_json rounded_or_null(double v, int digits) {
  if (!(v >= 0) || !std::isfinite(v)) return nullptr;
  return rounded(v, digits);
}

}  // namespace gkbench
