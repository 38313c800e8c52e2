#include "fp8_mla_attention_launch.h"

#include <graphkeep/numerics/nvfp4_codec.h>

#include <cuda_runtime.h>

namespace gk::quant::cuda {
namespace {

using namespace gk::quant::codec;

// One block per (token, head). Threads stride over the latent dim for the
// absorbed query and the weighted latent, over the visible tokens for the
// scores, over the value dim for the output; each sum is sequential in one
// thread, in the order of quant_mla_cpu (fp8_mla_attention.cpp).
__global__ void quant_mla_kernel(const float* __restrict__ q, const float* __restrict__ c,
                                 const std::uint8_t* __restrict__ w_k, const void* __restrict__ w_k_scale,
                                 const std::uint8_t* __restrict__ w_v, const void* __restrict__ w_v_scale,
                                 float* __restrict__ y, int64_t tokens, int64_t heads, int64_t dn, int64_t dv,
                                 int64_t latent, int fmt, float softmax_scale) {
  extern __shared__ float smem[];  // qa[L], o[L], score[T]
  float* qa = smem;
  float* o = smem + latent;
  float* score = smem + 2 * latent;
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float* qt = q + t * heads * dn + h * dn;
  for (int64_t l = threadIdx.x; l < latent; l += blockDim.x) {
    float s = 0.f;
    for (int64_t d = 0; d < dn; ++d) s = fadd(s, fmul(qt[d], dequant_element(fmt, w_k, w_k_scale, h * latent + l, d, dn)));
    qa[l] = s;
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
    float acc = 0.f;
    for (int64_t l = 0; l < latent; ++l) acc = fadd(acc, fmul(qa[l], c[s * latent + l]));
    score[s] = fmul(acc, softmax_scale);
  }
  __syncthreads();
  for (int64_t l = threadIdx.x; l < latent; l += blockDim.x) {
    float acc = 0.f;
    for (int64_t s = 0; s <= t; ++s) acc = fadd(acc, fmul(score[s], c[s * latent + l]));
    o[l] = acc;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t l = 0; l < latent; ++l)
      acc = fadd(acc, fmul(o[l], dequant_element(fmt, w_v, w_v_scale, h * dv + j, l, latent)));
    y[t * heads * dv + h * dv + j] = acc;
  }
}

}  // namespace

void launch_quant_mla(const float* q, const float* c, const std::uint8_t* w_k, const void* w_k_scale,
                      const std::uint8_t* w_v, const void* w_v_scale, float* y, int64_t tokens, int64_t heads,
                      int64_t dn, int64_t dv, int64_t latent, int fmt, float softmax_scale, void* stream) {
  dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads));
  const size_t smem = static_cast<size_t>(2 * latent + tokens) * sizeof(float);
  quant_mla_kernel<<<grid, 64, smem, static_cast<cudaStream_t>(stream)>>>(
      q, c, w_k, w_k_scale, w_v, w_v_scale, y, tokens, heads, dn, dv, latent, fmt, softmax_scale);
}

}  // namespace gk::quant::cuda
