// examples/engine/lora_projection.h: a LoRA adapter's A and B on one of
// the example engine's projections, served inside the decode graphs
// (Note [LoRA in the decode graphs] in lora_projection.cpp).
//
//   qkv_lora_ = demo::LoraProjection(*this, "qkv_proj", c.adapter, {{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}},
//                                    hidden, opts, /*dense_base=*/format == WeightFormat::dense);
//   qkv_proj_ = register_parameter("qkv_proj", at::zeros({q + 2 * kv + qkv_lora_.joined_rows(), hidden}, opts));
//   at::Tensor qkv = qkv_lora_.project("qkv_proj", "qkv_lora", x, qkv_, qkv_proj_);  // x W^T + scale (x A^T) B^T
#pragma once

#include "lora_config.h"
#include "weight_formats.h"

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

// The LoRA A and B of one fused projection (q/k/v, gate/up, or one): A
// [parts * r, in] from the checkpoint tensors "<part>.lora_A.weight" of the
// targeted parts, B [sum of the parts' rows, r] from their
// "<part>.lora_B.weight" (each concatenated along dim 0, as default_load
// lays them). B is the parameter "<param>_lora_B" of the projection's
// module. A is either the parameter "<param>_lora_A", or, joined (a dense
// base weight and Kernels::joined when built), the last joined_rows() rows
// of the base weight's own parameter, whose checkpoint tensors it then
// extends (Note [LoRA in the decode graphs]). Nothing is registered when the
// config targets none of the parts.
class LoraProjection {
 public:
  struct Part {
    std::string projection;  // "q_proj"
    std::int64_t rows = 0;   // its rows of the projection's output
  };
  // How the fast CUDA path computes an adapter (Note [LoRA in the decode
  // graphs]), process-wide; read when a projection is built and when a graph
  // is captured, so set it before building an engine:
  //   aten          shrink GEMM, then per part an expand GEMM and an add
  //   fused_expand  shrink GEMM, then fused::lora_expand
  //   joined        (the default) for a dense base weight, W and A in one
  //                 GEMM, then fused::lora_expand; fused_expand otherwise
  enum class Kernels { aten, fused_expand, joined };
  static void set_kernels(Kernels k);
  static Kernels kernels();
  // Sets the kernels for its lifetime and restores the previous choice,
  // also when what is built meanwhile throws:
  //   { LoraProjection::ScopedKernels k(Kernels::aten); engine = build(); }
  class ScopedKernels {
   public:
    explicit ScopedKernels(Kernels k) : before_(kernels()) { set_kernels(k); }
    ~ScopedKernels() { set_kernels(before_); }
    ScopedKernels(const ScopedKernels&) = delete;
    ScopedKernels& operator=(const ScopedKernels&) = delete;

   private:
    Kernels before_;
  };

  LoraProjection() = default;
  // `dense_base`: the projection multiplies by its checkpoint-format weight
  // itself (the dense format), so A can join it.
  LoraProjection(torch::nn::Module& module, const std::string& param, const std::optional<LoraConfig>& config,
                 const std::vector<Part>& parts, std::int64_t in, at::TensorOptions options, bool dense_base);
  bool active() const { return rank_ > 0; }
  // The rows A adds to the base weight's parameter: parts * rank when
  // joined, else 0. Register the base weight with its own rows plus these.
  std::int64_t joined_rows() const { return joined_ ? a_rows() : 0; }
  // Appends B's checkpoint parameter, and A's: its own, or, joined, A's
  // checkpoint tensors appended to the base weight's parameter `param`,
  // which `out` must already hold (nothing when inactive).
  void append_checkpoint_params(std::vector<gk::CheckpointParam>& out) const;
  // The projection's output with its adapter, x W^T + scale (x A^T) B^T in
  // each targeted part's rows; `dense` is the base weight's parameter.
  // Joined, on the fused path: one GEMM x [W; A]^T, then the expand reading
  // its two column ranges (two launches). Otherwise w.apply(name, x, W),
  // then the adapter as captured op(s) named `lora_name`.
  at::Tensor project(const char* name, const char* lora_name, const at::Tensor& x, const ProjectionWeights& w,
                     const at::Tensor& dense) const;
  // The base weight alone: `dense` without A's rows.
  at::Tensor base_weight(const at::Tensor& dense) const;
  // The served A and B of each targeted part, as views of the parameters,
  // under their checkpoint names below `prefix` ("model.layers.0.self_attn").
  void append_tensors(const std::string& prefix, const at::Tensor& dense, std::vector<gk::NamedTensor>& out) const;

 private:
  std::int64_t a_rows() const { return static_cast<std::int64_t>(names_.size()) * rank_; }
  at::Tensor a_of(const at::Tensor& dense) const;  // A: its parameter, or the last rows of `dense`
  at::Tensor adapt(const char* name, const at::Tensor& x, const at::Tensor& y, const at::Tensor& a) const;

  std::optional<at::Tensor> a_, b_;  // handles to the module's parameters (a_: unless joined)
  std::string param_;
  std::vector<std::string> names_;   // the targeted parts
  std::vector<std::int64_t> offsets_, sizes_;
  std::int64_t rank_ = 0, in_ = 0;
  double scale_ = 0;
  bool joined_ = false;  // A is the last a_rows() rows of the base weight's parameter
  GRAPHKEEP_DESCRIBE(LoraProjection, (a_, gk::parameter), (b_, gk::parameter), param_, names_, offsets_, sizes_,
                     rank_, in_, scale_, joined_)
};

}  // namespace demo
