// The fast decode path's kernels (decoder_kernels_launch.h). Each keeps the
// roundings of the ATen ops it replaces (transformers' order: a value is
// rounded to the model dtype wherever transformers holds it in that dtype),
// so it differs from the reference path only in the order of its sums.
#include "decoder_kernels_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

namespace demo::cuda {
namespace {

// Loads, stores and rounding for each storage type; arithmetic is float32.
template <class T>
struct Io;
template <>
struct Io<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <>
struct Io<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Io<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
// v rounded to T and widened again (what a T tensor holding v holds).
template <class T>
__device__ __forceinline__ float rd(float v) {
  return Io<T>::load(Io<T>::store(v));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over the block (blockDim.x a multiple of 32, at most 1024), the
// same in every thread. Once per kernel (one shared array).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : 0.f);
}

template <class T>
__global__ void add_rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ d, const T* __restrict__ w,
                                    T* __restrict__ h, T* __restrict__ y, std::int64_t n, float eps) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  const T* dr = d != nullptr ? d + row * n : nullptr;
  T* hr = h != nullptr ? h + row * n : nullptr;
  T* yr = y + row * n;
  float ss = 0.f;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = Io<T>::load(xr[i]);
    if (dr != nullptr) {
      v = rd<T>(v + Io<T>::load(dr[i]));
      hr[i] = Io<T>::store(v);
    }
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = dr != nullptr ? Io<T>::load(hr[i]) : Io<T>::load(xr[i]);  // this thread's own store
    yr[i] = Io<T>::store(Io<T>::load(w[i]) * rd<T>(v * r));
  }
}

