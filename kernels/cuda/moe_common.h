// kernels/cuda/moe_common.h: the scalar building blocks of the MoE sites
// (sites 2, 4, 10, 11), shared *verbatim* by the CUDA kernels and their CPU
// twins, so both paths run the same operations in the same order and agree
// bitwise:
//   - arithmetic through fmul/fadd/fsub/fdiv, which are __fmul_rn & co. on
//     the device (no FMA contraction) and plain IEEE operations on the host;
//   - no libm or CUDA transcendental functions (expf/silu differ by an ulp
//     between them): the sites' router renormalizes rationally and their
//     gated activation is softsign(a) * b; the Qwen3-MoE experts' softmax
//     and SiLU use numerics/softmax_topk.h's fexp, built from the above;
//   - routing and the counting sort are single-threaded, deterministic loops.
// No Torch, no Boost: this header is included by .cu files.
#pragma once

#include <graphkeep/numerics/exact_math.h>
#include <graphkeep/numerics/softmax_topk.h>

#include <cstdint>

#if defined(__CUDACC__)
#define GK_MOE_HD __host__ __device__ inline
#else
#define GK_MOE_HD inline
#endif

namespace gk::kernels::moe {

using numerics::fadd;
using numerics::fdiv;
using numerics::fmul;
using numerics::fsub;

// acc + a * b, rounded twice (never fused).
GK_MOE_HD float mac(float acc, float a, float b) { return fadd(acc, fmul(a, b)); }
GK_MOE_HD float fabs_(float a) { return a < 0.f ? -a : a; }
// Round to nearest integer, ties to even (the default rounding mode on both sides).
GK_MOE_HD float rint_(float a) {
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return __builtin_rintf(a);
#endif
}

// sum_i a[i] * b[i], in index order.
GK_MOE_HD float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc = mac(acc, a[i], b[i]);
  return acc;
}

// The gated activation of every site: softsign(a) * b (a stands for the
// gate projection w1 x, b for the up projection w3 x).
GK_MOE_HD float gated_act(float a, float b) { return fmul(fdiv(a, fadd(1.f, fabs_(a))), b); }

// Rounds a float to bfloat16 precision (round to nearest even), kept as a
// float: the "A16" of W*A16 kernels. NaN stays NaN.
GK_MOE_HD float round_bf16(float v) {
  std::uint32_t u = numerics::bits_of(v);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0u) return v;
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  return numerics::float_of(u);
}

// Top-k routing of one token from its router logits [E]: ids[j] is the j-th
// largest logit (ties go to the lower expert index); the gates renormalize
// r_j = 1 / (1 + (l_top - l_j)) over the k chosen experts.
GK_MOE_HD void route_token(const float* logits, int64_t num_experts, int64_t topk, int32_t* ids, float* gates) {
  for (int64_t j = 0; j < topk; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
      if (taken) continue;
      if (best < 0 || logits[e] > logits[best]) best = static_cast<int32_t>(e);
    }
    ids[j] = best;
  }
  const float top = logits[ids[0]];
  float sum = 0.f;
  for (int64_t j = 0; j < topk; ++j) {
    gates[j] = fdiv(1.f, fadd(1.f, fsub(top, logits[ids[j]])));
    sum = fadd(sum, gates[j]);
  }
  for (int64_t j = 0; j < topk; ++j) gates[j] = fdiv(gates[j], sum);
}

// Groups the M = T*topk (token, choice) pairs by expert, stably: offsets
// [E+1] delimits each expert's rows, perm[row] = t*topk + j, inv is its
// inverse. The per-call metadata of a grouped GEMM (expert_offsets,
// problem sizes and the a_map of vLLM's get_cutlass_moe_mm_data).
GK_MOE_HD void sort_by_expert(const int32_t* ids, int64_t m, int64_t num_experts, int32_t* offsets, int32_t* perm,
                              int32_t* inv) {
  for (int64_t e = 0; e <= num_experts; ++e) offsets[e] = 0;
  for (int64_t i = 0; i < m; ++i) offsets[ids[i] + 1] += 1;
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  for (int64_t e = 0; e < num_experts; ++e) {
    int32_t row = offsets[e];
    for (int64_t i = 0; i < m; ++i)
      if (ids[i] == e) {
        perm[row] = static_cast<int32_t>(i);
        inv[i] = row;
        ++row;
      }
  }
}

