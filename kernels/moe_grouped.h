// kernels/moe_grouped.h: the steps of the grouped (CUTLASS-style) MoE
// pipeline that the experts objects share (private to the kernels layer):
//
//   route -> gather (site 10: quantize) -> grouped GEMM1 -> activation
//   (site 10: + quantize) -> grouped GEMM2 -> finalize (unpermute, reduce)
//
// Each step runs on its tensors' device: the CUDA launcher of
// kernels/cuda/moe_grouped.cu, or on the CPU its twin recorded through
// gk::hostrt, computing every element with the same scalar code
// (moe_common.h). Every per-call tensor comes from runtime::empty (the
// capture pool while capturing), as in vLLM. The grouped GEMMs read each
// expert's leading-dimension strides from the stride tensors per group.
//
//   const Routing rt = route_softmax(logits, E, topk, /*renormalize=*/true);
//   return grouped_mlp(x, w13, w2, rt, strides, Activation::silu_gated, E, K, N, topk);
#pragma once

#include <graphkeep/kernels/moe_experts.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace gk::kernels::grouped {

// The per-call routing metadata (vLLM: topk_ids / topk_weights,
// expert_offsets, a_map / c_map): per routed row (M = T * topk), the expert
// ids, the gates, the rows grouped by expert (offsets [E + 1], perm) and the
// inverse permutation.
struct Routing {
  at::Tensor ids, gates, offsets, perm, inv;
};

// Sites 4 and 10: the top-k of the logits (moe_common.h route_token).
Routing route(const at::Tensor& logits, int64_t E, int64_t topk);
// Qwen3-MoE: the top-k of softmax(logits) in torch.topk's order,
// renormalized when `renormalize` (moe_common.h route_token_softmax).
Routing route_softmax(const at::Tensor& logits, int64_t E, int64_t topk, bool renormalize);

// The routed rows of x: [M, K] float32, row r = x[perm[r] / topk].
at::Tensor gather(const at::Tensor& x, const Routing& rt, int64_t topk);

// Grouped GEMM, A row-major times B^T, per expert g over its rows: C_g[r *
// ldc + n] = sum_k A_g[r * lda + k] * B_g[n * ldb + k], with lda, ldb, ldc
// read from a_strides[g], b_strides[g], c_strides[g] (int64 [E]). A: [M,
// kdim] float32; B: [E, ncols, kdim] float32, bfloat16 or float16 (widened
// exactly); returns C [M, ncols] float32. `name` names the launch.
at::Tensor grouped_gemm(const char* name, const at::Tensor& a, const at::Tensor& b, const Routing& rt,
                        const at::Tensor& a_strides, const at::Tensor& b_strides, const at::Tensor& c_strides,
                        int64_t E, int64_t ncols, int64_t kdim);

// The gated activation of the experts' MLP (gate: the first N columns of
// GEMM1's output, up: the next N).
enum class Activation {
  softsign_gated,  // softsign(gate) * up (sites 4, 10)
  silu_gated,      // silu(gate) * up (Qwen3-MoE)
};
// h [M, N] from c1 [M, 2N].
at::Tensor act(Activation kind, const at::Tensor& c1, int64_t N);

// y [T, K] = sum over each token's rows of gate * c2 row, in top-k rank order.
at::Tensor finalize(const at::Tensor& c2, const Routing& rt, int64_t T, int64_t K, int64_t topk);

// Site 4's experts MLP over routed tokens: gather -> GEMM1 (w13 [E, 2N, K],
// ab_strides1 / c_strides1) -> activation -> GEMM2 (w2 [E, K, N], ab_strides2
// / c_strides2) -> finalize; y [T, K].
at::Tensor grouped_mlp(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2, const Routing& rt,
                       const GroupedGemmStrides& s, Activation kind, int64_t E, int64_t K, int64_t N, int64_t topk);

// Site 10: int8 rows with a float scale per row.
struct QuantRows {
  at::Tensor q, scale;  // int8 [M, len], float [M]
};
// The routed rows of x, quantized.
QuantRows quantize_rows(const at::Tensor& x, const Routing& rt, int64_t topk);
// The gated activation of c1 [M, 2N], quantized.
QuantRows quantize_act(const at::Tensor& c1, int64_t N);
// Grouped W4A8 GEMM (moe_launch.h launch_moe_w4a8_grouped_gemm): b packed
// int4 int32 [E, ncols, kdim / 8], s the group scales [E, kdim / group, ncols];
// returns C [M, ncols] float32.
at::Tensor w4a8_grouped_gemm(const char* name, const QuantRows& a, const at::Tensor& b, const at::Tensor& s,
                             const Routing& rt, const at::Tensor& a_strides, const at::Tensor& c_strides,
                             const at::Tensor& s_strides, int64_t E, int64_t ncols, int64_t kdim, int64_t group);

// Throws gk::StateError unless `s` is a contiguous int64 [E] (a stride array).
void check_strides(const at::Tensor& s, int64_t E, const char* name);

}  // namespace gk::kernels::grouped
