#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/quant/nvfp4_cutlass_moe.h>

#include <graphkeep/numerics/nvfp4_codec.h>
#include "cuda/nvfp4_cutlass_moe_launch.h"

#include <ATen/ATen.h>

#include <vector>

namespace gk::quant {
namespace {

using namespace gk::quant::codec;

// The CPU twin of nvfp4_cutlass_moe_kernel: the same codec steps in the same order.
void nvfp4_cutlass_moe_cpu(const float* x, const float* gate, const std::uint8_t* w13, const std::uint8_t* w13_sf,
                           const std::uint8_t* w2, const std::uint8_t* w2_sf, const float* g1_alphas,
                           const float* g2_alphas, const float* a1_gscale, const float* a2_gscale, float* y,
                           int64_t tokens, int64_t experts, int64_t K, int64_t N) {
  std::vector<float> h(static_cast<size_t>(2 * N)), a(static_cast<size_t>(N));
  std::vector<std::uint8_t> xq(static_cast<size_t>(K)), xsf(static_cast<size_t>(K / kNvfp4Block));
  std::vector<std::uint8_t> aq(static_cast<size_t>(N)), asf(static_cast<size_t>(N / kNvfp4Block));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * K;
    const int64_t e = route_top1(xt, gate, experts, K);
    for (int64_t b = 0; b < K / kNvfp4Block; ++b) nvfp4_quantize_block(xt, b, a1_gscale[e], xq.data(), xsf.data());
    for (int64_t m = 0; m < 2 * N; ++m) {
      const int64_t row = e * 2 * N + m;
      h[m] = fmul(nvfp4_dot(xq.data(), xsf.data(), w13 + row * (K / 2), LinearSf{w13_sf + row * (K / kNvfp4Block)}, K),
                  g1_alphas[e]);
    }
    for (int64_t n = 0; n < N; ++n) a[n] = fmul(relu(h[n]), h[N + n]);
    for (int64_t b = 0; b < N / kNvfp4Block; ++b) nvfp4_quantize_block(a.data(), b, a2_gscale[e], aq.data(), asf.data());
    for (int64_t k = 0; k < K; ++k) {
      const int64_t row = e * K + k;
      y[t * K + k] = fmul(nvfp4_dot(aq.data(), asf.data(), w2 + row * (N / 2), LinearSf{w2_sf + row * (N / kNvfp4Block)}, N),
                          g2_alphas[e]);
    }
  }
}

}  // namespace

Nvfp4CutlassMoe::Nvfp4CutlassMoe(int64_t experts, int64_t hidden, int64_t intermediate, c10::Device device)
    : experts_(experts), hidden_(hidden), inter_(intermediate) {
  GK_CHECK(WeightError, hidden % kNvfp4Block == 0 && intermediate % kNvfp4Block == 0,
           "Nvfp4CutlassMoe: hidden and intermediate sizes (the packed dims of w13_weight, w2_weight and their "
           "block scales) must be multiples of ", kNvfp4Block, ", got ", hidden, " and ", intermediate);
  const int64_t E = experts, K = hidden, N = intermediate;
  w13_weight_ = checkpoint_param("w13_weight", {E, 2 * N, K / 2}, at::kByte, device);
  w13_weight_scale_ = checkpoint_param("w13_weight_scale", {E, 2 * N, K / kNvfp4Block}, at::kByte, device);
  w13_weight_global_scale_ = checkpoint_param("w13_weight_global_scale", {E}, at::kFloat, device, Fill::ones);
  w13_input_global_scale_ = checkpoint_param("w13_input_global_scale", {E}, at::kFloat, device, Fill::ones);
  w2_weight_ = checkpoint_param("w2_weight", {E, K, N / 2}, at::kByte, device);
  w2_weight_scale_ = checkpoint_param("w2_weight_scale", {E, K, N / kNvfp4Block}, at::kByte, device);
  w2_weight_global_scale_ = checkpoint_param("w2_weight_global_scale", {E}, at::kFloat, device, Fill::ones);
  w2_input_global_scale_ = checkpoint_param("w2_input_global_scale", {E}, at::kFloat, device, Fill::ones);
  gate_ = checkpoint_param("gate", {E, K}, at::kFloat, device);
}

