// The fused per-token MoE kernels: site 2 (shuffled expert weights) and
// site 11 (RDNA3 WNA16-style kernel with kernel-owned scratch). One block per
// token; thread 0 routes, the block's threads share the per-element work, and
// every element is computed by the scalar code of moe_common.h that the CPU
// twins also run, so both paths agree bitwise.
#include "moe_common.h"
#include "moe_launch.h"

#include <cuda_runtime.h>

namespace gk::kernels::cuda {
namespace {

using namespace gk::kernels::moe;

constexpr int kThreads = 64;

// Dynamic shared memory per block: ids[topk] (int32), gates[topk], h[topk * N].
size_t token_smem(int64_t topk, int64_t inter) {
  return static_cast<size_t>(topk) * sizeof(int32_t) + static_cast<size_t>(topk * (1 + inter)) * sizeof(float);
}

__global__ void moe_shuffled_kernel(const float* __restrict__ x, const float* __restrict__ logits,
                                    const float* __restrict__ w13s, const float* __restrict__ w2s,
                                    float* __restrict__ y, int64_t E, int64_t K, int64_t N, int64_t topk) {
  extern __shared__ float smem[];
  float* gates = smem;
  float* h = gates + topk;
  int32_t* ids = reinterpret_cast<int32_t*>(h + topk * N);
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) route_token(logits + t * E, E, topk, ids, gates);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < topk * N; i += blockDim.x)
    h[i] = shuffled_hidden(x + t * K, w13s, ids[i / N], i % N, N, K);
  __syncthreads();
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) y[t * K + c] = shuffled_output(h, ids, gates, w2s, c, topk, N, K);
}

__global__ void moe_rdna3_wna16_kernel(const float* __restrict__ x, const float* __restrict__ logits,
                                       const int8_t* __restrict__ w13q, const float* __restrict__ w13s,
                                       const int8_t* __restrict__ w2q, const float* __restrict__ w2s,
                                       float* __restrict__ w1_buf, float* __restrict__ act_buf,
                                       float* __restrict__ y, int64_t E, int64_t K, int64_t N, int64_t topk) {
  extern __shared__ float smem[];
  float* gates = smem;
  float* h = gates + topk;
  int32_t* ids = reinterpret_cast<int32_t*>(h + topk * N);
  const int64_t t = blockIdx.x;
  float* act = act_buf + t * K;        // this token's scratch rows
  float* w1 = w1_buf + t * 2 * N * K;
  if (threadIdx.x == 0) route_token(logits + t * E, E, topk, ids, gates);
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) act[c] = round_bf16(x[t * K + c]);
  __syncthreads();
  for (int64_t j = 0; j < topk; ++j) {
    const int64_t e = ids[j];
    for (int64_t i = threadIdx.x; i < 2 * N * K; i += blockDim.x)
      w1[i] = dequant_int8(w13q[e * 2 * N * K + i], w13s[e * 2 * N + i / K]);
    __syncthreads();
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) h[j * N + n] = staged_hidden(act, w1, n, N, K);
    __syncthreads();  // before the next expert overwrites w1
  }
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x)
    y[t * K + c] = wna16_output(h, ids, gates, w2q, w2s, c, topk, N, K);
}

}  // namespace

void launch_moe_shuffled(const float* x, const float* logits, const float* w13_shuffled, const float* w2_shuffled,
                         float* y, int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, int64_t topk,
                         void* stream) {
  if (tokens == 0) return;
  moe_shuffled_kernel<<<static_cast<unsigned>(tokens), kThreads, token_smem(topk, inter),
                        static_cast<cudaStream_t>(stream)>>>(x, logits, w13_shuffled, w2_shuffled, y, experts, hidden,
                                                             inter, topk);
}

void launch_moe_rdna3_wna16(const float* x, const float* logits, const int8_t* w13_q, const float* w13_scale,
                            const int8_t* w2_q, const float* w2_scale, float* w1_buf, float* act_buf, float* y,
                            int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, int64_t topk,
                            void* stream) {
  if (tokens == 0) return;
  moe_rdna3_wna16_kernel<<<static_cast<unsigned>(tokens), kThreads, token_smem(topk, inter),
                           static_cast<cudaStream_t>(stream)>>>(x, logits, w13_q, w13_scale, w2_q, w2_scale, w1_buf,
                                                                act_buf, y, experts, hidden, inter, topk);
}

}  // namespace gk::kernels::cuda
