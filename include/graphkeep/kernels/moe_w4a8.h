// graphkeep/kernels/moe_w4a8.h
//
// Failure site 10: a CUTLASS-style W4A8 grouped MoE. The checkpoint holds
// int4 weights (two per byte, low nibble first, value = nibble - 8) with
// per-group float scales; PWAL repacks the weights 8 per int32 word in the
// kernel's interleaved nibble order, transposes the group scales into the
// kernel's [groups, rows] layout, and rebuilds the experts object with its
// a/c/s stride arrays (CutlassW4A8Experts, moe_experts.h). The kernel
// dequantizes in its inner loop and reads every stride per group from
// device memory.
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

class W4A8Moe : public torch::nn::Module, public DescribedLayer<W4A8Moe> {
 public:
  W4A8Moe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t group, c10::Device device);

  void process_weights_after_loading() override;

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
                             (w13_packed_, derived_weight), (w2_packed_, derived_weight), (w13_scales_t_, scale),
                             (w2_scales_t_, scale), experts_, num_experts_, hidden_, inter_, topk_, group_)
};

}  // namespace gk::kernels
