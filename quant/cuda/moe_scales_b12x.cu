#include "moe_scales_b12x_launch.h"

#include <graphkeep/numerics/nvfp4_codec.h>

#include <cuda_runtime.h>

namespace gk::quant::cuda {
namespace {

using namespace gk::quant::codec;

// One block per token, as nvfp4_cutlass_moe_kernel, but the weight block
// scales come from the swizzled MMA layout (Swizzled128x4Sf un-swizzles each
// read) and the activation scales are two global device scalars. The order
// of every step is that of b12x_moe_cpu (moe_scales_b12x.cpp).
__global__ void b12x_moe_kernel(const float* __restrict__ x, const float* __restrict__ gate,
                                const std::uint8_t* __restrict__ w13, const std::uint8_t* __restrict__ w13_sf_mma,
                                const float* __restrict__ w13_ws2, const std::uint8_t* __restrict__ w2,
                                const std::uint8_t* __restrict__ w2_sf_mma, const float* __restrict__ w2_ws2,
                                const float* __restrict__ fc1_input_scale, const float* __restrict__ fc2_input_scale,
                                float* __restrict__ y, int64_t experts, int64_t K, int64_t N) {
  extern __shared__ float smem[];
  __shared__ int64_t expert;
  const auto [h, a, xq, xsf, aq, asf] = Nvfp4MoeScratch::carve(smem, K, N);
  const int64_t ksf1 = K / kNvfp4Block, ksf2 = N / kNvfp4Block;
  const int64_t size1 = nvfp4_sf_swizzled_size(2 * N, ksf1), size2 = nvfp4_sf_swizzled_size(K, ksf2);
  const int64_t tiles1 = round_up(ksf1, 4) / 4, tiles2 = round_up(ksf2, 4) / 4;
  const int64_t t = blockIdx.x;
  const float* xt = x + t * K;
  if (threadIdx.x == 0) expert = route_top1(xt, gate, experts, K);
  __syncthreads();
  const int64_t e = expert;
  const float q1 = fc1_input_scale[0];
  for (int64_t b = threadIdx.x; b < ksf1; b += blockDim.x) nvfp4_quantize_block(xt, b, q1, xq, xsf);
  __syncthreads();
  const float alpha1 = fdiv(w13_ws2[e], q1);
  for (int64_t m = threadIdx.x; m < 2 * N; m += blockDim.x) {
    const Swizzled128x4Sf sf{w13_sf_mma + e * size1, m, tiles1};
    h[m] = fmul(nvfp4_dot(xq, xsf, w13 + (e * 2 * N + m) * (K / 2), sf, K), alpha1);
  }
  __syncthreads();
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) a[n] = fmul(relu(h[n]), h[N + n]);
  __syncthreads();
  const float q2 = fc2_input_scale[0];
  for (int64_t b = threadIdx.x; b < ksf2; b += blockDim.x) nvfp4_quantize_block(a, b, q2, aq, asf);
  __syncthreads();
  const float alpha2 = fdiv(w2_ws2[e], q2);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const Swizzled128x4Sf sf{w2_sf_mma + e * size2, k, tiles2};
    y[t * K + k] = fmul(nvfp4_dot(aq, asf, w2 + (e * K + k) * (N / 2), sf, N), alpha2);
  }
}

}  // namespace

void launch_b12x_moe(const float* x, const float* gate, const std::uint8_t* w13, const std::uint8_t* w13_sf_mma,
                     const float* w13_weight_scale_2, const std::uint8_t* w2, const std::uint8_t* w2_sf_mma,
                     const float* w2_weight_scale_2, const float* fc1_input_scale, const float* fc2_input_scale,
                     float* y, int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, void* stream) {
  const size_t smem = Nvfp4MoeScratch::bytes(hidden, inter);
  b12x_moe_kernel<<<static_cast<unsigned>(tokens), 64, smem, static_cast<cudaStream_t>(stream)>>>(
      x, gate, w13, w13_sf_mma, w13_weight_scale_2, w2, w2_sf_mma, w2_weight_scale_2, fc1_input_scale,
      fc2_input_scale, y, experts, hidden, inter);
}

}  // namespace gk::quant::cuda