void Nvfp4CutlassMoe::process_weights_after_loading() {
  // Computed on the host (one rounding each) and moved: the same bits on CPU
  // and CUDA. Each PWAL allocates four new tensors.
  const c10::Device device = w13_input_global_scale_.device();
  const at::Tensor i13 = w13_input_global_scale_.to(at::kCPU).contiguous();
  const at::Tensor g13 = w13_weight_global_scale_.to(at::kCPU).contiguous();
  const at::Tensor i2 = w2_input_global_scale_.to(at::kCPU).contiguous();
  const at::Tensor g2 = w2_weight_global_scale_.to(at::kCPU).contiguous();
  at::Tensor alphas1 = at::empty({experts_}, at::kFloat), alphas2 = at::empty({experts_}, at::kFloat);
  at::Tensor gscale1 = at::empty({experts_}, at::kFloat), gscale2 = at::empty({experts_}, at::kFloat);
  for (int64_t e = 0; e < experts_; ++e) {
    const float in13 = i13.data_ptr<float>()[e], in2 = i2.data_ptr<float>()[e];
    GK_CHECK(WeightError, in13 > 0.f && in2 > 0.f, "Nvfp4CutlassMoe: expert ", e,
             " has a non-positive input global scale: w13_input_global_scale[", e, "] = ", in13,
             ", w2_input_global_scale[", e, "] = ", in2);
    alphas1.data_ptr<float>()[e] = fmul(in13, g13.data_ptr<float>()[e]);
    alphas2.data_ptr<float>()[e] = fmul(in2, g2.data_ptr<float>()[e]);
    gscale1.data_ptr<float>()[e] = fdiv(1.f, in13);
    gscale2.data_ptr<float>()[e] = fdiv(1.f, in2);
  }
  g1_alphas_ = alphas1.to(device);
  g2_alphas_ = alphas2.to(device);
  a1_gscale_ = gscale1.to(device);
  a2_gscale_ = gscale2.to(device);
}

at::Tensor Nvfp4CutlassMoe::forward(const at::Tensor& x) {
  GK_CHECK(WeightError, x.dim() == 2 && x.size(1) == hidden_ && x.is_contiguous() && x.scalar_type() == at::kFloat,
           "Nvfp4CutlassMoe: x must be a contiguous float32 [T, ", hidden_, "], got ", x.sizes());
  const int64_t tokens = x.size(0);
  at::Tensor y = runtime::empty({tokens, hidden_}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* gp = gate_.data_ptr<float>();
  const std::uint8_t* w13 = w13_weight_.data_ptr<std::uint8_t>();
  const std::uint8_t* w13sf = w13_weight_scale_.data_ptr<std::uint8_t>();
  const std::uint8_t* w2 = w2_weight_.data_ptr<std::uint8_t>();
  const std::uint8_t* w2sf = w2_weight_scale_.data_ptr<std::uint8_t>();
  const float* g1 = g1_alphas_.data_ptr<float>();
  const float* g2 = g2_alphas_.data_ptr<float>();
  const float* a1 = a1_gscale_.data_ptr<float>();
  const float* a2 = a2_gscale_.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t E = experts_, K = hidden_, N = inter_;
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("nvfp4_cutlass_moe", x,
                   cuda::launch_nvfp4_cutlass_moe(xp, gp, w13, w13sf, w2, w2sf, g1, g2, a1, a2, yp, tokens, E, K, N,
                                                  runtime::cuda_stream(x, "nvfp4_cutlass_moe")));
  } else {
    hostrt::launch("nvfp4_cutlass_moe",
                   {hostrt::reads(x), hostrt::reads(gate_), hostrt::reads(w13_weight_), hostrt::reads(w13_weight_scale_),
                    hostrt::reads(w2_weight_), hostrt::reads(w2_weight_scale_), hostrt::reads(g1_alphas_),
                    hostrt::reads(g2_alphas_), hostrt::reads(a1_gscale_), hostrt::reads(a2_gscale_), hostrt::writes(y)},
                   [=] { nvfp4_cutlass_moe_cpu(xp, gp, w13, w13sf, w2, w2sf, g1, g2, a1, a2, yp, tokens, E, K, N); });
  }
  return y;
}

}  // namespace gk::quant
