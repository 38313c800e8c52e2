// graphkeep/quant/nvfp4_cutlass_moe.h
//
// Failure site 9: NVFP4 MoE alphas and global scales (vLLM's compressed-
// tensors W4A4 NVFP4 MoE on the CUTLASS backend). The checkpoint holds fp4
// weights (two e2m1 nibbles per byte), their e4m3 block scales (one per 16
// elements) and per-expert global scales; PWAL derives, as new tensors:
//   g1_alphas[e] = w13_input_global_scale[e] * w13_weight_global_scale[e]
//   g2_alphas[e] = w2_input_global_scale[e]  * w2_weight_global_scale[e]
//   a1_gscale[e] = 1 / w13_input_global_scale[e]
//   a2_gscale[e] = 1 / w2_input_global_scale[e]
// Global scales are dequantization multipliers here: a weight is
// e2m1 * e4m3(block scale) * weight_global_scale, an activation
// e2m1 * e4m3(block scale) * input_global_scale.
// Without graphkeep a captured graph keeps reading the first PWAL's alphas
// and gscales after a reload.
//
// The computation, per token t (x_t of size K), top-1 routing by the router
// `gate` [E, K], then expert e's gated MLP on NVFP4 operands:
//   xq      = nvfp4(x_t * a1_gscale[e])                 (16-blocks, e4m3 scales)
//   h[m]    = g1_alphas[e] * blockdot(xq, w13[e, m])    m < 2N
//   a[n]    = relu(h[n]) * h[N + n]
//   aq      = nvfp4(a * a2_gscale[e])
//   y[t, k] = g2_alphas[e] * blockdot(aq, w2[e, k])     k < K
// where blockdot sums the exact e2m1 products per 16-block, scaled by both
// block scales (a block-scaled MMA).
//
//   gk::quant::Nvfp4CutlassMoe moe(/*experts=*/4, /*hidden=*/64, /*inter=*/32, at::kCPU);
//   at::Tensor y = moe.forward(x);   // x: [T, K] float32 -> [T, K]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::quant {

class Nvfp4CutlassMoe : public torch::nn::Module, public DescribedLayer<Nvfp4CutlassMoe> {
 public:
  Nvfp4CutlassMoe(int64_t experts, int64_t hidden, int64_t intermediate, c10::Device device);

  void process_weights_after_loading() override;

  // x: [T, K] float32, contiguous, on the layer's device -> [T, K]
  at::Tensor forward(const at::Tensor& x);

  const at::Tensor& g1_alphas() const { return g1_alphas_; }
  const at::Tensor& g2_alphas() const { return g2_alphas_; }
  const at::Tensor& a1_gscale() const { return a1_gscale_; }
  const at::Tensor& a2_gscale() const { return a2_gscale_; }

 private:
  // checkpoint format
  at::Tensor w13_weight_;               // uint8 [E, 2N, K/2]  packed e2m1
  at::Tensor w13_weight_scale_;         // uint8 [E, 2N, K/16] e4m3 block scales
  at::Tensor w13_weight_global_scale_;  // float [E]
  at::Tensor w13_input_global_scale_;   // float [E]
  at::Tensor w2_weight_;                // uint8 [E, K, N/2]
  at::Tensor w2_weight_scale_;          // uint8 [E, K, N/16]
  at::Tensor w2_weight_global_scale_;   // float [E]
  at::Tensor w2_input_global_scale_;    // float [E]
  at::Tensor gate_;                     // float [E, K] router
  // derived by PWAL
  at::Tensor g1_alphas_, g2_alphas_;    // float [E]
  at::Tensor a1_gscale_, a2_gscale_;    // float [E]
  int64_t experts_, hidden_, inter_;

  GRAPHKEEP_DESCRIBE_DERIVED(Nvfp4CutlassMoe, (torch::nn::Module, DescribedLayer<Nvfp4CutlassMoe>),
                             (w13_weight_, gk::parameter), (w13_weight_scale_, gk::parameter),
                             (w13_weight_global_scale_, gk::parameter), (w13_input_global_scale_, gk::parameter),
                             (w2_weight_, gk::parameter), (w2_weight_scale_, gk::parameter),
                             (w2_weight_global_scale_, gk::parameter), (w2_input_global_scale_, gk::parameter),
                             (gate_, gk::parameter), (g1_alphas_, gk::scale), (g2_alphas_, gk::scale),
                             (a1_gscale_, gk::scale), (a2_gscale_, gk::scale), experts_, hidden_, inter_)
};

}  // namespace gk::quant
