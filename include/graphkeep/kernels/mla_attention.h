// graphkeep/kernels/mla_attention.h
//
// Failure site 1: MLA absorbed weights. PWAL derives W_UK_T and W_UV from the
// checkpoint's kv_b_proj (per head: the key and value up-projections of the
// compressed latent) and stores them as plain members; every PWAL allocates
// them anew, so without graphkeep a captured graph keeps reading the old ones.
//
// The computation, per token t and head h (latent c_t of size L, query
// q_{t,h} of size dn):
//   score_{t,h} = (W_UK_T[h] q_{t,h}) . c_t        (absorbed key: L-dim dot)
//   out_{t,h}   = score_{t,h} * (W_UV[h]^T c_t)    (value: dv outputs)
//
//   gk::kernels::MlaAttention attn(/*heads=*/4, /*dn=*/8, /*dv=*/8, /*latent=*/16, at::kCPU);
//   at::Tensor y = attn.forward(q, c);   // q: [T, H*dn], c: [T, L] -> y: [T, H*dv]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::kernels {

class MlaAttention : public torch::nn::Module, public DescribedLayer<MlaAttention> {
 public:
  MlaAttention(int64_t heads, int64_t dn, int64_t dv, int64_t latent, c10::Device device);

  void process_weights_after_loading() override;

  // q: [T, H*dn], c: [T, L] (float32, on the layer's device) -> [T, H*dv]
  at::Tensor forward(const at::Tensor& q, const at::Tensor& c);

  const at::Tensor& w_uk_t() const { return W_UK_T_; }
  const at::Tensor& w_uv() const { return W_UV_; }

 private:
  at::Tensor kv_b_proj_;  // [H*(dn+dv), L], checkpoint format
  at::Tensor W_UK_T_;     // [H, dn, L]
  at::Tensor W_UV_;       // [H, L, dv]
  int64_t heads_, dn_, dv_, latent_;

  GRAPHKEEP_DESCRIBE_DERIVED(MlaAttention, (torch::nn::Module, DescribedLayer<MlaAttention>),
                             (kv_b_proj_, gk::parameter), (W_UK_T_, gk::derived_weight), (W_UV_, gk::derived_weight),
                             heads_, dn_, dv_, latent_)
};

}  // namespace gk::kernels
