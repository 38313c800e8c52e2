// The CUTLASS-style grouped MoE pipeline of sites 4 (grouped GEMM with ab/c
// stride arrays) and 10 (W4A8 grouped GEMM with a/c/s stride arrays),
// and of the Qwen3-MoE experts (softmax routing, SiLU-gated activation,
// float32 / bfloat16 / float16 weights, site 4's stride arrays):
// route -> gather (or quantize) -> grouped GEMM1 -> activation -> grouped
// GEMM2 -> unpermute and reduce. The grouped GEMMs read each expert's
// leading-dimension strides from device memory per group, like CUTLASS's
// ptr-array grouped kernels: a freed or stale stride array is an illegal
// access or a wrong result, never silently right by construction.
#include "moe_common.h"
#include "moe_launch.h"

#include <cuda_runtime.h>

namespace gk::kernels::cuda {
namespace {

using namespace gk::kernels::moe;

constexpr int kThreads = 64;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One block: every thread routes some tokens, then thread 0 groups the rows.
__global__ void moe_route_kernel(const float* __restrict__ logits, int32_t* __restrict__ ids,
                                 float* __restrict__ gates, int32_t* __restrict__ offsets, int32_t* __restrict__ perm,
                                 int32_t* __restrict__ inv, int64_t T, int64_t E, int64_t topk) {
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x)
    route_token(logits + t * E, E, topk, ids + t * topk, gates + t * topk);
  __syncthreads();
  if (threadIdx.x == 0) sort_by_expert(ids, T * topk, E, offsets, perm, inv);
}

__global__ void moe_gather_kernel(const float* __restrict__ x, const int32_t* __restrict__ perm,
                                  float* __restrict__ out, int64_t K, int64_t topk) {
  const int64_t r = blockIdx.x;
  const int64_t t = perm[r] / topk;
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) out[r * K + c] = x[t * K + c];
}

// The grouped GEMM of every experts object but site 10's, B stored as W::type
// (float, or bfloat16 / float16 bits widened exactly). grid (E, column
// blocks): each thread owns one output column of its group.
template <class W>
__global__ void moe_grouped_gemm_nt_kernel(const float* __restrict__ a, const typename W::type* __restrict__ b,
                                           float* __restrict__ c, const int32_t* __restrict__ offsets,
                                           const int64_t* __restrict__ a_strides,
                                           const int64_t* __restrict__ b_strides,
                                           const int64_t* __restrict__ c_strides, int64_t ncols, int64_t kdim) {
  const int64_t g = blockIdx.x;
  const int64_t n = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= ncols) return;
  const int64_t r0 = offsets[g], r1 = offsets[g + 1];
  const int64_t lda = a_strides[g], ldb = b_strides[g], ldc = c_strides[g];  // per group, from global memory
  const float* ag = a + r0 * kdim;
  const typename W::type* bg = b + g * ncols * kdim;
  float* cg = c + r0 * ncols;
  for (int64_t r = 0; r < r1 - r0; ++r) cg[r * ldc + n] = dot_w<W>(ag + r * lda, bg + n * ldb, kdim);
}

template <class W>
void grouped_gemm_nt(const float* a, const void* b, float* c, const int32_t* offsets, const int64_t* a_strides,
                     const int64_t* b_strides, const int64_t* c_strides, int64_t experts, int64_t ncols, int64_t kdim,
                     cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(experts), blocks_for(ncols));
  moe_grouped_gemm_nt_kernel<W><<<grid, kThreads, 0, stream>>>(
      a, static_cast<const typename W::type*>(b), c, offsets, a_strides, b_strides, c_strides, ncols, kdim);
}

__global__ void moe_act_kernel(const float* __restrict__ c1, float* __restrict__ h, int64_t M, int64_t N) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  const int64_t r = i / N, n = i % N;
  h[i] = gated_act(c1[r * 2 * N + n], c1[r * 2 * N + N + n]);
}

