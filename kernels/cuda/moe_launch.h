// kernels/cuda/moe_launch.h: the plain CUDA launchers of the MoE sites
// (2, 4, 10, 11) and of the Qwen3-MoE experts (SwigluExperts). Raw device
// pointers in, work enqueued on `stream` (an opaque cudaStream_t). Shapes:
// T tokens, E experts, K hidden, N intermediate, M = T * topk routed rows.
// The CPU twins live in kernels/moe_grouped.cpp, kernels/moe_shuffle.cpp and
// kernels/moe_wna16.cpp and use the same scalar code (moe_common.h).
#pragma once
#include <cstdint>

namespace gk::kernels::cuda {

// --- fused per-token kernels (moe_fused.cu) ------------------------------------

// Site 2: y[t] = sum_j gate_j * w2[e_j] (softsign(w1[e_j] x_t) * (w3[e_j] x_t)),
// reading the shuffled layouts of moe_common.h. One block per token.
void launch_moe_shuffled(const float* x, const float* logits, const float* w13_shuffled, const float* w2_shuffled,
                         float* y, int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, int64_t topk,
                         void* stream);

// Site 11: the same MLP with int8 weights and per-channel scales; each token's
// block stages bf16-rounded activations in act_buf[t] and the dequantized w13
// of each chosen expert in w1_buf[t] (kernel-owned scratch, written before it
// is read), then computes from the scratch.
void launch_moe_rdna3_wna16(const float* x, const float* logits, const int8_t* w13_q, const float* w13_scale,
                            const int8_t* w2_q, const float* w2_scale, float* w1_buf, float* act_buf, float* y,
                            int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, int64_t topk,
                            void* stream);

// --- grouped (CUTLASS-style) pipeline (moe_grouped.cu) --------------------------

// Routes every token (moe_common.h route_token) and groups the rows by expert.
void launch_moe_route(const float* logits, int32_t* ids, float* gates, int32_t* offsets, int32_t* perm,
                      int32_t* inv, int64_t tokens, int64_t experts, int64_t topk, void* stream);
// out[r] = x[perm[r] / topk]   ([M, K])
void launch_moe_gather_rows(const float* x, const int32_t* perm, float* out, int64_t rows, int64_t hidden,
                            int64_t topk, void* stream);
// The expert weights' storage type of launch_moe_grouped_gemm_nt.
enum class MoeWeightType : int { f32 = 0, bf16 = 1, f16 = 2 };
// Grouped GEMM, A row-major times B^T, per expert g over its rows
// [offsets[g], offsets[g+1]): C_g[r * ldc + n] = sum_k A_g[r * lda + k] *
// B_g[n * ldb + k], with lda = a_strides[g], ldb = b_strides[g], ldc =
// c_strides[g] read from device memory per group (CUTLASS's ptr-array
// grouped GEMM with Stride<int64_t, _1, _0>). Group bases: A_g = A +
// offsets[g] * kdim, B_g = B + g * ncols * kdim, C_g = C + offsets[g] * ncols.
// A and C are float; B is of `b_type` (float, or bfloat16 / float16 bits),
// each element widened exactly to float; the math in float32.
void launch_moe_grouped_gemm_nt(const float* a, const void* b, MoeWeightType b_type, float* c,
                                const int32_t* offsets, const int64_t* a_strides, const int64_t* b_strides,
                                const int64_t* c_strides, int64_t experts, int64_t ncols, int64_t kdim,
                                void* stream);
// h[r, n] = softsign(c1[r, n]) * c1[r, N + n]   (vLLM's silu_and_mul)
void launch_moe_act_rows(const float* c1, float* h, int64_t rows, int64_t inter, void* stream);
// y[t] = sum_j gates[t*topk+j] * c2[inv[t*topk+j]]   (unpermute and reduce)
void launch_moe_finalize(const float* c2, const float* gates, const int32_t* inv, float* y, int64_t tokens,
                         int64_t hidden, int64_t topk, void* stream);

// --- Qwen3-MoE / Mixtral experts (SwigluExperts), same grouped pipeline ---------

// Routes every token with moe_common.h route_token_softmax (softmax over the
// experts, torch.topk's order, renormalized when `renormalize`) and groups the
// rows by expert. probs and order: scratch [tokens, experts].
void launch_moe_route_softmax(const float* logits, float* probs, int32_t* order, int32_t* ids, float* gates,
                              int32_t* offsets, int32_t* perm, int32_t* inv, int64_t tokens, int64_t experts,
                              int64_t topk, bool renormalize, void* stream);
// h[r, n] = silu(c1[r, n]) * c1[r, N + n]   (Qwen3-MoE's act_fn(gate) * up)
void launch_moe_silu_act_rows(const float* c1, float* h, int64_t rows, int64_t inter, void* stream);

// W4A8 (site 10). aq[r] = int8(x[perm[r] / topk] / ascale[r]), per-row scale.
void launch_moe_quant_rows(const float* x, const int32_t* perm, int8_t* aq, float* ascale, int64_t rows,
                           int64_t hidden, int64_t topk, void* stream);
// aq[r] = int8(softsign(c1[r, n]) * c1[r, N + n]), per-row scale.
void launch_moe_act_quant_rows(const float* c1, int8_t* aq, float* ascale, int64_t rows, int64_t inter,
                               void* stream);
// Grouped W4A8 GEMM: C_g[r * ldc + n] = ascale[row] * sum_q s_g[q * lds + n] *
// (sum_{k in group q} A_g[r * lda + k] * int4(B_g row n, k)), the integer
// inner sums exact, lda = a_strides[g], ldc = c_strides[g], lds = s_strides[g]
// from device memory. B_g = b + g * ncols * kdim / 8 (packed words, row n at
// n * kdim / 8), s_g = s + g * (kdim / group) * ncols.
void launch_moe_w4a8_grouped_gemm(const int8_t* a, const float* ascale, const int32_t* b, const float* s, float* c,
                                  const int32_t* offsets, const int64_t* a_strides, const int64_t* c_strides,
                                  const int64_t* s_strides, int64_t experts, int64_t ncols, int64_t kdim,
                                  int64_t group, void* stream);

}  // namespace gk::kernels::cuda
