// The non-finite scan behind gk::detail::first_non_finite: the tensors are
// cut into chunks of 64 KiB of 16-byte vectors, one thread block per chunk
// (the layout of the content hash's kernel, Note [Summing at memory speed]
// in hashing/cuda/content_hash.cu), each thread testing the exponent bits
// of every element of its vectors, four loads in flight; the tensor's
// first-bad index is lowered with one atomicMin per thread that found one.
// It only reads: one pass over the bytes, and one word written per tensor
// (torch.isfinite(w).all() writes a bool per element and reduces it).
//
// (Until 2026-12-06 a fixed grid of up to 2,048 blocks per tensor strode
// over each tensor, 2048 x 256 vectors apart: the scan of a 57 GiB MoE
// source read at 2.2 TB/s on an H200 where the hash's kernel reads the same
// bytes at 4.4, docs/gpu-runs.md 03:57.)
#include "finite_check.h"

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread

template <class Word>
__device__ bool bad(Word w, std::uint64_t mask) {
  return (static_cast<std::uint64_t>(w) & mask) == mask;
}

// Elements of `bytes` width packed in a 16-byte vector: returns the lowest
// lane that is non-finite, or -1.
__device__ int first_bad_lane(const uint4& v, std::uint32_t bytes, std::uint64_t mask) {
  const auto* b = reinterpret_cast<const unsigned char*>(&v);
  const int lanes = 16 / static_cast<int>(bytes);
  for (int l = 0; l < lanes; ++l) {
    std::uint64_t w = 0;
    for (std::uint32_t k = 0; k < bytes; ++k) w |= static_cast<std::uint64_t>(b[l * bytes + k]) << (8 * k);
    if ((w & mask) == mask) return l;
  }
  return -1;
}

// The batch and where each task's chunks begin among the launch's blocks:
// the kernel's parameter (about 18 KiB).
constexpr std::uint64_t kChunkVecs = 4096;  // 16-byte vectors per chunk: 64 KiB
struct FiniteGrid {
  FiniteBatch batch;
  std::uint32_t chunk_begin[kMaxFiniteTasks + 1];
};
static_assert(sizeof(FiniteGrid) <= 32764, "FiniteGrid must fit CUDA's kernel parameter limit (32,764 bytes)");

// Elements before the first 16-byte boundary of a task's data, and its
// whole 16-byte vectors after them.
struct Split {
  std::uint64_t head, nvec;
};
__host__ __device__ inline Split split_of(const FiniteTask& t) {
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  std::uint64_t head = (addr & 15u) ? (16 - (addr & 15u)) / t.bytes : 0;
  if (head > t.numel) head = t.numel;
  return {head, (t.numel - head) / (16 / t.bytes)};
}

__global__ void __launch_bounds__(kThreads) first_non_finite_kernel(const __grid_constant__ FiniteGrid grid,
                                                                    unsigned long long* first) {
  const std::uint32_t chunk = blockIdx.x;
  int lo = 0, hi = grid.batch.count - 1;  // the task ti with chunk_begin[ti] <= chunk < chunk_begin[ti + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (grid.chunk_begin[mid] <= chunk) lo = mid; else hi = mid - 1;
  }
  const int ti = lo;
  const FiniteTask& t = grid.batch.task[ti];
  const std::uint64_t c = chunk - grid.chunk_begin[ti];
  const std::uint64_t last = grid.chunk_begin[ti + 1] - grid.chunk_begin[ti] - 1;
  const std::uint64_t per_vec = 16 / t.bytes;
  const auto* base = static_cast<const unsigned char*>(t.data);
  const Split sp = split_of(t);
  const uint4* vec = reinterpret_cast<const uint4*>(base + sp.head * t.bytes);
  const std::uint64_t v0 = c * kChunkVecs, v1 = sp.nvec - v0 < kChunkVecs ? sp.nvec : v0 + kChunkVecs;
  std::uint64_t found = ~0ull;
  // Vectors, fast path: OR-reduce a "bad" test; find the lane only on a hit.
  // kUnroll loads in flight per thread before any is tested; a thread's
  // vectors ascend, so its first hit in that order is its lowest.
  const std::uint32_t m2 = static_cast<std::uint32_t>(t.mask) * 0x10001u;
  auto any_bad = [&](const uint4& v) {
    if (t.bytes == 2) {
      auto hit = [&](std::uint32_t x) { return ((x & m2) & 0xFFFFu) == (m2 & 0xFFFFu) || ((x & m2) >> 16) == (m2 >> 16); };
      return hit(v.x) || hit(v.y) || hit(v.z) || hit(v.w);
    }
    return first_bad_lane(v, t.bytes, t.mask) >= 0;
  };
  bool hit = false;
  for (std::uint64_t i = v0 + threadIdx.x; i < v1 && !hit; i += kUnroll * kThreads) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint64_t j = i + static_cast<std::uint64_t>(u) * kThreads;
      v[u] = j < v1 ? vec[j] : make_uint4(0, 0, 0, 0);  // zero bits are finite in every dtype
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (hit || !any_bad(v[u])) continue;
      const std::uint64_t j = i + static_cast<std::uint64_t>(u) * kThreads;
      found = sp.head + j * per_vec + static_cast<std::uint64_t>(first_bad_lane(v[u], t.bytes, t.mask));
      hit = true;  // later vectors of this thread have larger indices
    }
  }
  // The unaligned head (the first chunk) and the tail (the last), element by element.
  auto scan = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t e = from + threadIdx.x; e < to; e += kThreads) {
      const unsigned char* p = base + e * t.bytes;
      std::uint64_t w = 0;
      for (std::uint32_t k = 0; k < t.bytes; ++k) w |= static_cast<std::uint64_t>(p[k]) << (8 * k);
      if (bad(w, t.mask) && e < found) found = e;
    }
  };
  if (c == 0) scan(0, sp.head);
  if (c == last) scan(sp.head + sp.nvec * per_vec, t.numel);
  if (found != ~0ull) atomicMin(first + ti, static_cast<unsigned long long>(found));
}

}  // namespace

int launch_first_non_finite(const FiniteBatch& batch, unsigned long long* first, void* stream) {
  if (batch.count <= 0) return 0;
  FiniteGrid grid;
  grid.batch = batch;
  std::uint64_t chunks = 0;
  for (int i = 0; i < batch.count; ++i) {
    grid.chunk_begin[i] = static_cast<std::uint32_t>(chunks);
    const std::uint64_t nvec = split_of(batch.task[i]).nvec;
    chunks += nvec == 0 ? 1 : (nvec + kChunkVecs - 1) / kChunkVecs;  // at least one: the head and tail
    if (chunks > 0x7FFFFFFFull) return static_cast<int>(cudaErrorInvalidConfiguration);
  }
  grid.chunk_begin[batch.count] = static_cast<std::uint32_t>(chunks);
  first_non_finite_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(grid, first);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
