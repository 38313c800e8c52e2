// graphkeep/quant/fp8_mla_attention.h
//
// Failure site 7: MLA with FP8 / FP4 attention weights and their scales
// (vLLM's AITER MLA FP8/FP4 path). PWAL splits the checkpoint's kv_b_proj into
// the absorbed key and value up-projections and *quantizes* them: W_K and W_V
// become uint8 codes, W_K_scale and W_V_scale new scale tensors. Every PWAL
// allocates all four anew, so without graphkeep a captured graph keeps
// dequantizing the old codes with the old scales.
//
// Formats (MlaWeightFormat):
//   fp8_e4m3  codes: fp8 e4m3fn bytes, one per element; scales: float32, one
//             per row (amax / 448);
//   mxfp4     codes: fp4 e2m1 nibbles, two per byte; scales: e8m0 bytes, one
//             per 32-element block of a row (OCP MX).
// W_K is stored [H, L, dn] (rows over dn), W_V [H, dv, L] (rows over L); the
// kernel dequantizes each element as it reads it.
//
// The computation, a causal, softmax-free attention in the latent space, per
// token t and head h (latents c_s of size L, query q_{t,h} of size dn):
//   qa_l     = sum_d q_{t,h,d} W_K[h, l, d]              (absorbed query)
//   score_s  = scale * (qa . c_s)                        s <= t
//   o_l      = sum_{s<=t} score_s c_{s,l}
//   y_{t,h,j}= sum_l o_l W_V[h, j, l]
//
//   gk::quant::QuantizedMlaAttention attn(2, 32, 32, 64, gk::quant::MlaWeightFormat::mxfp4, at::kCPU);
//   at::Tensor y = attn.forward(q, c);   // q: [T, H*dn], c: [T, L] -> [T, H*dv]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::quant {

enum class MlaWeightFormat : int { fp8_e4m3 = 0, mxfp4 = 1 };

class QuantizedMlaAttention : public torch::nn::Module, public DescribedLayer<QuantizedMlaAttention> {
 public:
  QuantizedMlaAttention(int64_t heads, int64_t dn, int64_t dv, int64_t latent, MlaWeightFormat format,
                        c10::Device device, float softmax_scale = 0.125f);

  void process_weights_after_loading() override;

  // q: [T, H*dn], c: [T, L] (float32, contiguous, on the layer's device) -> [T, H*dv]
  at::Tensor forward(const at::Tensor& q, const at::Tensor& c);

  const at::Tensor& w_k() const { return W_K_; }
  const at::Tensor& w_v() const { return W_V_; }
  const at::Tensor& w_k_scale() const { return W_K_scale_; }
  const at::Tensor& w_v_scale() const { return W_V_scale_; }
  MlaWeightFormat format() const { return format_; }

 private:
  at::Tensor kv_b_proj_;  // [H*(dn+dv), L] float32, checkpoint format
  at::Tensor W_K_;        // uint8 [H, L, dn] (fp8) or [H, L, dn/2] (mxfp4)
  at::Tensor W_V_;        // uint8 [H, dv, L] (fp8) or [H, dv, L/2] (mxfp4)
  at::Tensor W_K_scale_;  // float [H, L] (fp8) or uint8 e8m0 [H, L, dn/32] (mxfp4)
  at::Tensor W_V_scale_;  // float [H, dv] (fp8) or uint8 e8m0 [H, dv, L/32] (mxfp4)
  int64_t heads_, dn_, dv_, latent_;
  MlaWeightFormat format_;
  float softmax_scale_;

  GRAPHKEEP_DESCRIBE_DERIVED(QuantizedMlaAttention, (torch::nn::Module, DescribedLayer<QuantizedMlaAttention>),
                             (kv_b_proj_, gk::parameter), (W_K_, gk::derived_weight), (W_V_, gk::derived_weight),
                             (W_K_scale_, gk::scale), (W_V_scale_, gk::scale), heads_, dn_, dv_, latent_, format_,
                             softmax_scale_)
};

}  // namespace gk::quant
