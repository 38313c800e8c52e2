#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/quant/moe_scales_b12x.h>

#include "cuda/moe_scales_b12x_launch.h"
#include <graphkeep/numerics/nvfp4_codec.h>

#include <ATen/ATen.h>

#include <vector>

namespace gk::quant {
namespace {

using namespace gk::quant::codec;

// The CPU twin of b12x_moe_kernel: the same codec steps in the same order.
void b12x_moe_cpu(const float* x, const float* gate, const std::uint8_t* w13, const std::uint8_t* w13_sf_mma,
                  const float* w13_ws2, const std::uint8_t* w2, const std::uint8_t* w2_sf_mma, const float* w2_ws2,
                  const float* fc1_input_scale, const float* fc2_input_scale, float* y, int64_t tokens,
                  int64_t experts, int64_t K, int64_t N) {
  const int64_t ksf1 = K / kNvfp4Block, ksf2 = N / kNvfp4Block;
  const int64_t size1 = nvfp4_sf_swizzled_size(2 * N, ksf1), size2 = nvfp4_sf_swizzled_size(K, ksf2);
  const int64_t tiles1 = round_up(ksf1, 4) / 4, tiles2 = round_up(ksf2, 4) / 4;
  std::vector<float> h(static_cast<size_t>(2 * N)), a(static_cast<size_t>(N));
  std::vector<std::uint8_t> xq(static_cast<size_t>(K)), xsf(static_cast<size_t>(ksf1));
  std::vector<std::uint8_t> aq(static_cast<size_t>(N)), asf(static_cast<size_t>(ksf2));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * K;
    const int64_t e = route_top1(xt, gate, experts, K);
    const float q1 = fc1_input_scale[0];
    for (int64_t b = 0; b < ksf1; ++b) nvfp4_quantize_block(xt, b, q1, xq.data(), xsf.data());
    const float alpha1 = fdiv(w13_ws2[e], q1);
    for (int64_t m = 0; m < 2 * N; ++m) {
      const Swizzled128x4Sf sf{w13_sf_mma + e * size1, m, tiles1};
      h[m] = fmul(nvfp4_dot(xq.data(), xsf.data(), w13 + (e * 2 * N + m) * (K / 2), sf, K), alpha1);
    }
    for (int64_t n = 0; n < N; ++n) a[n] = fmul(relu(h[n]), h[N + n]);
    const float q2 = fc2_input_scale[0];
    for (int64_t b = 0; b < ksf2; ++b) nvfp4_quantize_block(a.data(), b, q2, aq.data(), asf.data());
    const float alpha2 = fdiv(w2_ws2[e], q2);
    for (int64_t k = 0; k < K; ++k) {
      const Swizzled128x4Sf sf{w2_sf_mma + e * size2, k, tiles2};
      y[t * K + k] = fmul(nvfp4_dot(aq.data(), asf.data(), w2 + (e * K + k) * (N / 2), sf, N), alpha2);
    }
  }
}

// 1 / max_e scales[e], computed on the host, as a new [1] tensor on `device`.
at::Tensor inverse_max(const at::Tensor& scales, c10::Device device, const char* what) {
  const at::Tensor s = scales.to(at::kCPU).contiguous();
  float mx = 0.f;
  for (int64_t e = 0; e < s.numel(); ++e) mx = s.data_ptr<float>()[e] > mx ? s.data_ptr<float>()[e] : mx;
  GK_CHECK(WeightError, mx > 0.f, "B12xNvfp4Moe: ", what, " has no positive entry");
  at::Tensor out = at::empty({1}, at::kFloat);
  out.data_ptr<float>()[0] = fdiv(1.f, mx);
  return out.to(device);
}

}  // namespace

at::Tensor swizzle_sf_128x4(const at::Tensor& sf) {
  GK_CHECK(WeightError, sf.dim() == 3 && sf.scalar_type() == at::kByte, "swizzle_sf_128x4: expects uint8 [E, M, Ksf], got ",
           sf.sizes(), " ", sf.scalar_type());
  const at::Tensor src = sf.to(at::kCPU).contiguous();
  const int64_t E = src.size(0), M = src.size(1), ksf = src.size(2);
  const int64_t size = nvfp4_sf_swizzled_size(M, ksf), tiles = round_up(ksf, 4) / 4;
  at::Tensor out = at::zeros({E, size}, at::kByte);
  const std::uint8_t* in = src.data_ptr<std::uint8_t>();
  std::uint8_t* o = out.data_ptr<std::uint8_t>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < ksf; ++k) o[e * size + nvfp4_sf_offset_128x4(m, k, tiles)] = in[(e * M + m) * ksf + k];
  return out;
}

at::Tensor unswizzle_sf_128x4(const at::Tensor& swizzled, int64_t m, int64_t ksf) {
  const at::Tensor src = swizzled.to(at::kCPU).contiguous();
  const int64_t E = src.size(0), size = src.size(1), tiles = round_up(ksf, 4) / 4;
  GK_CHECK(WeightError, size == nvfp4_sf_swizzled_size(m, ksf), "unswizzle_sf_128x4: ", size,
           " bytes per expert do not hold a swizzled [", m, ", ", ksf, "] matrix");
  at::Tensor out = at::empty({E, m, ksf}, at::kByte);
  const std::uint8_t* in = src.data_ptr<std::uint8_t>();
  std::uint8_t* o = out.data_ptr<std::uint8_t>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t k = 0; k < ksf; ++k) o[(e * m + r) * ksf + k] = in[e * size + nvfp4_sf_offset_128x4(r, k, tiles)];
  return out;
}

