// The non-finite scan behind gk::detail::first_non_finite: every block
// strides over one tensor (blockIdx.y) with 16-byte loads, tests each
// element's exponent bits, and lowers the tensor's first-bad index with one
// atomicMin per thread that found one. It only reads: one pass over the
// bytes at the device's read bandwidth, and writes one word per tensor
// (torch.isfinite(w).all() writes a bool per element and reduces it).
#include "finite_check.h"

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;

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

__global__ void __launch_bounds__(kThreads) first_non_finite_kernel(const __grid_constant__ FiniteBatch batch,
                                                                    unsigned long long* first) {
  const FiniteTask& t = batch.task[blockIdx.y];
  const std::uint64_t per_vec = 16 / t.bytes;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * kThreads;
  std::uint64_t found = ~0ull;
  const auto* base = static_cast<const unsigned char*>(t.data);
  std::uint64_t head = 0;  // elements before the first 16-byte boundary
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  if (addr & 15u) head = ((16 - (addr & 15u)) / t.bytes);
  if (head > t.numel) head = t.numel;
  const std::uint64_t nvec = (t.numel - head) / per_vec;
  const uint4* vec = reinterpret_cast<const uint4*>(base + head * t.bytes);
  // Vectors, fast path: OR-reduce a "bad" test; find the lane only on a hit.
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(kThreads) + threadIdx.x; i < nvec; i += stride) {
    const uint4 v = vec[i];
    bool any;
    if (t.bytes == 2) {
      const std::uint32_t m = static_cast<std::uint32_t>(t.mask) * 0x10001u;
      auto hit = [&](std::uint32_t x) { return ((x & m) & 0xFFFFu) == (m & 0xFFFFu) || ((x & m) >> 16) == (m >> 16); };
      any = hit(v.x) || hit(v.y) || hit(v.z) || hit(v.w);
    } else {
      any = first_bad_lane(v, t.bytes, t.mask) >= 0;
    }
    if (any) {
      const std::uint64_t e = head + i * per_vec + static_cast<std::uint64_t>(first_bad_lane(v, t.bytes, t.mask));
      if (e < found) found = e;
      break;  // later vectors of this thread have larger indices
    }
  }
  // The unaligned head and the tail, element by element.
  if (blockIdx.x == 0) {
    auto scan = [&](std::uint64_t from, std::uint64_t to) {
      for (std::uint64_t e = from + threadIdx.x; e < to; e += kThreads) {
        const unsigned char* p = base + e * t.bytes;
        std::uint64_t w = 0;
        for (std::uint32_t k = 0; k < t.bytes; ++k) w |= static_cast<std::uint64_t>(p[k]) << (8 * k);
        if (bad(w, t.mask) && e < found) found = e;
      }
    };
    scan(0, head);
    scan(head + nvec * per_vec, t.numel);
  }
  if (found != ~0ull) atomicMin(first + blockIdx.y, static_cast<unsigned long long>(found));
}

}  // namespace

int launch_first_non_finite(const FiniteBatch& batch, unsigned long long* first, void* stream) {
  if (batch.count <= 0) return 0;
  std::uint64_t most = 0;
  for (int i = 0; i < batch.count; ++i) {
    const std::uint64_t v = batch.task[i].numel * batch.task[i].bytes / 16;
    if (v > most) most = v;
  }
  // Enough blocks to fill the device for the largest tensor, no more.
  std::uint64_t blocks = (most + kThreads * 8 - 1) / (kThreads * 8);
  if (blocks < 1) blocks = 1;
  if (blocks > 2048) blocks = 2048;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(batch.count));
  first_non_finite_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch, first);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