// Row quantization to int8 (the "A8"): scale = amax / 127 (1 for an all-zero
// row), q = clamp(rint(v / scale), -127, 127).
GK_MOE_HD float int8_row_scale(const float* v, int64_t n) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = fabs_(v[i]) > amax ? fabs_(v[i]) : amax;
  return amax > 0.f ? fdiv(amax, 127.f) : 1.f;
}
GK_MOE_HD int8_t quantize_int8(float v, float scale) {
  float q = rint_(fdiv(v, scale));
  q = q > 127.f ? 127.f : (q < -127.f ? -127.f : q);
  return static_cast<int8_t>(q);
}

// y[t, c] of the unpermute-and-reduce step: sum_j gate * c2[row of (t, j), c].
GK_MOE_HD float combine_rows(const float* c2, const float* gates, const int32_t* inv, int64_t t, int64_t c,
                             int64_t hidden, int64_t topk) {
  float acc = 0.f;
  for (int64_t j = 0; j < topk; ++j)
    acc = mac(acc, gates[t * topk + j], c2[static_cast<int64_t>(inv[t * topk + j]) * hidden + c]);
  return acc;
}

// --- layouts ------------------------------------------------------------------

// Site 2, the AITER-style shuffled expert weights PWAL builds. w13 [E, 2N, K]
// (rows: w1 then w3) becomes [E, N/R, K/C, 2, R, C]: tiles of R rows x C
// columns, the w1 and w3 tiles of the same rows side by side. w2 [E, K, N]
// becomes [E, K/R, N/C, R, C].
inline constexpr int64_t kShuffleRows = 4;
inline constexpr int64_t kShuffleCols = 8;
// Element (e, part p: 0 = w1 / 1 = w3, row n < N, column k < K) of shuffled w13.
GK_MOE_HD int64_t shuffled_w13_index(int64_t e, int64_t p, int64_t n, int64_t k, int64_t N, int64_t K) {
  const int64_t nb = N / kShuffleRows, kb = K / kShuffleCols;
  return ((((e * nb + n / kShuffleRows) * kb + k / kShuffleCols) * 2 + p) * kShuffleRows + n % kShuffleRows) *
             kShuffleCols +
         k % kShuffleCols;
}
// Element (e, output row c < K, column n < N) of shuffled w2.
GK_MOE_HD int64_t shuffled_w2_index(int64_t e, int64_t c, int64_t n, int64_t K, int64_t N) {
  const int64_t cb = K / kShuffleRows, nb = N / kShuffleCols;
  return (((e * cb + c / kShuffleRows) * nb + n / kShuffleCols) * kShuffleRows + c % kShuffleRows) * kShuffleCols +
         n % kShuffleCols;
}

// Site 10, int4 weights as CUTLASS's W4A8 kernels want them: 8 signed
// nibbles per 32-bit word (value = nibble - 8), element j of a word stored
// in nibble slot (j even ? j/2 : 4 + j/2) (the even elements in the low
// half, the odd ones in the high half).
GK_MOE_HD int int4_slot(int64_t j) { return static_cast<int>((j % 2 == 0) ? j / 2 : 4 + j / 2); }
GK_MOE_HD int int4_at(const int32_t* row, int64_t c) {
  const std::uint32_t w = static_cast<std::uint32_t>(row[c / 8]);
  return static_cast<int>((w >> (4 * int4_slot(c % 8))) & 0xfu) - 8;
}

}  // namespace gk::kernels::moe

namespace gk::kernels::moe {

// One W4A8 output before the activation scale: sum over the K/group groups q
// of s[q * lds + n] * (exact int32 sum over the group of a[k] * int4(b_row, k)).
GK_MOE_HD float w4a8_dot(const int8_t* a, const int32_t* b_row, const float* s, int64_t lds, int64_t n, int64_t kdim,
                         int64_t group) {
  float acc = 0.f;
  for (int64_t q = 0; q < kdim / group; ++q) {
    int32_t isum = 0;
    for (int64_t k = q * group; k < (q + 1) * group; ++k) isum += static_cast<int32_t>(a[k]) * int4_at(b_row, k);
    acc = mac(acc, static_cast<float>(isum), s[q * lds + n]);
  }
  return acc;
}

// Dequantizes one int8 weight with its per-channel scale.
GK_MOE_HD float dequant_int8(int8_t q, float scale) { return fmul(static_cast<float>(q), scale); }

}  // namespace gk::kernels::moe

