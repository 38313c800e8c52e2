// graphkeep/quant/moe_scales_b12x.h
//
// Failure site 8: MoE input scales and swizzled scale factors (vLLM's
// FlashInfer B12x NVFP4 MoE). The checkpoint (modelopt NVFP4) holds fp4
// weights, their e4m3 block scales in the plain [rows, K/16] layout, per-
// expert weight global scales (weight_scale_2) and per-expert input scales.
// PWAL builds, as new tensors:
//   w13_sf_mma, w2_sf_mma  the block scales swizzled into the 128x4 tile
//                          layout the block-scaled MMA reads (per expert,
//                          rows padded to 128 and scale columns to 4; see
//                          nvfp4_sf_offset_128x4 in graphkeep/numerics/nvfp4_codec.h);
//   fc1_input_scale        1 / max_e w13_input_scale  (quantizes the FC1 input)
//   fc2_input_scale        1 / max_e w2_input_scale   (vLLM's _fc2_input_scale)
// Without graphkeep a captured graph keeps un-swizzling the first PWAL's
// scale factors and quantizing with the first input scales.
//
// The computation, per token t (top-1 routing by `gate` [E, K]), expert e:
//   xq      = nvfp4(x_t * fc1_input_scale)
//   h[m]    = blockdot(xq, w13[e, m]; scales from w13_sf_mma) * w13_weight_scale_2[e] / fc1_input_scale
//   a[n]    = relu(h[n]) * h[N + n]
//   aq      = nvfp4(a * fc2_input_scale)
//   y[t, k] = blockdot(aq, w2[e, k]; scales from w2_sf_mma) * w2_weight_scale_2[e] / fc2_input_scale
// The kernel un-swizzles the weight scale factors on read.
//
//   gk::quant::B12xNvfp4Moe moe(/*experts=*/4, /*hidden=*/64, /*inter=*/32, at::kCPU);
//   at::Tensor y = moe.forward(x);   // x: [T, K] float32 -> [T, K]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::quant {

// Swizzles plain block scales [E, M, Ksf] (uint8, CPU) into the 128x4 MMA
// layout [E, round_up(M, 128) * round_up(Ksf, 4)], padding with zeros.
at::Tensor swizzle_sf_128x4(const at::Tensor& sf);
// The inverse, for tests: [E, S] swizzled -> [E, M, Ksf] plain.
at::Tensor unswizzle_sf_128x4(const at::Tensor& swizzled, int64_t m, int64_t ksf);

class B12xNvfp4Moe : public torch::nn::Module, public DescribedLayer<B12xNvfp4Moe> {
 public:
  B12xNvfp4Moe(int64_t experts, int64_t hidden, int64_t intermediate, c10::Device device);

  void process_weights_after_loading() override;

  // x: [T, K] float32, contiguous, on the layer's device -> [T, K]
  at::Tensor forward(const at::Tensor& x);

  const at::Tensor& w13_sf_mma() const { return w13_sf_mma_; }
  const at::Tensor& w2_sf_mma() const { return w2_sf_mma_; }
  const at::Tensor& fc1_input_scale() const { return fc1_input_scale_; }
  const at::Tensor& fc2_input_scale() const { return fc2_input_scale_; }
  const at::Tensor& w13_weight_scale() const { return w13_weight_scale_; }

 private:
  // checkpoint format
  at::Tensor w13_weight_;          // uint8 [E, 2N, K/2]  packed e2m1
  at::Tensor w13_weight_scale_;    // uint8 [E, 2N, K/16] e4m3 block scales, plain layout
  at::Tensor w13_weight_scale_2_;  // float [E]
  at::Tensor w13_input_scale_;     // float [E]
  at::Tensor w2_weight_;           // uint8 [E, K, N/2]
  at::Tensor w2_weight_scale_;     // uint8 [E, K, N/16]
  at::Tensor w2_weight_scale_2_;   // float [E]
  at::Tensor w2_input_scale_;      // float [E]
  at::Tensor gate_;                // float [E, K] router
  // derived by PWAL
  at::Tensor w13_sf_mma_;          // uint8 [E, round_up(2N,128) * round_up(K/16,4)]
  at::Tensor w2_sf_mma_;           // uint8 [E, round_up(K,128) * round_up(N/16,4)]
  at::Tensor fc1_input_scale_;     // float [1]
  at::Tensor fc2_input_scale_;     // float [1]
  int64_t experts_, hidden_, inter_;

  GRAPHKEEP_DESCRIBE_DERIVED(B12xNvfp4Moe, (torch::nn::Module, DescribedLayer<B12xNvfp4Moe>),
                             (w13_weight_, gk::parameter), (w13_weight_scale_, gk::parameter),
                             (w13_weight_scale_2_, gk::parameter), (w13_input_scale_, gk::parameter),
                             (w2_weight_, gk::parameter), (w2_weight_scale_, gk::parameter),
                             (w2_weight_scale_2_, gk::parameter), (w2_input_scale_, gk::parameter),
                             (gate_, gk::parameter), (w13_sf_mma_, gk::scale), (w2_sf_mma_, gk::scale),
                             (fc1_input_scale_, gk::scale), (fc2_input_scale_, gk::scale), experts_, hidden_, inter_)
};

}  // namespace gk::quant
