#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/kernels/mla_attention.h>

#include "cuda/mla_attention_launch.h"

#include <ATen/ATen.h>

namespace gk::kernels {
namespace {

// The CPU twin of mla_absorbed_kernel, in the same summation order.
void mla_absorbed_cpu(const float* q, const float* c, const float* w_uk_t, const float* w_uv, float* y,
                      int64_t tokens, int64_t heads, int64_t dn, int64_t dv, int64_t latent) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float score = 0.f;
      for (int64_t l = 0; l < latent; ++l) {
        float qk = 0.f;
        for (int64_t d = 0; d < dn; ++d) qk += q[t * heads * dn + h * dn + d] * w_uk_t[(h * dn + d) * latent + l];
        score += qk * c[t * latent + l];
      }
      for (int64_t j = 0; j < dv; ++j) {
        float v = 0.f;
        for (int64_t l = 0; l < latent; ++l) v += c[t * latent + l] * w_uv[(h * latent + l) * dv + j];
        y[t * heads * dv + h * dv + j] = score * v;
      }
    }
}

}  // namespace

MlaAttention::MlaAttention(int64_t heads, int64_t dn, int64_t dv, int64_t latent, c10::Device device)
    : heads_(heads), dn_(dn), dv_(dv), latent_(latent) {
  kv_b_proj_ = checkpoint_param("kv_b_proj", {heads * (dn + dv), latent}, at::kFloat, device);
}

void MlaAttention::process_weights_after_loading() {
  // kv_b_proj rows: per head, dn key rows then dv value rows.
  at::Tensor w = kv_b_proj_.view({heads_, dn_ + dv_, latent_});
  W_UK_T_ = w.narrow(1, 0, dn_).contiguous();                  // [H, dn, L]
  W_UV_ = w.narrow(1, dn_, dv_).transpose(1, 2).contiguous();  // [H, L, dv]
}

at::Tensor MlaAttention::forward(const at::Tensor& q, const at::Tensor& c) {
  GK_CHECK(WeightError, q.dim() == 2 && q.size(1) == heads_ * dn_ && c.dim() == 2 && c.size(1) == latent_ &&
                            c.size(0) == q.size(0),
           "MlaAttention: q must be [T, ", heads_ * dn_, "] and c [T, ", latent_, "], got ", q.sizes(), " and ",
           c.sizes());
  const int64_t tokens = q.size(0);
  at::Tensor y = runtime::empty({tokens, heads_ * dv_}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* uk = W_UK_T_.data_ptr<float>();
  const float* uv = W_UV_.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t H = heads_, dn = dn_, dv = dv_, L = latent_;
  if (q.is_cuda()) {
    GK_LAUNCH_CUDA("mla_absorbed", q,
                   cuda::launch_mla_absorbed(qp, cp, uk, uv, yp, tokens, H, dn, dv, L, runtime::cuda_stream(q)));
  } else {
    hostrt::launch("mla_absorbed",
                   {hostrt::reads(q), hostrt::reads(c), hostrt::reads(W_UK_T_), hostrt::reads(W_UV_), hostrt::writes(y)},
                   [=] { mla_absorbed_cpu(qp, cp, uk, uv, yp, tokens, H, dn, dv, L); });
  }
  return y;
}

}  // namespace gk::kernels
