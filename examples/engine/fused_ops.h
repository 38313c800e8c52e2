// examples/engine/fused_ops.h
//
// The fused ops of the example engine's fast CUDA path (Note [The fast CUDA
// path] in layers.cpp): one kernel each (cuda/decoder_kernels.cu) where ATen
// would run a chain of small ones, on the current stream, their outputs from
// gk::runtime::empty (the capture's pool while a graph is captured). CUDA
// tensors only: on the CPU the engine runs its reference ops, which the CPU
// replay backend records.
//
//   demo::fused::Normed n = demo::fused::add_rms_norm(x, delta, gamma, 1e-6);  // n.residual = x + delta
//   at::Tensor q = demo::fused::qkv_rope_cache(qkv, batch, cache, rope, shape, q_norm, k_norm);
//   at::Tensor a = demo::fused::decode_attention(q, batch, cache, shape);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace demo {
struct TokenBatch;
struct KvCache;
struct RopeTables;
}  // namespace demo

namespace demo::fused {

// True when the fused kernels run on `x`: a CUDA build, x on a CUDA device,
// in float32, bfloat16 or float16.
bool supported(const at::Tensor& x);

struct Normed {
  at::Tensor residual;  // x + delta in x's dtype (x itself when delta is undefined)
  at::Tensor normed;    // RMSNorm(residual) * w, transformers' roundings
};
// x, delta [T, N] (delta may be undefined), w [N].
Normed add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps);

// The attention heads of a layer.
struct HeadShape {
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 1e-6;  // of q_norm / k_norm
};

// qkv [T, (H + 2 KV) D] -> the queries [T, H D] after q_norm (when defined)
// and RoPE; the keys (k_norm, RoPE) and values are written into the cache
// rows of the batch's tokens.
at::Tensor qkv_rope_cache(const at::Tensor& qkv, const TokenBatch& batch, const KvCache& cache,
                          const RopeTables& rope, const HeadShape& shape, const at::Tensor& q_norm,
                          const at::Tensor& k_norm);

// q [T, H D] -> [T, H D]: each token attends over positions 0..its own of
// its sequence's cache, and reads no other row (Note [Stale KV rows] in layers.cpp).
at::Tensor decode_attention(const at::Tensor& q, const TokenBatch& batch, const KvCache& cache,
                            const HeadShape& shape);

// h [R, 2 I] (gate, then up; rows may be padded) -> silu(gate) * up [R, I].
at::Tensor silu_and_mul(const at::Tensor& h);

// True when at::_grouped_mm runs its CUTLASS kernel, with no host sync: x
// in bfloat16 on an sm90 or sm100 device.
bool grouped_mm_supported(const at::Tensor& x);

// A Qwen3-MoE block's experts through two at::_grouped_mm calls (Note
// [Qwen3-MoE through grouped GEMMs] in layers.cpp): x [T, H] bf16, the router's
// logits [T, E], w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I]
// -> [T, H] in x's dtype. Routing runs on the device without a host sync.
// (It runs on the CPU too, for the tests; at::_grouped_mm's fallback there.)
at::Tensor moe_grouped_mm(const at::Tensor& x, const at::Tensor& router_logits, const at::Tensor& w13,
                          const at::Tensor& w2, std::int64_t topk, bool norm_topk_prob);

// LoRA's expand step and its add (Note [LoRA in the decode graphs] in
// lora_projection.cpp): y [T, N], t = x A^T [T, parts * rank] (each with
// contiguous rows at any row stride: the two column ranges of one GEMM's
// output, for a joined projection), b [rows, rank] -> a new contiguous
// y + scale * t_p b_p^T in the columns [offsets[p], offsets[p] + sizes[p])
// of each part p (b_p: the next sizes[p] rows of b), in float32, rounded once.
at::Tensor lora_expand(const at::Tensor& y, const at::Tensor& t, const at::Tensor& b,
                       const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& sizes,
                       std::int64_t rank, double scale);

// The Gumbel noise of the sampler (Note [Sampling on the device] in
// sampler.cpp): ids [B, V] int64 token ids, row_keys [B] int64 -> [B, V] float32.
at::Tensor gumbel_noise(const at::Tensor& ids, const at::Tensor& row_keys);

}  // namespace demo::fused