namespace gk::kernels::moe {

// --- per-element steps of the fused per-token kernels (sites 2 and 11) ----------

// Site 2, h[j, n] for the token's activations xt and expert e.
GK_MOE_HD float shuffled_hidden(const float* xt, const float* w13s, int64_t e, int64_t n, int64_t N, int64_t K) {
  float a = 0.f, b = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    a = mac(a, xt[k], w13s[shuffled_w13_index(e, 0, n, k, N, K)]);
    b = mac(b, xt[k], w13s[shuffled_w13_index(e, 1, n, k, N, K)]);
  }
  return gated_act(a, b);
}
// Site 2, y[t, c] from the token's h [topk, N].
GK_MOE_HD float shuffled_output(const float* h, const int32_t* ids, const float* gates, const float* w2s, int64_t c,
                                int64_t topk, int64_t N, int64_t K) {
  float acc = 0.f;
  for (int64_t j = 0; j < topk; ++j) {
    float s = 0.f;
    for (int64_t n = 0; n < N; ++n) s = mac(s, h[j * N + n], w2s[shuffled_w2_index(ids[j], c, n, K, N)]);
    acc = mac(acc, gates[j], s);
  }
  return acc;
}

// Site 11, h[j, n] from the staged scratch: act [K] and w1 [2N, K].
GK_MOE_HD float staged_hidden(const float* act, const float* w1, int64_t n, int64_t N, int64_t K) {
  return gated_act(dot(act, w1 + n * K, K), dot(act, w1 + (N + n) * K, K));
}
// Site 11, y[t, c]: w2 [E, K, N] int8 with scales [E, K], dequantized on the fly.
GK_MOE_HD float wna16_output(const float* h, const int32_t* ids, const float* gates, const int8_t* w2q,
                             const float* w2s, int64_t c, int64_t topk, int64_t N, int64_t K) {
  float acc = 0.f;
  for (int64_t j = 0; j < topk; ++j) {
    const int64_t row = static_cast<int64_t>(ids[j]) * K + c;
    float s = 0.f;
    for (int64_t n = 0; n < N; ++n) s = mac(s, h[j * N + n], dequant_int8(w2q[row * N + n], w2s[row]));
    acc = mac(acc, gates[j], s);
  }
  return acc;
}

}  // namespace gk::kernels::moe

// --- the Qwen3-MoE / Mixtral pipeline (SwigluExperts) ---------------------------
//
// Softmax routing and the SiLU-gated activation need e^x: both sides use
// graphkeep/numerics/softmax_topk.h (fexp from basic operations), so they
// still agree bit for bit.

namespace gk::kernels::moe {

// The expert weights' storage types, widened exactly to float on load.
struct F32Weight {
  using type = float;
  GK_MOE_HD static float load(float w) { return w; }
};
struct Bf16Weight {  // the upper half of a float32
  using type = std::uint16_t;
  GK_MOE_HD static float load(std::uint16_t b) { return numerics::float_of(static_cast<std::uint32_t>(b) << 16); }
};
struct F16Weight {  // IEEE binary16
  using type = std::uint16_t;
  GK_MOE_HD static float load(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return numerics::float_of(sign | 0x7F800000u | (m << 13));  // inf, NaN
    if (e != 0u) return numerics::float_of(sign | ((e + 112u) << 23) | (m << 13));
    const float v = fmul(static_cast<float>(m), 5.9604644775390625e-8f);  // subnormal: m * 2^-24, exact
    return sign != 0u ? -v : v;
  }
};

// sum_i a[i] * W::load(b[i]), in index order (for F32Weight the same
// operations as dot).
template <class W>
GK_MOE_HD float dot_w(const float* a, const typename W::type* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc = mac(acc, a[i], W::load(b[i]));
  return acc;
}

// Qwen3-MoE's router for one token: p = softmax(logits) over all E experts
// (float32), the top-k of p in torch.topk's order (ties included), gates = p
// of the chosen experts, divided by their sum (in rank order) when
// `renormalize` (norm_topk_prob). probs [E] and order [E] are scratch.
GK_MOE_HD void route_token_softmax(const float* logits, int64_t num_experts, int64_t topk, bool renormalize,
                                   float* probs, int32_t* order, int32_t* ids, float* gates) {
  numerics::softmax_row(logits, num_experts, probs);
  numerics::torch_topk_order(probs, num_experts, topk, order);
  float sum = 0.f;
  for (int64_t j = 0; j < topk; ++j) {
    ids[j] = order[j];
    gates[j] = probs[order[j]];
    sum = fadd(sum, gates[j]);
  }
  if (renormalize)
    for (int64_t j = 0; j < topk; ++j) gates[j] = fdiv(gates[j], sum);
}

// The SiLU-gated activation of Qwen3-MoE's experts: silu(a) * b (a: the gate
// projection, b: the up projection), ATen's silu formula.
GK_MOE_HD float silu_act(float a, float b) { return fmul(numerics::fsilu(a), b); }

}  // namespace gk::kernels::moe
