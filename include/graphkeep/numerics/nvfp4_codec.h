// graphkeep/numerics/nvfp4_codec.h
//
// Number formats and the small numeric steps shared by the CPU twins
// (quant/*.cpp, kernels/padded_*.cpp, compiled by g++) and the CUDA kernels
// (quant/cuda/*.cu, kernels/cuda/padded_*.cu, compiled by nvcc): one source,
// so both paths compute bit for bit the same function.
//
//   - fp8 e4m3fn (OCP "fn": no infinities, 0x7F/0xFF = NaN, max 448) as uint8
//     codes: encode rounds to nearest even and saturates to +-448;
//   - fp4 e2m1 ({0, 0.5, 1, 1.5, 2, 3, 4, 6} with a sign bit) as nibbles, two
//     per byte (element 2j in the low nibble of byte j, 2j+1 in the high one);
//   - e8m0 power-of-two block scales (MXFP4);
//   - NVFP4 activation quantization: 16-element blocks with an e4m3 scale;
//   - the 128x4 scale-factor swizzle of the CUTLASS/FlashInfer block-scaled
//     MMA (see nvfp4_sf_offset_128x4).
//
// Floating-point sums and products go through fadd/fmul/fdiv: on the device
// they are the _rn intrinsics, which nvcc never contracts into an FMA; on the
// host plain operators (graphkeep builds without -march, so no FMA either).
// No Torch, no Boost: this header is included by .cu files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <graphkeep/numerics/exact_math.h>

namespace gk::quant::codec {

using numerics::bits_of;
using numerics::fadd;
using numerics::fdiv;
using numerics::float_of;
using numerics::fmul;

GK_HD float fabs_(float x) { return float_of(bits_of(x) & 0x7FFFFFFFu); }
GK_HD float relu(float x) { return x > 0.f ? x : 0.f; }

// ---------------------------------------------------------------------------
// fp8 e4m3fn
// ---------------------------------------------------------------------------
inline constexpr float kFp8Max = 448.f;

GK_HD std::uint8_t fp8_e4m3_encode(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7F;  // NaN
  if (a >= 0x43E00000u) return sign | 0x7E; // |x| >= 448, inf included: saturate
  if (a < 0x3C800000u) {                    // |x| < 2^-6: subnormals, in units of 2^-9
    const float v = fmul(float_of(a), 512.f);  // exact: a power-of-two scaling, v < 8
    std::uint32_t i = static_cast<std::uint32_t>(v);
    const float frac = v - static_cast<float>(i);  // exact
    if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;
    return sign | static_cast<std::uint8_t>(i);  // i == 8 is the smallest normal, 0x08
  }
  // Normal: keep 3 of the 23 mantissa bits, round to nearest even (a carry
  // into the exponent is the correct rounding).
  const std::uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  return sign | static_cast<std::uint8_t>(r - (120u << 3));  // rebias 127 -> 7
}

GK_HD float fp8_e4m3_decode(std::uint8_t c) {
  const std::uint32_t s = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  if (e == 15u && m == 7u) return float_of(s | 0x7FC00000u);
  if (e == 0u) {
    const float v = fmul(static_cast<float>(m), 0.001953125f);  // m * 2^-9, exact
    return s ? -v : v;
  }
  return float_of(s | ((e + 120u) << 23) | (m << 20));
}

// ---------------------------------------------------------------------------
// fp4 e2m1
// ---------------------------------------------------------------------------
inline constexpr float kFp4Max = 6.f;

// Round to nearest, ties to the even code; saturates to +-6 (NaN -> 6).
GK_HD std::uint8_t fp4_e2m1_encode(float x) {
  const std::uint8_t s = (bits_of(x) >> 31) ? 8 : 0;
  const float a = fabs_(x);
  std::uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.f) c = 6;
  else c = 7;  // also NaN, whose comparisons all fail
  return s | c;
}

GK_HD float fp4_e2m1_decode(std::uint8_t nibble) {
  const std::uint8_t c = nibble & 7u;
  const std::uint32_t e = c >> 1, m = c & 1u;
  // e == 0: 0 or 0.5; else (1 + m/2) * 2^(e-1), built exactly from bits
  const float v = e == 0 ? (m ? 0.5f : 0.f) : float_of(((e + 126u) << 23) | (m << 22));
  return (nibble & 8u) ? -v : v;
}