B12xNvfp4Moe::B12xNvfp4Moe(int64_t experts, int64_t hidden, int64_t intermediate, c10::Device device)
    : experts_(experts), hidden_(hidden), inter_(intermediate) {
  GK_CHECK(WeightError, hidden % kNvfp4Block == 0 && intermediate % kNvfp4Block == 0,
           "B12xNvfp4Moe: hidden and intermediate sizes (the packed dims of w13_weight, w2_weight and their "
           "block scales) must be multiples of ", kNvfp4Block, ", got ", hidden, " and ", intermediate);
  const int64_t E = experts, K = hidden, N = intermediate;
  w13_weight_ = checkpoint_param("w13_weight", {E, 2 * N, K / 2}, at::kByte, device);
  w13_weight_scale_ = checkpoint_param("w13_weight_scale", {E, 2 * N, K / kNvfp4Block}, at::kByte, device);
  w13_weight_scale_2_ = checkpoint_param("w13_weight_scale_2", {E}, at::kFloat, device, Fill::ones);
  w13_input_scale_ = checkpoint_param("w13_input_scale", {E}, at::kFloat, device, Fill::ones);
  w2_weight_ = checkpoint_param("w2_weight", {E, K, N / 2}, at::kByte, device);
  w2_weight_scale_ = checkpoint_param("w2_weight_scale", {E, K, N / kNvfp4Block}, at::kByte, device);
  w2_weight_scale_2_ = checkpoint_param("w2_weight_scale_2", {E}, at::kFloat, device, Fill::ones);
  w2_input_scale_ = checkpoint_param("w2_input_scale", {E}, at::kFloat, device, Fill::ones);
  gate_ = checkpoint_param("gate", {E, K}, at::kFloat, device);
}

void B12xNvfp4Moe::process_weights_after_loading() {
  // Swizzled and reduced on the host, then moved: the same bytes on CPU and
  // CUDA. Each PWAL allocates four new tensors.
  const c10::Device device = w13_weight_scale_.device();
  w13_sf_mma_ = swizzle_sf_128x4(w13_weight_scale_).to(device);
  w2_sf_mma_ = swizzle_sf_128x4(w2_weight_scale_).to(device);
  fc1_input_scale_ = inverse_max(w13_input_scale_, device, "w13_input_scale");
  fc2_input_scale_ = inverse_max(w2_input_scale_, device, "w2_input_scale");
}

at::Tensor B12xNvfp4Moe::forward(const at::Tensor& x) {
  GK_CHECK(WeightError, x.dim() == 2 && x.size(1) == hidden_ && x.is_contiguous() && x.scalar_type() == at::kFloat,
           "B12xNvfp4Moe: x must be a contiguous float32 [T, ", hidden_, "], got ", x.sizes());
  const int64_t tokens = x.size(0);
  at::Tensor y = runtime::empty({tokens, hidden_}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* gp = gate_.data_ptr<float>();
  const std::uint8_t* w13 = w13_weight_.data_ptr<std::uint8_t>();
  const std::uint8_t* sf13 = w13_sf_mma_.data_ptr<std::uint8_t>();
  const float* ws13 = w13_weight_scale_2_.data_ptr<float>();
  const std::uint8_t* w2 = w2_weight_.data_ptr<std::uint8_t>();
  const std::uint8_t* sf2 = w2_sf_mma_.data_ptr<std::uint8_t>();
  const float* ws2 = w2_weight_scale_2_.data_ptr<float>();
  const float* fc1 = fc1_input_scale_.data_ptr<float>();
  const float* fc2 = fc2_input_scale_.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t E = experts_, K = hidden_, N = inter_;
  if (x.is_cuda()) {
    GK_LAUNCH_CUDA("b12x_moe", x,
                   cuda::launch_b12x_moe(xp, gp, w13, sf13, ws13, w2, sf2, ws2, fc1, fc2, yp, tokens, E, K, N,
                                         runtime::cuda_stream(x, "b12x_moe")));
  } else {
    hostrt::launch("b12x_moe",
                   {hostrt::reads(x), hostrt::reads(gate_), hostrt::reads(w13_weight_), hostrt::reads(w13_sf_mma_),
                    hostrt::reads(w13_weight_scale_2_), hostrt::reads(w2_weight_), hostrt::reads(w2_sf_mma_),
                    hostrt::reads(w2_weight_scale_2_), hostrt::reads(fc1_input_scale_),
                    hostrt::reads(fc2_input_scale_), hostrt::writes(y)},
                   [=] { b12x_moe_cpu(xp, gp, w13, sf13, ws13, w2, sf2, ws2, fc1, fc2, yp, tokens, E, K, N); });
  }
  return y;
}

}  // namespace gk::quant
