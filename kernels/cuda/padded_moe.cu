#include "padded_moe_launch.h"

#include <graphkeep/numerics/nvfp4_codec.h>

#include <cuda_runtime.h>

namespace gk::kernels::cuda {
namespace {

using namespace gk::quant::codec;

// One block per token; thread 0 routes, threads stride over the 2N rows of
// w13, then the N activations, then the K rows of w2. Per-thread sequential
// sums through the shared codec steps: bitwise equal to padded_moe.cpp.
__global__ void padded_moe_kernel(const float* __restrict__ x, const float* __restrict__ gate,
                                  const float* __restrict__ w13, const float* __restrict__ w2, float* __restrict__ y,
                                  int64_t experts, int64_t hidden, int64_t inter, int64_t w13_es, int64_t w13_rs,
                                  int64_t w2_es, int64_t w2_rs) {
  extern __shared__ float smem[];  // h[2N], a[N]
  __shared__ int64_t expert;
  float* h = smem;
  float* a = smem + 2 * inter;
  const int64_t t = blockIdx.x;
  const float* xt = x + t * hidden;
  if (threadIdx.x == 0) expert = route_top1(xt, gate, experts, hidden);
  __syncthreads();
  const int64_t e = expert;
  for (int64_t m = threadIdx.x; m < 2 * inter; m += blockDim.x) {
    const float* row = w13 + e * w13_es + m * w13_rs;
    float s = 0.f;
    for (int64_t k = 0; k < hidden; ++k) s = fadd(s, fmul(row[k], xt[k]));
    h[m] = s;
  }
  __syncthreads();
  for (int64_t n = threadIdx.x; n < inter; n += blockDim.x) a[n] = fmul(relu(h[n]), h[inter + n]);
  __syncthreads();
  for (int64_t k = threadIdx.x; k < hidden; k += blockDim.x) {
    const float* row = w2 + e * w2_es + k * w2_rs;
    float s = 0.f;
    for (int64_t n = 0; n < inter; ++n) s = fadd(s, fmul(row[n], a[n]));
    y[t * hidden + k] = s;
  }
}

}  // namespace

void launch_padded_moe(const float* x, const float* gate, const float* w13, const float* w2, float* y, int64_t tokens,
                       int64_t experts, int64_t hidden, int64_t inter, int64_t w13_expert_stride,
                       int64_t w13_row_stride, int64_t w2_expert_stride, int64_t w2_row_stride, void* stream) {
  const size_t smem = static_cast<size_t>(3 * inter) * sizeof(float);
  padded_moe_kernel<<<static_cast<unsigned>(tokens), 64, smem, static_cast<cudaStream_t>(stream)>>>(
      x, gate, w13, w2, y, experts, hidden, inter, w13_expert_stride, w13_row_stride, w2_expert_stride,
      w2_row_stride);
}

}  // namespace gk::kernels::cuda
