// examples/engine/weight_formats.h: the example engine's weight formats,
// chosen per run, each built by PWAL from the checkpoint-format parameter:
//   dense  the checkpoint's dtype through cuBLAS (or ATen on the CPU);
//   fp8    W8A8: float8_e4m3fn weights with a float32 scale per output
//          channel, activations quantized per token at run time; declared
//          by blocks of one row, so a patch requantizes only the rows it
//          touches (Note [Declared derivations] in graphkeep/registry/role.h);
//   w4a16  int4 weights with a float32 scale per group of 128 input channels,
//          through graphkeep's Marlin-style split-K kernel.
//
//   demo::ProjectionWeights w(demo::WeightFormat::fp8, "model.layers.0.mlp.down_proj.weight", k, "intermediate_size");
//   w.build(dense);                            // PWAL
//   at::Tensor y = w.apply("down_proj", x, dense);
#pragma once

#include <graphkeep/model/block_derivation.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/registry.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace demo {

enum class WeightFormat { dense, fp8, w4a16 };
WeightFormat parse_weight_format(std::string_view name);  // "dense" (or "bf16"), "fp8", "w4a16"
std::string_view to_string(WeightFormat f);

// FP8 W8A8 weights of one projection, built by PWAL from its dense
// checkpoint-format parameter.
class Fp8Weights {
 public:
  // dense: [N, K] -> qweight [N, K] e4m3, scale [N], quantized
  // chunk_elements at a time (Note [FP8 quantization in chunks] in weight_formats.cpp).
  static constexpr std::int64_t kChunkElements = std::int64_t{1} << 23;  // 32 MiB of float32
  void build(const at::Tensor& dense, std::int64_t chunk_elements = kChunkElements);
  at::Tensor apply(const at::Tensor& x) const;    // x [T, K] model dtype -> [T, N] model dtype
  bool built() const { return qweight_.defined(); }
  const at::Tensor& qweight() const { return qweight_; }
  const at::Tensor& scale() const { return scale_; }
  // rows [M, K] -> {e4m3 [M, K], float32 [M]}: what build() makes of them.
  static std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& rows);
  // Declares qweight_ and scale_ as derived row by row from `dense` (Note
  // [Declared derivations] in graphkeep/registry/role.h).
  void declare(gk::Derivations& d, const at::Tensor& dense) const;

 private:
  at::Tensor qweight_;  // [N, K] float8_e4m3fn
  at::Tensor scale_;    // [N] float32, dequantization scale per output channel
  GRAPHKEEP_DESCRIBE(Fp8Weights, (qweight_, gk::derived_weight.by_blocks()), (scale_, gk::scale.by_blocks()))
};

// W4A16 weights of one projection: symmetric int4 per group of input
// channels (Note [W4A16 from the checkpoint] in weight_formats.cpp), packed
// for gk::quant::marlin_w4a16_apply. Every member is declared, so a weight
// patch recomputes only the groups it touches and re-runs no PWAL.
class W4A16Weights {
 public:
  // dense: [N, K]; `weight` names its checkpoint tensors (for messages).
  void build(const at::Tensor& dense, const std::string& weight);
  at::Tensor apply(const at::Tensor& x) const;    // x [T, K] model dtype -> [T, N] model dtype
  static std::int64_t group_size(std::int64_t k);
  // Refuses an input size K the format cannot group (a gk::WeightError
  // naming `weight` and `k_field`, the config field K comes from).
  static void check_input_size(std::int64_t k, const std::string& weight, const std::string& k_field);
  // groups [R, g] -> {int4 + 8 as int64 [R, g], float32 scales [R]}: what
  // build() makes of each group of g input channels.
  static std::pair<at::Tensor, at::Tensor> quantize_groups(const at::Tensor& groups);
  // Declares qweight_ and scales_ as derived group by group from `dense`:
  // blocks of 1 x g, each giving g / 8 packed words and one scale, both
  // stored group-major (Note [Declared derivations] in graphkeep/registry/role.h).
  void declare(gk::Derivations& d, const at::Tensor& dense) const;

 private:
  at::Tensor qweight_;    // [K/8, N] int32: int4 + 8, input channel k is nibble k % 8 of row k / 8 (GPTQ)
  at::Tensor scales_;     // [K / group, N] float32
  at::Tensor g_idx_;      // [K] int32: the group of each input channel
  at::Tensor perm_;       // [K] int32: argsort(g_idx_), the identity (no act-order)
  at::Tensor workspace_;  // the split-K locks, 0 at every launch
  GRAPHKEEP_DESCRIBE(W4A16Weights, (qweight_, gk::derived_weight.by_blocks()), (scales_, gk::scale.by_blocks()),
                     (g_idx_, gk::metadata.from_shapes()), (perm_, gk::permutation.from_shapes()),
                     (workspace_, gk::workspace(gk::Init::zero)))
};

// One projection's kernel-format weights in the run's format (nothing for dense).
class ProjectionWeights {
 public:
  ProjectionWeights() = default;
  // `weight`: the checkpoint tensors it is made of ("model.layers.0.mlp.down_proj.weight"),
  // for messages; `k` its input size, which the config field(s) `k_field` give. A
  // format that cannot take K is refused here, before any weight is read.
  ProjectionWeights(WeightFormat f, std::string weight, std::int64_t k, const std::string& k_field);
  void build(const at::Tensor& dense);  // PWAL
  // The block derivations of the format's members from `dense` (fp8: per
  // row; w4a16: per group).
  void declare(gk::Derivations& d, const at::Tensor& dense) const;
  // y = x W^T in the run's format; `dense` is the checkpoint-format parameter.
  at::Tensor apply(const char* name, const at::Tensor& x, const at::Tensor& dense) const;

 private:
  WeightFormat format_ = WeightFormat::dense;
  std::string weight_;
  Fp8Weights fp8_;
  W4A16Weights w4a16_;
  GRAPHKEEP_DESCRIBE(ProjectionWeights, format_, weight_, fp8_, w4a16_)
};

}  // namespace demo
