#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/quant/fp8_mla_attention.h>

#include "cuda/fp8_mla_attention_launch.h"
#include <graphkeep/numerics/nvfp4_codec.h>

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace gk::quant {
namespace {

using namespace gk::quant::codec;

// The CPU twin of quant_mla_kernel, in the same summation order.
void quant_mla_cpu(const float* q, const float* c, const std::uint8_t* w_k, const void* w_k_scale,
                   const std::uint8_t* w_v, const void* w_v_scale, float* y, int64_t tokens, int64_t heads, int64_t dn,
                   int64_t dv, int64_t latent, int fmt, float softmax_scale) {
  std::vector<float> qa(static_cast<size_t>(latent)), o(static_cast<size_t>(latent)), score(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* qt = q + t * heads * dn + h * dn;
      for (int64_t l = 0; l < latent; ++l) {
        float s = 0.f;
        for (int64_t d = 0; d < dn; ++d)
          s = fadd(s, fmul(qt[d], dequant_element(fmt, w_k, w_k_scale, h * latent + l, d, dn)));
        qa[l] = s;
      }
      for (int64_t s = 0; s <= t; ++s) {
        float acc = 0.f;
        for (int64_t l = 0; l < latent; ++l) acc = fadd(acc, fmul(qa[l], c[s * latent + l]));
        score[s] = fmul(acc, softmax_scale);
      }
      for (int64_t l = 0; l < latent; ++l) {
        float acc = 0.f;
        for (int64_t s = 0; s <= t; ++s) acc = fadd(acc, fmul(score[s], c[s * latent + l]));
        o[l] = acc;
      }
      for (int64_t j = 0; j < dv; ++j) {
        float acc = 0.f;
        for (int64_t l = 0; l < latent; ++l)
          acc = fadd(acc, fmul(o[l], dequant_element(fmt, w_v, w_v_scale, h * dv + j, l, latent)));
        y[t * heads * dv + h * dv + j] = acc;
      }
    }
}

// Quantizes the rows of w ([R, n] float32, CPU, contiguous) into new CPU
// tensors: (codes, scales) in the layout dequant_element reads.
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& w, MlaWeightFormat format) {
  const int64_t rows = w.size(0), n = w.size(1);
  const float* wp = w.data_ptr<float>();
  if (format == MlaWeightFormat::fp8_e4m3) {
    at::Tensor codes = at::empty({rows, n}, at::kByte);
    at::Tensor scales = at::empty({rows}, at::kFloat);
    std::uint8_t* cp = codes.data_ptr<std::uint8_t>();
    float* sp = scales.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0.f;
      for (int64_t i = 0; i < n; ++i) amax = fabs_(wp[r * n + i]) > amax ? fabs_(wp[r * n + i]) : amax;
      const float s = amax > 0.f ? fdiv(amax, kFp8Max) : 1.f;
      sp[r] = s;
      for (int64_t i = 0; i < n; ++i) cp[r * n + i] = fp8_e4m3_encode(fdiv(wp[r * n + i], s));
    }
    return {codes, scales};
  }
  at::Tensor codes = at::zeros({rows, n / 2}, at::kByte);
  at::Tensor scales = at::empty({rows, n / kMxBlock}, at::kByte);
  std::uint8_t* cp = codes.data_ptr<std::uint8_t>();
  std::uint8_t* sp = scales.data_ptr<std::uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < n / kMxBlock; ++b) {
      const float* blk = wp + r * n + b * kMxBlock;
      float amax = 0.f;
      for (int64_t i = 0; i < kMxBlock; ++i) amax = fabs_(blk[i]) > amax ? fabs_(blk[i]) : amax;
      const std::uint8_t se = mxfp4_scale_for(amax);
      sp[r * (n / kMxBlock) + b] = se;
      const float x = e8m0_decode(se);
      for (int64_t i = 0; i < kMxBlock; ++i) {
        const int64_t col = b * kMxBlock + i;
        const std::uint8_t nib = fp4_e2m1_encode(fdiv(blk[i], x));
        cp[r * (n / 2) + col / 2] |= static_cast<std::uint8_t>((col & 1) ? nib << 4 : nib);
      }
    }
  return {codes, scales};
}

}  // namespace

