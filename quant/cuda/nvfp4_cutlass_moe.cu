#include "nvfp4_cutlass_moe_launch.h"

#include <graphkeep/numerics/nvfp4_codec.h>

#include <cuda_runtime.h>

namespace gk::quant::cuda {
namespace {

using namespace gk::quant::codec;

// One block per token: thread 0 routes; threads quantize the 16-blocks of
// the activation, then stride over output rows (one block-scaled dot each).
// The steps are the codec's, called in the order of nvfp4_cutlass_moe_cpu.
__global__ void nvfp4_cutlass_moe_kernel(const float* __restrict__ x, const float* __restrict__ gate,
                                         const std::uint8_t* __restrict__ w13, const std::uint8_t* __restrict__ w13_sf,
                                         const std::uint8_t* __restrict__ w2, const std::uint8_t* __restrict__ w2_sf,
                                         const float* __restrict__ g1_alphas, const float* __restrict__ g2_alphas,
                                         const float* __restrict__ a1_gscale, const float* __restrict__ a2_gscale,
                                         float* __restrict__ y, int64_t experts, int64_t K, int64_t N) {
  extern __shared__ float smem[];
  __shared__ int64_t expert;
  const auto [h, a, xq, xsf, aq, asf] = Nvfp4MoeScratch::carve(smem, K, N);
  const int64_t t = blockIdx.x;
  const float* xt = x + t * K;
  if (threadIdx.x == 0) expert = route_top1(xt, gate, experts, K);
  __syncthreads();
  const int64_t e = expert;
  const float q1 = a1_gscale[e];
  for (int64_t b = threadIdx.x; b < K / kNvfp4Block; b += blockDim.x) nvfp4_quantize_block(xt, b, q1, xq, xsf);
  __syncthreads();
  const float alpha1 = g1_alphas[e];
  for (int64_t m = threadIdx.x; m < 2 * N; m += blockDim.x) {
    const int64_t row = e * 2 * N + m;
    h[m] = fmul(nvfp4_dot(xq, xsf, w13 + row * (K / 2), LinearSf{w13_sf + row * (K / kNvfp4Block)}, K), alpha1);
  }
  __syncthreads();
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) a[n] = fmul(relu(h[n]), h[N + n]);
  __syncthreads();
  const float q2 = a2_gscale[e];
  for (int64_t b = threadIdx.x; b < N / kNvfp4Block; b += blockDim.x) nvfp4_quantize_block(a, b, q2, aq, asf);
  __syncthreads();
  const float alpha2 = g2_alphas[e];
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const int64_t row = e * K + k;
    y[t * K + k] = fmul(nvfp4_dot(aq, asf, w2 + row * (N / 2), LinearSf{w2_sf + row * (N / kNvfp4Block)}, N), alpha2);
  }
}

}  // namespace

void launch_nvfp4_cutlass_moe(const float* x, const float* gate, const std::uint8_t* w13, const std::uint8_t* w13_sf,
                              const std::uint8_t* w2, const std::uint8_t* w2_sf, const float* g1_alphas,
                              const float* g2_alphas, const float* a1_gscale, const float* a2_gscale, float* y,
                              int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, void* stream) {
  const size_t smem = Nvfp4MoeScratch::bytes(hidden, inter);
  nvfp4_cutlass_moe_kernel<<<static_cast<unsigned>(tokens), 64, smem, static_cast<cudaStream_t>(stream)>>>(
      x, gate, w13, w13_sf, w2, w2_sf, g1_alphas, g2_alphas, a1_gscale, a2_gscale, y, experts, hidden, inter);
}

}  // namespace gk::quant::cuda