// Nibble i of a packed row.
GK_HD std::uint8_t fp4_nibble(const std::uint8_t* packed, std::int64_t i) {
  const std::uint8_t b = packed[i >> 1];
  return (i & 1) ? static_cast<std::uint8_t>(b >> 4) : static_cast<std::uint8_t>(b & 0xFu);
}

// ---------------------------------------------------------------------------
// e8m0 (MXFP4 block scales): 2^(e - 127)
// ---------------------------------------------------------------------------
GK_HD float e8m0_decode(std::uint8_t e) {
  if (e == 255u) return float_of(0x7FC00000u);
  if (e == 0u) return float_of(0x00400000u);  // 2^-127, a float subnormal
  return float_of(static_cast<std::uint32_t>(e) << 23);
}

// The OCP MX scale of a block whose largest magnitude is amax:
// 2^(floor(log2 amax) - emax(e2m1) = 2), clamped to e8m0's range.
GK_HD std::uint8_t mxfp4_scale_for(float amax) {
  const std::uint32_t biased = (bits_of(amax) & 0x7FFFFFFFu) >> 23;  // floor(log2) + 127 for normals
  if (biased == 0u) return 0;                                       // zero or subnormal
  if (biased >= 255u) return 254;
  const int e = static_cast<int>(biased) - 2;
  return static_cast<std::uint8_t>(e < 0 ? 0 : (e > 254 ? 254 : e));
}

// ---------------------------------------------------------------------------
// Quantized weight matrices [R, n] (site 7): element (r, i), dequantized.
//   fmt 0 (fp8 e4m3, per-row float scale):  codes [R, n] bytes, scales float [R]
//   fmt 1 (mxfp4, e8m0 per 32-block scale): codes [R, n/2] nibbles, scales uint8 [R, n/32]
// ---------------------------------------------------------------------------
inline constexpr int kFmtFp8RowScaled = 0;
inline constexpr int kFmtMxfp4 = 1;
inline constexpr std::int64_t kMxBlock = 32;

GK_HD float dequant_element(int fmt, const std::uint8_t* codes, const void* scales, std::int64_t r, std::int64_t i,
                            std::int64_t n) {
  if (fmt == kFmtFp8RowScaled)
    return fmul(fp8_e4m3_decode(codes[r * n + i]), static_cast<const float*>(scales)[r]);
  return fmul(fp4_e2m1_decode(fp4_nibble(codes + r * (n / 2), i)),
              e8m0_decode(static_cast<const std::uint8_t*>(scales)[r * (n / kMxBlock) + i / kMxBlock]));
}

// ---------------------------------------------------------------------------
// NVFP4: 16-element blocks, e4m3 block scales
// ---------------------------------------------------------------------------
inline constexpr std::int64_t kNvfp4Block = 16;

// Quantizes block b of v (scaled by gscale first) into one e2m1 code per
// byte (codes[b*16 .. b*16+15]) and its e4m3 scale sf[b] = e4m3(amax / 6).
GK_HD void nvfp4_quantize_block(const float* v, std::int64_t b, float gscale, std::uint8_t* codes,
                                std::uint8_t* sf) {
  const std::int64_t o = b * kNvfp4Block;
  float amax = 0.f;
  for (std::int64_t i = 0; i < kNvfp4Block; ++i) {
    const float a = fabs_(fmul(v[o + i], gscale));
    amax = a > amax ? a : amax;
  }
  const std::uint8_t code = fp8_e4m3_encode(fdiv(amax, kFp4Max));
  sf[b] = code;
  const float s = fp8_e4m3_decode(code);
  for (std::int64_t i = 0; i < kNvfp4Block; ++i)
    codes[o + i] = s == 0.f ? std::uint8_t{0} : fp4_e2m1_encode(fdiv(fmul(v[o + i], gscale), s));
}

// Block-scaled dot product of n activation codes (one per byte, block scales
// xsf) with a packed fp4 weight row whose block scales `wsf(b)` returns, the
// way a block-scaled MMA accumulates: per block, the exact e2m1 products are
// summed, then scaled by both block scales.
template <class WeightSf>
GK_HD float nvfp4_dot(const std::uint8_t* xcodes, const std::uint8_t* xsf, const std::uint8_t* wrow,
                      const WeightSf& wsf, std::int64_t n) {
  float acc = 0.f;
  for (std::int64_t b = 0; b < n / kNvfp4Block; ++b) {
    float p = 0.f;
    for (std::int64_t i = b * kNvfp4Block; i < (b + 1) * kNvfp4Block; ++i)
      p = fadd(p, fmul(fp4_e2m1_decode(xcodes[i]), fp4_e2m1_decode(fp4_nibble(wrow, i))));
    acc = fadd(acc, fmul(p, fmul(fp8_e4m3_decode(xsf[b]), fp8_e4m3_decode(wsf(b)))));
  }
  return acc;
}