// One warp per (token, head); grid (T, ceil(heads / warps per block)).
template <class T>
__global__ void qkv_rope_cache_kernel(const T* __restrict__ qkv, std::int64_t qkv_stride,
                                      const std::int64_t* __restrict__ positions, const std::int64_t* __restrict__ seqs,
                                      const float* __restrict__ cosb, const float* __restrict__ sinb,
                                      const T* __restrict__ q_norm, const T* __restrict__ k_norm, T* __restrict__ q_out,
                                      T* __restrict__ k_cache, T* __restrict__ v_cache, std::int64_t H, std::int64_t KV,
                                      std::int64_t D, std::int64_t L, float eps) {
  extern __shared__ float rows[];  // [warps per block][D]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t t = blockIdx.x;
  const std::int64_t head = static_cast<std::int64_t>(blockIdx.y) * (blockDim.x >> 5) + warp;
  if (head >= H + 2 * KV) return;  // the whole warp
  float* row = rows + warp * D;
  const T* src = qkv + t * qkv_stride + head * D;
  const bool is_q = head < H, is_k = !is_q && head < H + KV, is_v = head >= H + KV;
  const T* norm = is_q ? q_norm : is_k ? k_norm : nullptr;
  float ss = 0.f;
  for (std::int64_t d = lane; d < D; d += 32) {
    const float v = Io<T>::load(src[d]);
    row[d] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (norm != nullptr) {  // Qwen3's q_norm / k_norm: transformers' RMSNorm over the head
    const float r = rsqrtf(ss / static_cast<float>(D) + eps);
    for (std::int64_t d = lane; d < D; d += 32) row[d] = rd<T>(Io<T>::load(norm[d]) * rd<T>(row[d] * r));
  }
  __syncwarp();
  const std::int64_t p = positions[t];
  T* dst;
  if (is_q) {
    dst = q_out + (t * H + head) * D;
  } else {
    const std::int64_t cache_row = seqs[t] * L + p;
    dst = (is_k ? k_cache : v_cache) + (cache_row * KV + (head - H - (is_k ? 0 : KV))) * D;
  }
  if (is_v) {
    for (std::int64_t d = lane; d < D; d += 32) dst[d] = Io<T>::store(row[d]);
    return;
  }
  // q * cos + rotate_half(q) * sin, each product and the sum rounded to T
  // (cos and sin cast to T first, as transformers does).
  const std::int64_t half = D / 2;
  for (std::int64_t d = lane; d < D; d += 32) {
    const float c = rd<T>(cosb[p * D + d]), s = rd<T>(sinb[p * D + d]);
    const float partner = d < half ? -row[d + half] : row[d - half];
    dst[d] = Io<T>::store(rd<T>(row[d] * c) + rd<T>(partner * s));
  }
}

constexpr int kAttnWarps = 4;
constexpr int kAttnMaxG = 8;  // query heads per block (more: grid.z)

// Grid (T, KV, ceil(G / kAttnMaxG)), kAttnWarps warps. Warp w walks the
// positions w, w + kAttnWarps, ... up to the token's own, with a running
// max and sum per query head (online softmax); lane l holds dimensions
// l VPL .. l VPL + VPL - 1. The warps' partial results are merged at the end.
template <class T, int VPL>
__global__ void decode_attention_kernel(const T* __restrict__ q, const std::int64_t* __restrict__ positions,
                                        const std::int64_t* __restrict__ seqs, const T* __restrict__ k_cache,
                                        const T* __restrict__ v_cache, T* __restrict__ out, std::int64_t H,
                                        std::int64_t KV, std::int64_t D, std::int64_t L, float scale) {
  extern __shared__ float merge[];  // [kAttnWarps][kAttnMaxG][2 + D]
  const std::int64_t t = blockIdx.x, kh = blockIdx.y;
  const std::int64_t G = H / KV, g0 = static_cast<std::int64_t>(blockIdx.z) * kAttnMaxG;
  const int ng = static_cast<int>(G - g0 < kAttnMaxG ? G - g0 : kAttnMaxG);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t len = positions[t] + 1, base = seqs[t] * L;
  const std::int64_t head0 = kh * G + g0;
  float qv[kAttnMaxG][VPL], acc[kAttnMaxG][VPL], m[kAttnMaxG], l[kAttnMaxG];
#pragma unroll
  for (int g = 0; g < kAttnMaxG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const std::int64_t d = lane * VPL + i;
      acc[g][i] = 0.f;
      qv[g][i] = g < ng && d < D ? Io<T>::load(q[(t * H + head0 + g) * D + d]) * scale : 0.f;
    }
  }
  for (std::int64_t j = warp; j < len; j += kAttnWarps) {
    const T* kr = k_cache + ((base + j) * KV + kh) * D;
    const T* vr = v_cache + ((base + j) * KV + kh) * D;
    float kx[VPL], vx[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const std::int64_t d = lane * VPL + i;
      kx[i] = d < D ? Io<T>::load(kr[d]) : 0.f;
      vx[i] = d < D ? Io<T>::load(vr[d]) : 0.f;
    }
#pragma unroll
    for (int g = 0; g < kAttnMaxG; ++g) {
      if (g >= ng) break;
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < VPL; ++i) s += qv[g][i] * kx[i];
      s = warp_sum(s);
      const float mn = fmaxf(m[g], s);
      const float corr = expf(m[g] - mn), p = expf(s - mn);
      l[g] = l[g] * corr + p;
#pragma unroll
      for (int i = 0; i < VPL; ++i) acc[g][i] = acc[g][i] * corr + p * vx[i];
      m[g] = mn;
    }
  }
  const std::int64_t slot = 2 + D;
#pragma unroll
  for (int g = 0; g < kAttnMaxG; ++g) {
    if (g >= ng) break;
    float* s = merge + (warp * kAttnMaxG + g) * slot;
    if (lane == 0) {
      s[0] = m[g];
      s[1] = l[g];
    }
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const std::int64_t d = lane * VPL + i;
      if (d < D) s[2 + d] = acc[g][i];
    }
  }
  __syncthreads();
  for (std::int64_t idx = threadIdx.x; idx < ng * D; idx += blockDim.x) {
    const std::int64_t g = idx / D, d = idx % D;
    float mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, merge[(w * kAttnMaxG + g) * slot]);
    float sum = 0.f, o = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) {
      const float* s = merge + (w * kAttnMaxG + g) * slot;
      const float f = s[1] > 0.f ? expf(s[0] - mx) : 0.f;  // a warp that saw no position
      sum += s[1] * f;
      o += s[2 + d] * f;
    }
    out[(t * H + head0 + g) * D + d] = Io<T>::store(o / sum);
  }
}

