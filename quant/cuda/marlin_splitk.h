// quant/cuda/marlin_splitk.h: the arithmetic that the Marlin-family CUDA
// kernels (quant/cuda/marlin.cu) and their CPU twins (quant/marlin.cpp) share,
// plus the split-K problem description and the per-format "variants".
//
// Plain C++17 with __host__ __device__ markers: no Torch, no Boost, so nvcc
// compiles it in the .cu and g++ in the .cpp. Every float operation goes
// through fmul/fadd (numerics/exact_math.h: __fmul_rn/__fadd_rn on the device, no FMA
// contraction), and a variant's partial sum visits k in the same order on
// both sides, so CPU and GPU results are bitwise equal.
//
// The split-K protocol (Marlin's barrier_acquire / barrier_release): an output
// tile of unit u (a column tile, per expert for MoE) is reduced over S slices
// of K. The block computing slice s waits until locks[u] == s (on the GPU a
// bounded spin of SplitK::spin_limit loads, then it gives up: a timeout), adds
// its partial sum (slice 0 stores it), and sets locks[u] = s + 1; the last
// slice resets it to 0. Every lock must therefore be 0 at launch. A timed-out
// block writes NaN into its outputs and leaves the lock alone, so a garbage
// lock shows up as NaN outputs instead of a hang.
#pragma once

#include <cstdint>
#include <cstring>

#include <graphkeep/numerics/exact_math.h>
#include <graphkeep/numerics/nvfp4_codec.h>

namespace gk::quant::marlin {

using numerics::fadd;
using numerics::fdiv;
using numerics::fmul;
using numerics::quiet_nan;

// fp8 e4m3fn and fp4 e2m1 codes to float, exactly (the codec's decoders).
GK_HD float e4m3_to_float(std::uint32_t byte) { return codec::fp8_e4m3_decode(static_cast<std::uint8_t>(byte)); }
GK_HD float e2m1_to_float(std::uint32_t nib) { return codec::fp4_e2m1_decode(static_cast<std::uint8_t>(nib)); }

// --- the split-K problem ------------------------------------------------------
// The output is cut into `groups` x `tiles` units (groups: 1, or the experts
// of a MoE layer; tiles: column tiles of width tile_n). Each unit is reduced
// over `slices` equal slices of K, in slice order, under locks[unit].
struct SplitK {
  std::int32_t* locks = nullptr;  // the lock workspace: >= groups * tiles counters, 0 at launch
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t groups = 1, tiles = 1, tile_n = 16, slices = 1;
  std::int32_t spin_limit = 1 << 20;  // GPU: loads of a lock before a block gives up
};

// Variant interface (one struct per weight format):
//   bool  active(group, row)                  does `row` take part in `group`
//   float partial(group, row, col, k0, k1)     sum over k in [k0, k1) of x * w
//   float* output(row, col)                    where the reduced value goes

// W4A16 with act-order (site 5). The derived weight holds the int4 values in
// sorted-K order (row i is input channel perm[i]); the kernel gathers the
// activations through perm and takes each channel's group scale from g_idx.
struct W4A16Args {
  const float* x = nullptr;              // [M, K] activations
  const std::int32_t* qweight = nullptr; // [K/8, N] int4 (value + 8), 8 per int32 along sorted K
  const float* scales = nullptr;         // [G, N] per-group scales
  const std::int32_t* g_idx = nullptr;   // [K] group of each input channel
  const std::int32_t* perm = nullptr;    // [K] g_idx_sort_indices (argsort of g_idx)
  float* out = nullptr;                  // [M, N]
  std::int64_t m = 0, n = 0, k = 0;

  GK_HD bool active(std::int64_t, std::int64_t) const { return true; }
  GK_HD float partial(std::int64_t, std::int64_t row, std::int64_t col, std::int64_t k0, std::int64_t k1) const {
    float acc = 0.f;
    for (std::int64_t i = k0; i < k1; ++i) {
      const std::int32_t src = perm[i];
      const std::uint32_t word = static_cast<std::uint32_t>(qweight[(i >> 3) * n + col]);
      const int q = static_cast<int>((word >> (4 * (i & 7))) & 0xFu) - 8;
      const float w = fmul(static_cast<float>(q), scales[static_cast<std::int64_t>(g_idx[src]) * n + col]);
      acc = fadd(acc, fmul(x[row * k + src], w));
    }
    return acc;
  }
  GK_HD float* output(std::int64_t row, std::int64_t col) const { return out + row * n + col; }
};

// FP8 weights (site 6): e4m3 bytes, 4 per int32 along K, per-channel scales.
struct Fp8Args {
  const float* x = nullptr;              // [M, K]
  const std::int32_t* qweight = nullptr; // [K/4, N] fp8 e4m3 bytes, byte j of a word is k % 4 == j
  const float* scales = nullptr;         // [N] per output channel
  float* out = nullptr;                  // [M, N]
  std::int64_t m = 0, n = 0, k = 0;