// Block scales of one weight row in the plain layout [rows, n/16].
struct LinearSf {
  const std::uint8_t* row;
  GK_HD std::uint8_t operator()(std::int64_t b) const { return row[b]; }
};

// ---------------------------------------------------------------------------
// The 128x4 scale-factor swizzle (CUTLASS / FlashInfer / TRT-LLM
// get_sf_out_offset_128x4): a [M, Ksf] scale matrix, padded to M % 128 == 0
// and Ksf % 4 == 0, is stored as tiles [mTile][kTile][32][4][4], i.e. row m of
// a 128-row tile goes to (m % 32, m / 32 % 4) and column k to (k / 4, k % 4),
// so the 4 x 4 scales one MMA fragment needs are 16 contiguous bytes.
// ---------------------------------------------------------------------------
GK_HD std::int64_t nvfp4_sf_offset_128x4(std::int64_t m, std::int64_t k, std::int64_t num_k_tiles) {
  const std::int64_t inner_k = k % 4;             // stride 1
  const std::int64_t inner_m = (m % 128) / 32;    // stride 4
  const std::int64_t outer_m = m % 32;            // stride 16
  const std::int64_t k_tile = k / 4;              // stride 512
  const std::int64_t m_tile = m / 128;            // stride num_k_tiles * 512
  return m_tile * num_k_tiles * 512 + k_tile * 512 + outer_m * 16 + inner_m * 4 + inner_k;
}
GK_HD std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }
// Bytes of one swizzled [M, Ksf] scale matrix.
GK_HD std::int64_t nvfp4_sf_swizzled_size(std::int64_t m, std::int64_t ksf) {
  return round_up(m, 128) * round_up(ksf, 4);
}

// Block scales of row m read back from a swizzled matrix (the kernel's
// un-swizzle on read).
struct Swizzled128x4Sf {
  const std::uint8_t* base;  // this expert's swizzled matrix
  std::int64_t m;
  std::int64_t num_k_tiles;
  GK_HD std::uint8_t operator()(std::int64_t b) const { return base[nvfp4_sf_offset_128x4(m, b, num_k_tiles)]; }
};

// ---------------------------------------------------------------------------
// MoE routing shared by the MoE sites: top-1 expert by router logits
// (sequential dot products; ties go to the lower expert).
// ---------------------------------------------------------------------------
GK_HD std::int64_t route_top1(const float* x, const float* gate, std::int64_t experts, std::int64_t k) {
  std::int64_t best = 0;
  float best_v = 0.f;
  for (std::int64_t e = 0; e < experts; ++e) {
    float s = 0.f;
    for (std::int64_t i = 0; i < k; ++i) s = fadd(s, fmul(x[i], gate[e * k + i]));
    if (e == 0 || s > best_v) {
      best = e;
      best_v = s;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------
// The shared memory of the one-block-per-token NVFP4 MoE kernels (sites 8
// and 9): h[2N] and a[N] floats, then the quantized activations as bytes:
// xq[K], xsf[K/16], aq[N], asf[N/16]. bytes() is what their launchers ask for.
// ---------------------------------------------------------------------------
struct Nvfp4MoeScratch {
  float* h;
  float* a;
  std::uint8_t* xq;
  std::uint8_t* xsf;
  std::uint8_t* aq;
  std::uint8_t* asf;

  GK_HD static Nvfp4MoeScratch carve(float* smem, std::int64_t K, std::int64_t N) {
    Nvfp4MoeScratch s;
    s.h = smem;
    s.a = smem + 2 * N;
    s.xq = reinterpret_cast<std::uint8_t*>(smem + 3 * N);
    s.xsf = s.xq + K;
    s.aq = s.xsf + K / kNvfp4Block;
    s.asf = s.aq + N;
    return s;
  }
  static std::size_t bytes(std::int64_t K, std::int64_t N) {
    return static_cast<std::size_t>(3 * N) * sizeof(float) +
           static_cast<std::size_t>(K + K / kNvfp4Block + N + N / kNvfp4Block);
  }
};

}  // namespace gk::quant::codec