template <class T>
__global__ void silu_and_mul_kernel(const T* __restrict__ h, std::int64_t hs, T* __restrict__ out, std::int64_t rows,
                                    std::int64_t inter) {
  const std::int64_t total = rows * inter;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / inter, c = idx % inter;
    const float g = Io<T>::load(h[r * hs + c]), u = Io<T>::load(h[r * hs + inter + c]);
    out[idx] = Io<T>::store(rd<T>(g / (1.f + expf(-g))) * u);
  }
}

// A thread per column and kLoraRows rows. The column's row of B is read
// once into registers (R: the rank, unrolled; R = 0: any rank, read as it
// goes). t's rows of the block are the same for every thread: with R
// unrolled the block stages them once in shared memory as float, and each
// thread reads them four at a time (one 16-byte load where it made R
// loads of 2 bytes each from global memory, per row: at a decode batch
// those loads, not the bytes, were the kernel's cost). A thread's rows are
// independent: y's are all loaded before the first store. Each output is
// the same sum in the same order either way (j ascending from 0, then
// y + scale acc, rounded once).
constexpr int kLoraRows = 8;
template <class T, int R>
__global__ void lora_expand_kernel(const T* __restrict__ y, std::int64_t ys, const T* __restrict__ t,
                                   std::int64_t ts, const T* __restrict__ b, T* __restrict__ out, std::int64_t rows,
                                   std::int64_t n, std::int64_t rank, LoraParts parts, float scale) {
  static_assert(R % 4 == 0, "the rank in whole float4s (R = 0: any rank, unstaged)");
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kLoraRows;
  const int here = static_cast<int>(rows - r0 < kLoraRows ? rows - r0 : kLoraRows);  // rows of this block
  constexpr int kStaged = R > 0 ? R * LoraParts::kMax : 4;  // floats per staged row
  __shared__ __align__(16) float t_s[kLoraRows][kStaged];
  if constexpr (R > 0) {  // every thread of the block takes part, the columns past n included
    const int width = parts.count * R;
    for (int k = static_cast<int>(threadIdx.x); k < kLoraRows * width; k += static_cast<int>(blockDim.x)) {
      const int i = k / width, j = k % width;
      t_s[i][j] = i < here ? Io<T>::load(t[(r0 + i) * ts + j]) : 0.f;
    }
    __syncthreads();
  } else {
    (void)t_s;
  }
  if (c >= n) return;
  int p = -1;
  std::int64_t brow = 0;
#pragma unroll
  for (int i = 0; i < LoraParts::kMax; ++i)
    if (i < parts.count && c >= parts.offset[i] && c < parts.offset[i] + parts.size[i])
      p = i, brow = parts.brow[i] + c - parts.offset[i];
  float yv[kLoraRows];
#pragma unroll
  for (int i = 0; i < kLoraRows; ++i) yv[i] = i < here ? Io<T>::load(y[(r0 + i) * ys + c]) : 0.f;
  float acc[kLoraRows] = {};
  if (p >= 0) {
    const T* bp = b + brow * rank;
    if constexpr (R > 0) {
      float bv[R];
#pragma unroll
      for (int j = 0; j < R; ++j) bv[j] = Io<T>::load(bp[j]);
#pragma unroll
      for (int i = 0; i < kLoraRows; ++i) {
        const float4* trow = reinterpret_cast<const float4*>(&t_s[i][p * R]);
#pragma unroll
        for (int q = 0; q < R / 4; ++q) {
          const float4 v = trow[q];
          acc[i] += v.x * bv[4 * q];
          acc[i] += v.y * bv[4 * q + 1];
          acc[i] += v.z * bv[4 * q + 2];
          acc[i] += v.w * bv[4 * q + 3];
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kLoraRows; ++i) {
        if (i >= here) continue;
        const T* trow = t + (r0 + i) * ts + p * rank;
        for (std::int64_t j = 0; j < rank; ++j) acc[i] += Io<T>::load(trow[j]) * Io<T>::load(bp[j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kLoraRows; ++i) {
    if (i >= here) continue;
    // An untargeted column is y's value unchanged (no rounding through float: y is stored as loaded).
    out[(r0 + i) * n + c] = p >= 0 ? Io<T>::store(yv[i] + scale * acc[i]) : y[(r0 + i) * ys + c];
  }
}

__device__ __forceinline__ std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__global__ void gumbel_noise_kernel(const std::int64_t* __restrict__ ids, std::int64_t ids_stride,
                                    const std::int64_t* __restrict__ keys, float* __restrict__ out, std::int64_t rows,
                                    std::int64_t vocab) {
  const std::int64_t total = rows * vocab;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / vocab, v = idx % vocab;
    const std::uint32_t h = mix32(static_cast<std::uint32_t>(keys[r]) ^ static_cast<std::uint32_t>(ids[r * ids_stride + v]));
    const float u = (static_cast<float>(h >> 8) + 0.5f) * 5.9604644775390625e-08f;  // 2^-24
    out[idx] = -logf(-logf(u));
  }
}

unsigned grid_for(std::int64_t total, int threads) {
  const std::int64_t blocks = (total + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65535 * 16 ? 65535 * 16 : blocks);
}

template <class F>
int dispatch(Dtype dt, F&& f) {
  switch (dt) {
    case Dtype::bf16: f(static_cast<__nv_bfloat16*>(nullptr)); break;
    case Dtype::f16: f(static_cast<__half*>(nullptr)); break;
    default: f(static_cast<float*>(nullptr)); break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

const char* error_name(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

int launch_add_rms_norm(Dtype dt, const void* x, const void* d, const void* w, void* h, void* y, std::int64_t rows,
                        std::int64_t n, float eps, void* stream) {
  if (rows == 0) return 0;
  const int threads = n >= 4096 ? 512 : n >= 1024 ? 256 : 128;
  return dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_rms_norm_kernel<T><<<static_cast<unsigned>(rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(d), static_cast<const T*>(w), static_cast<T*>(h),
        static_cast<T*>(y), n, eps);
  });
}

int launch_qkv_rope_cache(Dtype dt, const void* qkv, std::int64_t qkv_stride, const std::int64_t* positions,
                          const std::int64_t* seqs, const float* cos, const float* sin, const void* q_norm,
                          const void* k_norm, void* q_out, void* k_cache, void* v_cache, std::int64_t tokens,
                          std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_len,
                          float eps, void* stream) {
  if (tokens == 0) return 0;
  constexpr int kWarps = 4;
  const std::int64_t all = heads + 2 * kv_heads;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((all + kWarps - 1) / kWarps));
  const std::size_t smem = static_cast<std::size_t>(kWarps * head_dim) * sizeof(float);
  return dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    qkv_rope_cache_kernel<T><<<grid, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(qkv), qkv_stride, positions, seqs, cos, sin, static_cast<const T*>(q_norm),
        static_cast<const T*>(k_norm), static_cast<T*>(q_out), static_cast<T*>(k_cache), static_cast<T*>(v_cache),
        heads, kv_heads, head_dim, max_len, eps);
  });
}

int launch_decode_attention(Dtype dt, const void* q, const std::int64_t* positions, const std::int64_t* seqs,
                            const void* k_cache, const void* v_cache, void* out, std::int64_t tokens,
                            std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_len,
                            float scale, void* stream) {
  if (tokens == 0) return 0;
  if (head_dim > 256 || kv_heads <= 0 || heads % kv_heads != 0) return static_cast<int>(cudaErrorInvalidValue);
  const std::int64_t g = heads / kv_heads;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(kv_heads),
                  static_cast<unsigned>((g + kAttnMaxG - 1) / kAttnMaxG));
  const std::size_t smem = static_cast<std::size_t>(kAttnWarps * kAttnMaxG * (2 + head_dim)) * sizeof(float);
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* qp = static_cast<const T*>(q);
    const T* kp = static_cast<const T*>(k_cache);
    const T* vp = static_cast<const T*>(v_cache);
    T* op = static_cast<T*>(out);
    if (head_dim <= 32)
      decode_attention_kernel<T, 1><<<grid, kAttnWarps * 32, smem, s>>>(qp, positions, seqs, kp, vp, op, heads,
                                                                        kv_heads, head_dim, max_len, scale);
    else if (head_dim <= 64)
      decode_attention_kernel<T, 2><<<grid, kAttnWarps * 32, smem, s>>>(qp, positions, seqs, kp, vp, op, heads,
                                                                        kv_heads, head_dim, max_len, scale);
    else if (head_dim <= 128)
      decode_attention_kernel<T, 4><<<grid, kAttnWarps * 32, smem, s>>>(qp, positions, seqs, kp, vp, op, heads,
                                                                        kv_heads, head_dim, max_len, scale);
    else
      decode_attention_kernel<T, 8><<<grid, kAttnWarps * 32, smem, s>>>(qp, positions, seqs, kp, vp, op, heads,
                                                                        kv_heads, head_dim, max_len, scale);
  });
}