__global__ void moe_finalize_kernel(const float* __restrict__ c2, const float* __restrict__ gates,
                                    const int32_t* __restrict__ inv, float* __restrict__ y, int64_t T, int64_t K,
                                    int64_t topk) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * K) return;
  y[i] = combine_rows(c2, gates, inv, i / K, i % K, K, topk);
}

// One block per row; dynamic shared memory: the row's values [len].
__global__ void moe_quant_kernel(const float* __restrict__ src, const int32_t* __restrict__ perm,
                                 int8_t* __restrict__ aq, float* __restrict__ ascale, int64_t len, int64_t topk,
                                 bool act) {
  extern __shared__ float row[];
  __shared__ float scale;
  const int64_t r = blockIdx.x;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
    row[i] = act ? gated_act(src[r * 2 * len + i], src[r * 2 * len + len + i]) : src[(perm[r] / topk) * len + i];
  __syncthreads();
  if (threadIdx.x == 0) {
    scale = int8_row_scale(row, len);
    ascale[r] = scale;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) aq[r * len + i] = quantize_int8(row[i], scale);
}

__global__ void moe_w4a8_gemm_kernel(const int8_t* __restrict__ a, const float* __restrict__ ascale,
                                     const int32_t* __restrict__ b, const float* __restrict__ s,
                                     float* __restrict__ c, const int32_t* __restrict__ offsets,
                                     const int64_t* __restrict__ a_strides, const int64_t* __restrict__ c_strides,
                                     const int64_t* __restrict__ s_strides, int64_t ncols, int64_t kdim,
                                     int64_t group) {
  const int64_t g = blockIdx.x;
  const int64_t n = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= ncols) return;
  const int64_t r0 = offsets[g], r1 = offsets[g + 1];
  const int64_t lda = a_strides[g], ldc = c_strides[g], lds = s_strides[g];  // per group, from global memory
  const int8_t* ag = a + r0 * kdim;
  const int32_t* brow = b + (g * ncols + n) * (kdim / 8);
  const float* sg = s + g * (kdim / group) * ncols;
  float* cg = c + r0 * ncols;
  for (int64_t r = 0; r < r1 - r0; ++r)
    cg[r * ldc + n] = fmul(w4a8_dot(ag + r * lda, brow, sg, lds, n, kdim, group), ascale[r0 + r]);
}

// --- Qwen3-MoE / Mixtral experts (SwigluExperts) ---------------------------------

// One block, as moe_route_kernel; each token's softmax and top-k work in its
// rows of probs and order [T, E].
__global__ void moe_route_softmax_kernel(const float* __restrict__ logits, float* __restrict__ probs,
                                         int32_t* __restrict__ order, int32_t* __restrict__ ids,
                                         float* __restrict__ gates, int32_t* __restrict__ offsets,
                                         int32_t* __restrict__ perm, int32_t* __restrict__ inv, int64_t T, int64_t E,
                                         int64_t topk, bool renormalize) {
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x)
    route_token_softmax(logits + t * E, E, topk, renormalize, probs + t * E, order + t * E, ids + t * topk,
                        gates + t * topk);
  __syncthreads();
  if (threadIdx.x == 0) sort_by_expert(ids, T * topk, E, offsets, perm, inv);
}

__global__ void moe_silu_act_kernel(const float* __restrict__ c1, float* __restrict__ h, int64_t M, int64_t N) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  const int64_t r = i / N, n = i % N;
  h[i] = silu_act(c1[r * 2 * N + n], c1[r * 2 * N + N + n]);
}

}  // namespace

void launch_moe_route(const float* logits, int32_t* ids, float* gates, int32_t* offsets, int32_t* perm,
                      int32_t* inv, int64_t tokens, int64_t experts, int64_t topk, void* stream) {
  moe_route_kernel<<<1, 128, 0, static_cast<cudaStream_t>(stream)>>>(logits, ids, gates, offsets, perm, inv, tokens,
                                                                     experts, topk);
}

