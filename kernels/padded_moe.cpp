#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/kernels/padded_moe.h>

#include "cuda/padded_moe_launch.h"
#include <graphkeep/numerics/nvfp4_codec.h>

#include <ATen/ATen.h>

#include <vector>

namespace gk::kernels {
namespace {

using namespace gk::quant::codec;

// The CPU twin of padded_moe_kernel, in the same summation order.
void padded_moe_cpu(const float* x, const float* gate, const float* w13, const float* w2, float* y, int64_t tokens,
                    int64_t experts, int64_t hidden, int64_t inter, int64_t w13_es, int64_t w13_rs, int64_t w2_es,
                    int64_t w2_rs) {
  std::vector<float> h(static_cast<size_t>(2 * inter)), a(static_cast<size_t>(inter));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * hidden;
    const int64_t e = route_top1(xt, gate, experts, hidden);
    for (int64_t m = 0; m < 2 * inter; ++m) {
      const float* row = w13 + e * w13_es + m * w13_rs;
      float s = 0.f;
      for (int64_t k = 0; k < hidden; ++k) s = fadd(s, fmul(row[k], xt[k]));
      h[m] = s;
    }
    for (int64_t n = 0; n < inter; ++n) a[n] = fmul(relu(h[n]), h[inter + n]);
    for (int64_t k = 0; k < hidden; ++k) {
      const float* row = w2 + e * w2_es + k * w2_rs;
      float s = 0.f;
      for (int64_t n = 0; n < inter; ++n) s = fadd(s, fmul(row[n], a[n]));
      y[t * hidden + k] = s;
    }
  }
}

// The bytes a strided parameter's kernel may touch: its whole storage from
// its offset on (the padding included).
std::size_t storage_extent(const at::Tensor& t) {
  return t.storage().nbytes() - static_cast<std::size_t>(t.storage_offset()) * t.element_size();
}

// `param.data = F.pad(param, (0, pad))[..., :-pad]`: the same shape in a new
// storage whose last-dim rows are `pad` elements longer.
void pad_last_dim(at::Tensor& param, int64_t pad) {
  const int64_t n = param.size(-1);
  at::Tensor padded = at::constant_pad_nd(param, {0, pad}, 0).narrow(-1, 0, n);
  param.set_data(padded);
}

}  // namespace

PaddedMoe::PaddedMoe(int64_t experts, int64_t hidden, int64_t intermediate, c10::Device device)
    : experts_(experts), hidden_(hidden), inter_(intermediate) {
  w13_weight_ = checkpoint_param("w13_weight", {experts, 2 * intermediate, hidden}, at::kFloat, device);
  w2_weight_ = checkpoint_param("w2_weight", {experts, hidden, intermediate}, at::kFloat, device);
  gate_ = checkpoint_param("gate", {experts, hidden}, at::kFloat, device);
}

void PaddedMoe::process_weights_after_loading() {
  pad_ = kPadBytes / static_cast<int64_t>(w13_weight_.element_size());
  pad_last_dim(w13_weight_, pad_);
  pad_last_dim(w2_weight_, pad_);
  w13_row_stride_ = w13_weight_.stride(1);
  w2_row_stride_ = w2_weight_.stride(1);
}

at::Tensor PaddedMoe::forward(const at::Tensor& x) {
  GK_CHECK(WeightError, x.dim() == 2 && x.size(1) == hidden_ && x.is_contiguous() && x.scalar_type() == at::kFloat,
           "PaddedMoe: x must be a contiguous float32 [T, ", hidden_, "], got ", x.sizes());
  GK_CHECK(StateError, w13_weight_.stride(1) == w13_row_stride_ && w2_weight_.stride(1) == w2_row_stride_ &&
                           w13_weight_.stride(2) == 1 && w2_weight_.stride(2) == 1,
           "PaddedMoe: the weights' row strides ", w13_weight_.strides(), " / ", w2_weight_.strides(),
           " are not the padded ones PWAL set (", w13_row_stride_, ", ", w2_row_stride_, ")");
  const int64_t tokens = x.size(0);
  at::Tensor y = runtime::empty({tokens, hidden_}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* gp = gate_.data_ptr<float>();
  const float* w13p = w13_weight_.data_ptr<float>();
  const float* w2p = w2_weight_.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t E = experts_, K = hidden_, N = inter_;
  const int64_t es13 = w13_weight_.stride(0), rs13 = w13_row_stride_;
  const int64_t es2 = w2_weight_.stride(0), rs2 = w2_row_stride_;
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("padded_moe", x,
                   cuda::launch_padded_moe(xp, gp, w13p, w2p, yp, tokens, E, K, N, es13, rs13, es2, rs2,
                                           runtime::cuda_stream(x, "padded_moe")));
  } else {
    hostrt::launch("padded_moe",
                   {hostrt::reads(x), hostrt::reads(gate_), hostrt::reads(w13p, storage_extent(w13_weight_)),
                    hostrt::reads(w2p, storage_extent(w2_weight_)), hostrt::writes(y)},
                   [=] { padded_moe_cpu(xp, gp, w13p, w2p, yp, tokens, E, K, N, es13, rs13, es2, rs2); });
  }
  return y;
}

}  // namespace gk::kernels
