// graphkeep/kernels/moe_w4a8.h
//
// Failure site 10: a CUTLASS-style W4A8 grouped MoE. The checkpoint holds
// int4 weights (two per byte, low nibble first, value = nibble - 8) with
// per-group float scales; PWAL repacks the weights 8 per int32 word in the
// kernel's interleaved nibble order, transposes the group scales into the
// kernel's [groups, rows] layout, and rebuilds the experts object,
// CutlassW4A8Experts, with its a/c/s stride arrays. The kernel dequantizes
// in its inner loop and reads every stride per group from device memory.
// Every derived member is declared (Note [Declared derivations]): the
// strides from_shapes, each packed word by blocks of four checkpoint bytes
// (its eight nibbles), the transposed scales by_layout; a weight patch
// re-runs no PWAL.
//
//   gk::kernels::W4A8Moe moe(/*experts=*/4, /*hidden=*/16, /*inter=*/8, /*topk=*/2, /*group=*/8, at::kCPU);
//   at::Tensor y = moe.forward(x, logits);   // x: [T, K], logits: [T, E] -> y: [T, K]
#pragma once

#include <graphkeep/kernels/moe_experts.h>
#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

#include <memory>

namespace gk::kernels {

// Site 10's experts (CUTLASS W4A8 MoE): int4 weights packed 8 per int32 word
// with per-group scales (dequantized in the kernel), int8 activations with
// per-row scales. w13: int32 [E, 2N, K/8] packed int4 (moe_common.h int4_at),
// w2: int32 [E, K, N/8]; w13_scales: float [E, K/G, 2N], w2_scales: [E, N/G, K].
// Per expert e, int64 [E]:
//   a_strides1 = K, c_strides1 = 2N, s_strides1 = 2N   (GEMM1)
//   a_strides2 = N, c_strides2 = K,  s_strides2 = K    (GEMM2)
// (s_strides: the row stride of the group-scale matrices [K/G, 2N] and
// [N/G, K] that PWAL transposes the checkpoint scales into).
class CutlassW4A8Experts final : public MoeExperts {
 public:
  CutlassW4A8Experts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t group,
                     c10::Device device);

  at::Tensor apply(const MoeCall& call) const override;

  const at::Tensor& s_strides1() const { return s_strides1_; }
  int64_t group() const { return group_; }

 private:
  at::Tensor a_strides1_;  // int64 [E] = K
  at::Tensor a_strides2_;  // int64 [E] = N
  at::Tensor c_strides1_;  // int64 [E] = 2N
  at::Tensor c_strides2_;  // int64 [E] = K
  at::Tensor s_strides1_;  // int64 [E] = 2N
  at::Tensor s_strides2_;  // int64 [E] = K
  int64_t group_ = 0;      // quantization group size along the reduction dim

  // Functions of E, K, N and the group alone (Note [Declared derivations]).
  GRAPHKEEP_DESCRIBE_DERIVED(CutlassW4A8Experts, (MoeExperts), (a_strides1_, metadata.from_shapes()),
                             (a_strides2_, metadata.from_shapes()), (c_strides1_, metadata.from_shapes()),
                             (c_strides2_, metadata.from_shapes()), (s_strides1_, metadata.from_shapes()),
                             (s_strides2_, metadata.from_shapes()), group_)
};

class W4A8Moe : public torch::nn::Module, public DescribedLayer<W4A8Moe> {
 public:
  W4A8Moe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t group, c10::Device device);

  void process_weights_after_loading() override;
  void declare_derivations(Derivations& d) const override;

  // x: [T, K], logits: [T, E] (float32, on the layer's device) -> [T, K]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& logits);

  const MoeExperts& experts() const { return *experts_; }

 private:
  at::Tensor w13_qweight_;  // uint8 [E, 2N, K/2], checkpoint format
  at::Tensor w13_scales_;   // float [E, 2N, K/G]
  at::Tensor w2_qweight_;   // uint8 [E, K, N/2]
  at::Tensor w2_scales_;    // float [E, K, N/G]
  at::Tensor w13_packed_;    // int32 [E, 2N, K/8], derived
  at::Tensor w2_packed_;     // int32 [E, K, N/8], derived
  at::Tensor w13_scales_t_;  // float [E, K/G, 2N], derived
  at::Tensor w2_scales_t_;   // float [E, N/G, K], derived
  std::unique_ptr<MoeExperts> experts_;  // a CutlassW4A8Experts, rebuilt by every PWAL
  int64_t num_experts_, hidden_, inter_, topk_, group_;

  GRAPHKEEP_DESCRIBE_DERIVED(W4A8Moe, (torch::nn::Module, DescribedLayer<W4A8Moe>), (w13_qweight_, parameter),
                             (w13_scales_, parameter), (w2_qweight_, parameter), (w2_scales_, parameter),
                             (w13_packed_, derived_weight.by_blocks()), (w2_packed_, derived_weight.by_blocks()),
                             (w13_scales_t_, scale.by_layout()), (w2_scales_t_, scale.by_layout()), experts_,
                             num_experts_, hidden_, inter_, topk_, group_)
};

}  // namespace gk::kernels