void launch_moe_gather_rows(const float* x, const int32_t* perm, float* out, int64_t rows, int64_t hidden,
                            int64_t topk, void* stream) {
  if (rows == 0) return;
  moe_gather_kernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, perm, out,
                                                                                                    hidden, topk);
}

void launch_moe_act_rows(const float* c1, float* h, int64_t rows, int64_t inter, void* stream) {
  if (rows * inter == 0) return;
  moe_act_kernel<<<blocks_for(rows * inter), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(c1, h, rows, inter);
}

void launch_moe_finalize(const float* c2, const float* gates, const int32_t* inv, float* y, int64_t tokens,
                         int64_t hidden, int64_t topk, void* stream) {
  if (tokens * hidden == 0) return;
  moe_finalize_kernel<<<blocks_for(tokens * hidden), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      c2, gates, inv, y, tokens, hidden, topk);
}

void launch_moe_quant_rows(const float* x, const int32_t* perm, int8_t* aq, float* ascale, int64_t rows,
                           int64_t hidden, int64_t topk, void* stream) {
  if (rows == 0) return;
  moe_quant_kernel<<<static_cast<unsigned>(rows), kThreads, static_cast<size_t>(hidden) * sizeof(float),
                     static_cast<cudaStream_t>(stream)>>>(x, perm, aq, ascale, hidden, topk, false);
}

void launch_moe_act_quant_rows(const float* c1, int8_t* aq, float* ascale, int64_t rows, int64_t inter,
                               void* stream) {
  if (rows == 0) return;
  moe_quant_kernel<<<static_cast<unsigned>(rows), kThreads, static_cast<size_t>(inter) * sizeof(float),
                     static_cast<cudaStream_t>(stream)>>>(c1, nullptr, aq, ascale, inter, 1, true);
}

void launch_moe_w4a8_grouped_gemm(const int8_t* a, const float* ascale, const int32_t* b, const float* s, float* c,
                                  const int32_t* offsets, const int64_t* a_strides, const int64_t* c_strides,
                                  const int64_t* s_strides, int64_t experts, int64_t ncols, int64_t kdim,
                                  int64_t group, void* stream) {
  dim3 grid(static_cast<unsigned>(experts), blocks_for(ncols));
  moe_w4a8_gemm_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, ascale, b, s, c, offsets, a_strides, c_strides, s_strides, ncols, kdim, group);
}

void launch_moe_route_softmax(const float* logits, float* probs, int32_t* order, int32_t* ids, float* gates,
                              int32_t* offsets, int32_t* perm, int32_t* inv, int64_t tokens, int64_t experts,
                              int64_t topk, bool renormalize, void* stream) {
  moe_route_softmax_kernel<<<1, 128, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, probs, order, ids, gates, offsets, perm, inv, tokens, experts, topk, renormalize);
}

void launch_moe_grouped_gemm_nt(const float* a, const void* b, MoeWeightType b_type, float* c,
                                  const int32_t* offsets, const int64_t* a_strides, const int64_t* b_strides,
                                  const int64_t* c_strides, int64_t experts, int64_t ncols, int64_t kdim,
                                  void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (b_type) {
    case MoeWeightType::f32:
      grouped_gemm_nt<F32Weight>(a, b, c, offsets, a_strides, b_strides, c_strides, experts, ncols, kdim, s);
      break;
    case MoeWeightType::bf16:
      grouped_gemm_nt<Bf16Weight>(a, b, c, offsets, a_strides, b_strides, c_strides, experts, ncols, kdim, s);
      break;
    case MoeWeightType::f16:
      grouped_gemm_nt<F16Weight>(a, b, c, offsets, a_strides, b_strides, c_strides, experts, ncols, kdim, s);
      break;
  }
}

void launch_moe_silu_act_rows(const float* c1, float* h, int64_t rows, int64_t inter, void* stream) {
  if (rows * inter == 0) return;
  moe_silu_act_kernel<<<blocks_for(rows * inter), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(c1, h, rows,
                                                                                                     inter);
}

}  // namespace gk::kernels::cuda
