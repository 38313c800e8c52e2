#include "mla_attention_launch.h"

#include <cuda_runtime.h>

namespace gk::kernels::cuda {
namespace {

// One block per (token, head); threads stride over the latent and value dims.
// Sequential per-thread sums keep the result bitwise equal to the CPU loop
// order used by mla_attention.cpp.
__global__ void mla_absorbed_kernel(const float* __restrict__ q, const float* __restrict__ c,
                                    const float* __restrict__ w_uk_t, const float* __restrict__ w_uv,
                                    float* __restrict__ y, int64_t heads, int64_t dn, int64_t dv, int64_t latent) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  extern __shared__ float score_smem[];
  if (threadIdx.x == 0) {
    float score = 0.f;
    for (int64_t l = 0; l < latent; ++l) {
      float qk = 0.f;
      for (int64_t d = 0; d < dn; ++d) qk += q[t * heads * dn + h * dn + d] * w_uk_t[(h * dn + d) * latent + l];
      score += qk * c[t * latent + l];
    }
    score_smem[0] = score;
  }
  __syncthreads();
  const float score = score_smem[0];
  for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
    float v = 0.f;
    for (int64_t l = 0; l < latent; ++l) v += c[t * latent + l] * w_uv[(h * latent + l) * dv + j];
    y[t * heads * dv + h * dv + j] = score * v;
  }
}

}  // namespace

void launch_mla_absorbed(const float* q, const float* c, const float* w_uk_t, const float* w_uv, float* y,
                         int64_t tokens, int64_t heads, int64_t dn, int64_t dv, int64_t latent, void* stream) {
  dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads));
  mla_absorbed_kernel<<<grid, 64, sizeof(float), static_cast<cudaStream_t>(stream)>>>(q, c, w_uk_t, w_uv, y, heads,
                                                                                       dn, dv, latent);
}

}  // namespace gk::kernels::cuda
