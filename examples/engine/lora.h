// examples/engine/lora.h: LoRA adapters in PEFT's format, served inside the
// decode graphs by the example engine (unmerged: y = x W^T + scale (x A^T) B^T).
//
// An adapter directory holds adapter_config.json (r, lora_alpha,
// target_modules, use_rslora) and adapter_model.safetensors
// ("base_model.model.<module>.<q_proj|...>.lora_A.weight" [r, in] and
// ".lora_B.weight" [out, r]). Its A and B are checkpoint parameters of the
// layers that hold the targeted projections, declared like every other
// tensor, so a reload keeps their addresses and an adapter swap is a small
// weight patch (LlmEngine::reload_adapter).
//
//   demo::LoraAdapter a = demo::read_lora_adapter("adapters/step3");   // gk::WeightError naming the file
//   demo::LlmEngineOptions o;  o.adapter = "adapters/step0";
#pragma once

#include "lora_config.h"

#include <graphkeep/sources/weight_source.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace demo {

struct LoraAdapter {
  std::string dir;
  LoraConfig config;
  // Under the engine's names ("model.layers.0.self_attn.q_proj.lora_A.weight").
  std::vector<gk::NamedTensor> tensors;
};

// Reads and checks an adapter directory: the config (a LoRA adapter PEFT
// saved, without DoRA, biases, per-module ranks or extra saved modules; its
// targets among the seven projections) and the tensors (every name an A or
// B of a targeted projection, ranks as the config says, one dtype). Any
// fault is a gk::WeightError naming the file and the tensor or field.
LoraAdapter read_lora_adapter(const std::string& dir);

// Writes an adapter directory as PEFT saves one (adapter_config.json,
// adapter_model.safetensors) from tensors under the engine's names.
void write_lora_adapter(const std::string& dir, const LoraConfig& config, const std::vector<gk::NamedTensor>& tensors);
// Random A and B for every targeted projection of a model of `layers`
// decoder layers with the given projection sizes, the same for the same seed
// (the demo's and the tests' adapters; values ~ 0.05).
struct LoraShapes {
  std::int64_t layers = 0, hidden = 0, q_out = 0, kv_out = 0, inter = 0;
  bool moe = false;  // the MLP projections are the experts': not adapted
};
std::vector<gk::NamedTensor> random_lora_tensors(const LoraShapes& shapes, const LoraConfig& config,
                                                 std::uint64_t seed, at::ScalarType dtype = at::kFloat);

// Where an adapter's rank, scale or targets differ from those the graphs
// were captured with: an error naming the modules and both values, or ""
// when they agree.
std::string lora_mismatch(const LoraConfig& served, const LoraConfig& next, const std::string& next_dir);

// A weight source followed by an adapter's tensors (the base checkpoint and
// the adapter served with it).
class WithAdapter final : public gk::WeightSource {
 public:
  WithAdapter(gk::WeightSource& base, std::vector<gk::NamedTensor> adapter, std::string adapter_label)
      : base_(base), adapter_(std::move(adapter)), label_(std::move(adapter_label)) {}
  std::optional<gk::NamedTensor> next() override {
    if (auto t = base_.next()) return t;
    if (pos_ >= adapter_.size()) return std::nullopt;
    return adapter_[pos_++];
  }
  std::string describe() const override { return base_.describe() + " with " + label_; }

 private:
  gk::WeightSource& base_;
  std::vector<gk::NamedTensor> adapter_;
  std::string label_;
  std::size_t pos_ = 0;
};

// True for the names of adapter tensors ("...q_proj.lora_A.weight").
bool is_lora_tensor(std::string_view name);

}  // namespace demo