int launch_silu_and_mul(Dtype dt, const void* h, std::int64_t h_stride, void* out, std::int64_t rows,
                        std::int64_t inter, void* stream) {
  if (rows * inter == 0) return 0;
  constexpr int kThreads = 256;
  return dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_and_mul_kernel<T><<<grid_for(rows * inter, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(h), h_stride, static_cast<T*>(out), rows, inter);
  });
}

int launch_lora_expand(Dtype dt, const void* y, std::int64_t y_stride, const void* t, std::int64_t t_stride,
                       const void* b, void* out, std::int64_t rows, std::int64_t n, std::int64_t rank,
                       const LoraParts& parts, float scale, void* stream) {
  if (rows * n == 0) return 0;
  if (parts.count < 0 || parts.count > LoraParts::kMax) return static_cast<int>(cudaErrorInvalidValue);
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads),
                  static_cast<unsigned>((rows + kLoraRows - 1) / kLoraRows));
  return dispatch(dt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* yp = static_cast<const T*>(y);
    const auto* tp = static_cast<const T*>(t);
    const auto* bp = static_cast<const T*>(b);
    auto* op = static_cast<T*>(out);
    const auto s = static_cast<cudaStream_t>(stream);
    const std::int64_t ys = y_stride, ts = t_stride;
    switch (rank) {  // the ranks adapters use, unrolled
      case 8: lora_expand_kernel<T, 8><<<grid, kThreads, 0, s>>>(yp, ys, tp, ts, bp, op, rows, n, rank, parts, scale); break;
      case 16: lora_expand_kernel<T, 16><<<grid, kThreads, 0, s>>>(yp, ys, tp, ts, bp, op, rows, n, rank, parts, scale); break;
      case 32: lora_expand_kernel<T, 32><<<grid, kThreads, 0, s>>>(yp, ys, tp, ts, bp, op, rows, n, rank, parts, scale); break;
      default: lora_expand_kernel<T, 0><<<grid, kThreads, 0, s>>>(yp, ys, tp, ts, bp, op, rows, n, rank, parts, scale); break;
    }
  });
}

int launch_gumbel_noise(const std::int64_t* ids, std::int64_t ids_stride, const std::int64_t* row_keys, float* out,
                        std::int64_t rows, std::int64_t vocab, void* stream) {
  if (rows * vocab == 0) return 0;
  constexpr int kThreads = 256;
  gumbel_noise_kernel<<<grid_for(rows * vocab, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      ids, ids_stride, row_keys, out, rows, vocab);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace demo::cuda
