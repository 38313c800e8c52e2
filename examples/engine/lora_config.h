// examples/engine/lora_config.h: what a LoRA adapter's adapter_config.json
// says (rank, alpha, rsLoRA, target modules), without the adapter's
// tensors: the part of an adapter the engine's configuration carries
// (HfConfig::adapter) and its graphs are captured for.
//
//   demo::LoraConfig c{.rank = 16, .alpha = 32, .targets = {"q_proj", "v_proj"}};
//   double s = c.scale();                      // 2.0: alpha / r
//   bool q = c.targets_module("q_proj");       // true
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace demo {

struct LoraConfig {
  std::int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;                // scale alpha / sqrt(r) instead of alpha / r
  std::vector<std::string> targets;   // sorted; of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj

  double scale() const;
  bool targets_module(std::string_view projection) const;  // "q_proj"
  friend bool operator==(const LoraConfig&, const LoraConfig&) = default;
};

}  // namespace demo