QuantizedMlaAttention::QuantizedMlaAttention(int64_t heads, int64_t dn, int64_t dv, int64_t latent,
                                             MlaWeightFormat format, c10::Device device, float softmax_scale)
    : heads_(heads), dn_(dn), dv_(dv), latent_(latent), format_(format), softmax_scale_(softmax_scale) {
  GK_CHECK(WeightError, format != MlaWeightFormat::mxfp4 || (dn % kMxBlock == 0 && latent % kMxBlock == 0),
           "QuantizedMlaAttention: mxfp4 blocks of ", kMxBlock, " along kv_b_proj's rows per head (dn) and its "
           "columns (latent) need both to be multiples of ", kMxBlock, ", got dn=", dn, " latent=", latent);
  kv_b_proj_ = checkpoint_param("kv_b_proj", {heads * (dn + dv), latent}, at::kFloat, device);
}

void QuantizedMlaAttention::process_weights_after_loading() {
  // Quantized on the host with the codec the kernels decode with, then moved:
  // the same codes and scales on CPU and CUDA.
  const c10::Device device = kv_b_proj_.device();
  at::Tensor w = kv_b_proj_.to(at::kCPU).contiguous().view({heads_, dn_ + dv_, latent_});
  at::Tensor wk = w.narrow(1, 0, dn_).transpose(1, 2).contiguous().view({heads_ * latent_, dn_});  // rows over dn
  at::Tensor wv = w.narrow(1, dn_, dv_).contiguous().view({heads_ * dv_, latent_});               // rows over L
  auto [kc, ks] = quantize_rows(wk, format_);
  auto [vc, vs] = quantize_rows(wv, format_);
  const bool fp8 = format_ == MlaWeightFormat::fp8_e4m3;
  W_K_ = kc.view({heads_, latent_, -1}).to(device);
  W_V_ = vc.view({heads_, dv_, -1}).to(device);
  W_K_scale_ = (fp8 ? ks.view({heads_, latent_}) : ks.view({heads_, latent_, -1})).to(device);
  W_V_scale_ = (fp8 ? vs.view({heads_, dv_}) : vs.view({heads_, dv_, -1})).to(device);
}

at::Tensor QuantizedMlaAttention::forward(const at::Tensor& q, const at::Tensor& c) {
  GK_CHECK(WeightError, q.dim() == 2 && q.size(1) == heads_ * dn_ && c.dim() == 2 && c.size(1) == latent_ &&
                            c.size(0) == q.size(0) && q.is_contiguous() && c.is_contiguous(),
           "QuantizedMlaAttention: q must be [T, ", heads_ * dn_, "] and c [T, ", latent_, "] (contiguous), got ",
           q.sizes(), " and ", c.sizes());
  const int64_t tokens = q.size(0);
  at::Tensor y = runtime::empty({tokens, heads_ * dv_}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const std::uint8_t* wk = W_K_.data_ptr<std::uint8_t>();
  const std::uint8_t* wv = W_V_.data_ptr<std::uint8_t>();
  const void* ks = W_K_scale_.data_ptr();
  const void* vs = W_V_scale_.data_ptr();
  float* yp = y.data_ptr<float>();
  const int64_t Hh = heads_, dn = dn_, dv = dv_, L = latent_;
  const int fmt = static_cast<int>(format_);
  const float sm = softmax_scale_;
  if (q.is_cuda()) {
    GK_LAUNCH_CUDA("quant_mla", q,
                   cuda::launch_quant_mla(qp, cp, wk, ks, wv, vs, yp, tokens, Hh, dn, dv, L, fmt, sm,
                                          runtime::cuda_stream(q, "quant_mla")));
  } else {
    hostrt::launch("quant_mla",
                   {hostrt::reads(q), hostrt::reads(c), hostrt::reads(W_K_), hostrt::reads(W_K_scale_),
                    hostrt::reads(W_V_), hostrt::reads(W_V_scale_), hostrt::writes(y)},
                   [=] { quant_mla_cpu(qp, cp, wk, ks, wv, vs, yp, tokens, Hh, dn, dv, L, fmt, sm); });
  }
  return y;
}

}  // namespace gk::quant
