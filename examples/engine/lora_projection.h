// examples/engine/lora_projection.h: a LoRA adapter's A and B on one of
// the example engine's projections, served inside the decode graphs
// (Note [LoRA in the decode graphs] in lora_projection.cpp).
//
//   qkv_lora_ = demo::LoraProjection(*this, "qkv_proj", c.adapter, {{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}},
//                                    hidden, opts);
//   at::Tensor qkv = qkv_lora_.apply("qkv_lora", x, base_qkv);  // base + scale (x A^T) B^T
#pragma once

#include "lora_config.h"

#include <graphkeep/model/layer.h>
#include <graphkeep/registry.h>
#include <graphkeep/sources/weight_source.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace demo {

// The LoRA A and B of one fused projection (q/k/v, gate/up, or one),
// registered on the projection's module as parameters "<param>_lora_A"
// [parts * r, in] and "<param>_lora_B" [sum of the parts' rows, r], from the
// checkpoint tensors "<part>.lora_A.weight" and "<part>.lora_B.weight" of
// the targeted parts (concatenated along dim 0, as default_load lays them).
// Nothing is registered when the config targets none of the parts.
class LoraProjection {
 public:
  struct Part {
    std::string projection;  // "q_proj"
    std::int64_t rows = 0;   // its rows of the projection's output
  };
  LoraProjection() = default;
  LoraProjection(torch::nn::Module& module, const std::string& param, const std::optional<LoraConfig>& config,
                 const std::vector<Part>& parts, std::int64_t in, at::TensorOptions options);
  bool active() const { return a_.has_value(); }
  // On CUDA, the expand and its add as one kernel (fused::lora_expand)
  // instead of ATen ops; process-wide, read when a graph is captured; on by
  // default (Note [LoRA in the decode graphs]).
  static void set_fused_expand(bool on);
  static bool fused_expand();
  // Appends its two checkpoint parameters (nothing when inactive).
  void append_checkpoint_params(std::vector<gk::CheckpointParam>& out) const;
  // y + scale * (x A_p^T) B_p^T in each targeted part's rows, as one
  // captured op (Note [LoRA in the decode graphs] in lora_projection.cpp).
  at::Tensor apply(const char* name, const at::Tensor& x, const at::Tensor& y) const;
  // The served A and B of each targeted part, as views of the parameters,
  // under their checkpoint names below `prefix` ("model.layers.0.self_attn").
  void append_tensors(const std::string& prefix, std::vector<gk::NamedTensor>& out) const;

 private:
  std::optional<at::Tensor> a_, b_;  // handles to the module's parameters
  std::string param_;
  std::vector<std::string> names_;   // the targeted parts
  std::vector<std::int64_t> offsets_, sizes_;
  std::int64_t rank_ = 0, in_ = 0;
  double scale_ = 0;
  GRAPHKEEP_DESCRIBE(LoraProjection, (a_, gk::parameter), (b_, gk::parameter), param_, names_, offsets_, sizes_,
                     rank_, in_, scale_)
};

}  // namespace demo
