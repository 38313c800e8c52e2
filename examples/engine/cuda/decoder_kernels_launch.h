// examples/engine/cuda/decoder_kernels_launch.h: the plain CUDA launchers of
// the example engine's fast decode path (examples/engine/fused_ops.h wraps
// them for tensors). No Torch here: pointers, sizes and the current stream.
// Every launcher returns the launch's cudaError_t as an int (0: launched);
// error_name() names one.
#pragma once

#include <cstdint>

namespace demo::cuda {

enum class Dtype : int { f32 = 0, bf16 = 1, f16 = 2 };

const char* error_name(int error);

// Per row of n: h = x + d rounded to the dtype (d null: h = x, nothing
// written to h); y = dtype(w * dtype(h * rsqrt(mean(h^2) + eps))), the
// products in float32: transformers' LlamaRMSNorm after its residual add.
int launch_add_rms_norm(Dtype dt, const void* x, const void* d, const void* w, void* h, void* y, std::int64_t rows,
                        std::int64_t n, float eps, void* stream);

// qkv [T, (H + 2 KV) D] (row stride qkv_stride elements): per head, the
// optional RMSNorm over D (q_norm for query heads, k_norm for key heads;
// null: none), then RoPE on queries and keys with cos/sin [L, D] float32 at
// positions[t] (rounded to the dtype, rotate_half convention); queries to
// q_out [T, H, D], keys and values to row seqs[t] * L + positions[t] of
// k_cache / v_cache [S L, KV, D].
int launch_qkv_rope_cache(Dtype dt, const void* qkv, std::int64_t qkv_stride, const std::int64_t* positions,
                          const std::int64_t* seqs, const float* cos, const float* sin, const void* q_norm,
                          const void* k_norm, void* q_out, void* k_cache, void* v_cache, std::int64_t tokens,
                          std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_len,
                          float eps, void* stream);

// out [T, H, D] = softmax(scale q K^T) V over the cache rows seqs[t] * L + j
// for j = 0..positions[t] only (query head h reads key/value head h / (H / KV));
// float32 arithmetic, online softmax. head_dim at most 256.
int launch_decode_attention(Dtype dt, const void* q, const std::int64_t* positions, const std::int64_t* seqs,
                            const void* k_cache, const void* v_cache, void* out, std::int64_t tokens,
                            std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_len,
                            float scale, void* stream);

// h [rows, 2 I] (row stride h_stride elements; gate, then up) ->
// out [rows, I] = dtype(dtype(silu(gate)) * up).
int launch_silu_and_mul(Dtype dt, const void* h, std::int64_t h_stride, void* out, std::int64_t rows,
                        std::int64_t inter, void* stream);

// The targeted parts of a projection's output columns for LoRA (at most 4:
// q, k and v of a fused projection): part p is columns [offset[p], offset[p]
// + size[p]) of the output, rows [brow[p], brow[p] + size[p]) of B and
// columns [p rank, (p + 1) rank) of t.
struct LoraParts {
  static constexpr int kMax = 4;
  int count = 0;
  std::int64_t offset[kMax] = {}, size[kMax] = {}, brow[kMax] = {};
};

// LoRA's expand step and its add, one kernel: out [rows, n] = dtype(y +
// scale * sum_j t[r, p rank + j] B[brow[p] + c - offset[p], j]) in float32
// for a column c of part p, y elsewhere. y [rows, n] (row stride y_stride),
// t [rows, parts rank] (row stride t_stride), out contiguous, B [rows of the
// parts, rank] contiguous.
int launch_lora_expand(Dtype dt, const void* y, std::int64_t y_stride, const void* t, std::int64_t t_stride,
                       const void* b, void* out, std::int64_t rows, std::int64_t n, std::int64_t rank,
                       const LoraParts& parts, float scale, void* stream);

// out [rows, vocab] float32 = -log(-log(u)), u = ((mix32(key[r] ^ id) >> 8) + 1/2) / 2^24
// with id = ids[r * ids_stride + v] (Note [Sampling on the device] in sampler.cpp).
int launch_gumbel_noise(const std::int64_t* ids, std::int64_t ids_stride, const std::int64_t* row_keys, float* out,
                        std::int64_t rows, std::int64_t vocab, void* stream);

}  // namespace demo::cuda