  GK_HD bool active(std::int64_t, std::int64_t) const { return true; }
  GK_HD float partial(std::int64_t, std::int64_t row, std::int64_t col, std::int64_t k0, std::int64_t k1) const {
    const float s = scales[col];
    float acc = 0.f;
    for (std::int64_t i = k0; i < k1; ++i) {
      const std::uint32_t word = static_cast<std::uint32_t>(qweight[(i >> 2) * n + col]);
      const float w = fmul(e4m3_to_float((word >> (8 * (i & 3))) & 0xFFu), s);
      acc = fadd(acc, fmul(x[row * k + i], w));
    }
    return acc;
  }
  GK_HD float* output(std::int64_t row, std::int64_t col) const { return out + row * n + col; }
};

// FP4 weights (site 6): e2m1 nibbles, 8 per int32 along K, a float scale per
// block of 16 input channels (decoded from fp8 in PWAL) and a global scale.
struct Fp4Args {
  const float* x = nullptr;              // [M, K]
  const std::int32_t* qweight = nullptr; // [K/8, N] e2m1 nibbles, nibble j of a word is k % 8 == j
  const float* block_scales = nullptr;   // [K/16, N]
  const float* global_scale = nullptr;   // [1], read on the device
  float* out = nullptr;                  // [M, N]
  std::int64_t m = 0, n = 0, k = 0;
  static constexpr std::int64_t kBlock = 16;

  GK_HD bool active(std::int64_t, std::int64_t) const { return true; }
  GK_HD float partial(std::int64_t, std::int64_t row, std::int64_t col, std::int64_t k0, std::int64_t k1) const {
    const float gs = global_scale[0];
    float acc = 0.f;
    for (std::int64_t i = k0; i < k1; ++i) {
      const std::uint32_t word = static_cast<std::uint32_t>(qweight[(i >> 3) * n + col]);
      const float w = fmul(fmul(e2m1_to_float((word >> (4 * (i & 7))) & 0xFu), block_scales[(i / kBlock) * n + col]), gs);
      acc = fadd(acc, fmul(x[row * k + i], w));
    }
    return acc;
  }
  GK_HD float* output(std::int64_t row, std::int64_t col) const { return out + row * n + col; }
};

// MoE W4A16 (site 6): one expert per token (expert_ids, from the router), the
// experts' int4 weights N-major ([E, N, K/8]), group scales per expert. Units
// are (expert, column tile): each expert has its own locks.
struct MoeArgs {
  const float* x = nullptr;                 // [M, K]
  const std::int32_t* expert_ids = nullptr; // [M], per call
  const std::int32_t* qweight = nullptr;    // [E, N, K/8] int4 (value + 8), nibble j of a word is k % 8 == j
  const float* scales = nullptr;            // [E, K/group_size, N]
  float* out = nullptr;                     // [M, N]
  std::int64_t m = 0, n = 0, k = 0, group_size = 1;

  GK_HD bool active(std::int64_t expert, std::int64_t row) const { return expert_ids[row] == expert; }
  GK_HD float partial(std::int64_t expert, std::int64_t row, std::int64_t col, std::int64_t k0, std::int64_t k1) const {
    const std::int32_t* w_col = qweight + (expert * n + col) * (k / 8);
    const float* s_e = scales + expert * (k / group_size) * n;
    float acc = 0.f;
    for (std::int64_t i = k0; i < k1; ++i) {
      const std::uint32_t word = static_cast<std::uint32_t>(w_col[i >> 3]);
      const int q = static_cast<int>((word >> (4 * (i & 7))) & 0xFu) - 8;
      const float w = fmul(static_cast<float>(q), s_e[(i / group_size) * n + col]);
      acc = fadd(acc, fmul(x[row * k + i], w));
    }
    return acc;
  }
  GK_HD float* output(std::int64_t row, std::int64_t col) const { return out + row * n + col; }
};

// The MoE router: expert_ids[row] = argmax_e (x[row] . gate[e]) (first maximum).
GK_HD std::int32_t route_row(const float* x, const float* gate, std::int64_t row, std::int64_t experts,
                             std::int64_t k) {
  std::int32_t best = 0;
  float best_logit = 0.f;
  for (std::int64_t e = 0; e < experts; ++e) {
    float acc = 0.f;
    for (std::int64_t i = 0; i < k; ++i) acc = fadd(acc, fmul(x[row * k + i], gate[e * k + i]));
    if (e == 0 || acc > best_logit) {
      best = static_cast<std::int32_t>(e);
      best_logit = acc;
    }
  }
  return best;
}

}  // namespace gk::quant::marlin
