// The two kernels of Note [Changed elements on the device]
// (delta/changed_elements.cpp).
#include "changed_elements.h"

#include <graphkeep/delta/detail/word_diff.h>
#include <graphkeep/hashing/sum64.h>
#include <graphkeep/numerics/tile_rank.h>

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kDiffTaskElements % kThreads == 0, "a task is whole tiles of kThreads elements");

template <class T>
__device__ __forceinline__ bool differs(const DiffPair& p, std::int64_t i) {
  return static_cast<const T*>(p.base)[i] != static_cast<const T*>(p.target)[i];
}

__device__ __forceinline__ bool changed(const DiffPair& p, std::int64_t i) {
  switch (p.elem_bytes) {
    case 1: return differs<unsigned char>(p, i);
    case 2: return differs<unsigned short>(p, i);
    case 4: return differs<unsigned int>(p, i);
    default: return differs<unsigned long long>(p, i);
  }
}

template <class T>
__device__ __forceinline__ void put(void* to, std::int64_t at, const void* from, std::int64_t i) {
  static_cast<T*>(to)[at] = static_cast<const T*>(from)[i];
}

namespace s64 = gk::detail::sum64;

struct WordLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const {
    return *reinterpret_cast<const unsigned long long*>(p);
  }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return *p; }
};
struct ByteLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const { return s64::bytes_le(p, 8, *this); }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return *p; }
};

// The task's elements lie in bytes [begin * e, end) of its pair; a task
// begins at a multiple of kDiffTaskElements elements, hence of 8 bytes, and
// ends at a multiple of 8 bytes or at the tensor's end (the last word
// zero-padded in both tensors: no change there). Word by word: the count of
// changed elements (changed_lanes) and both hashes' word terms, one read of
// each tensor.
template <class Load>
__device__ __forceinline__ void count_words(const DiffPair& p, const DiffTask& t, int& n, std::uint64_t& sb,
                                            std::uint64_t& st) {
  const auto* b = static_cast<const unsigned char*>(p.base);
  const auto* g = static_cast<const unsigned char*>(p.target);
  const std::uint64_t end = static_cast<std::uint64_t>(t.begin + t.count) * p.elem_bytes;
  const std::uint64_t first = static_cast<std::uint64_t>(t.begin) * p.elem_bytes / 8;
  const std::uint64_t last = s64::words_of(end);
  const Load load;
  for (std::uint64_t j = first + threadIdx.x; j < last; j += kThreads) {
    const std::uint64_t wb = s64::word_at(b, end, j, load), wt = s64::word_at(g, end, j, load);
    n += gk::detail::changed_lanes(wb ^ wt, p.elem_bytes);
    sb += s64::word_term(wb, j);
    st += s64::word_term(wt, j);
  }
}

__global__ void __launch_bounds__(kThreads)
    diff_count_kernel(const DiffPair* __restrict__ pairs, const DiffTask* __restrict__ tasks,
                      std::int32_t* __restrict__ counts, unsigned long long* __restrict__ sums) {
  __shared__ int total;
  __shared__ std::uint64_t sum_b[kWarps], sum_t[kWarps];
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  const DiffTask t = tasks[blockIdx.x];
  const DiffPair p = pairs[t.pair];
  int n = 0;
  std::uint64_t sb = 0, st = 0;
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(p.base) | reinterpret_cast<std::uintptr_t>(p.target)) & 7u) == 0;
  if (aligned) count_words<WordLoad>(p, t, n, sb, st);
  else count_words<ByteLoad>(p, t, n, sb, st);
  for (int o = 16; o > 0; o >>= 1) {
    n += __shfl_down_sync(0xffffffffu, n, o);
    sb += __shfl_down_sync(0xffffffffu, sb, o);
    st += __shfl_down_sync(0xffffffffu, st, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&total, n);
    sum_b[threadIdx.x / 32] = sb;
    sum_t[threadIdx.x / 32] = st;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    counts[blockIdx.x] = total;
    if (sums != nullptr) {
      std::uint64_t b = 0, g = 0;
      for (int w = 0; w < kWarps; ++w) b += sum_b[w], g += sum_t[w];
      atomicAdd(sums + 2 * t.pair, static_cast<unsigned long long>(b));
      atomicAdd(sums + 2 * t.pair + 1, static_cast<unsigned long long>(g));
    }
  }
}

// The collection word by word (both tensors 8-byte aligned): a tile is 256
// words, so a bf16 task takes a quarter of the tiles, and block
// synchronizations, of the element-wise loop below, and each load is a
// whole word; each thread writes its word's changed lanes at its offset
// among the tile's (tile_offset). Bytes past the task's end read as zero in
// both tensors, so no lane there changes.
template <class T>
__device__ __forceinline__ void put_lane(void* to, std::int64_t at, std::uint64_t bits) {
  static_cast<T*>(to)[at] = static_cast<T>(bits);
}

__device__ __forceinline__ void collect_words(const DiffPair& p, const DiffTask& t, std::int64_t next,
                                              int (&warp_total)[kWarps]) {
  const auto* b = static_cast<const unsigned char*>(p.base);
  const auto* g = static_cast<const unsigned char*>(p.target);
  const int eb = p.elem_bytes, per = 8 / eb;
  const std::uint64_t lane_mask = eb == 8 ? ~0ull : (1ull << (8 * eb)) - 1;
  const std::uint64_t end = static_cast<std::uint64_t>(t.begin + t.count) * eb;
  const std::uint64_t first = static_cast<std::uint64_t>(t.begin) * eb / 8, last = s64::words_of(end);
  const WordLoad load;
  for (std::uint64_t tile = first; tile < last; tile += kThreads) {
    const std::uint64_t j = tile + threadIdx.x;
    std::uint64_t x = 0, wt = 0;
    if (j < last) {
      wt = s64::word_at(g, end, j, load);
      x = s64::word_at(b, end, j, load) ^ wt;
    }
    const int c = x != 0 ? gk::detail::changed_lanes(x, eb) : 0;
    int found = 0;
    std::int64_t at = next + numerics::tile_offset<kThreads>(c, warp_total, &found);
    if (c != 0) {
      for (int l = 0; l < per; ++l) {
        if (((x >> (8 * eb * l)) & lane_mask) == 0) continue;
        const std::int64_t i = static_cast<std::int64_t>(j) * per + l;
        if (p.index_bytes == 8) static_cast<long long*>(p.indices)[at] = i;
        else static_cast<int*>(p.indices)[at] = static_cast<int>(i);
        const std::uint64_t v = (wt >> (8 * eb * l)) & lane_mask;
        switch (eb) {
          case 1: put_lane<unsigned char>(p.values, at, v); break;
          case 2: put_lane<unsigned short>(p.values, at, v); break;
          case 4: put_lane<unsigned int>(p.values, at, v); break;
          default: put_lane<unsigned long long>(p.values, at, v); break;
        }
        ++at;
      }
    }
    next += found;
  }
}

__global__ void __launch_bounds__(kThreads)
    diff_collect_kernel(const DiffPair* __restrict__ pairs, const DiffTask* __restrict__ tasks,
                        const std::int64_t* __restrict__ slot) {
  __shared__ int warp_total[kWarps];
  const DiffTask t = tasks[blockIdx.x];
  const DiffPair p = pairs[t.pair];
  if (p.indices == nullptr) return;  // uniform across the block
  std::int64_t next = slot[blockIdx.x];
  if (((reinterpret_cast<std::uintptr_t>(p.base) | reinterpret_cast<std::uintptr_t>(p.target)) & 7u) == 0) {
    collect_words(p, t, next, warp_total);  // (uniform across the block)
    return;
  }
  for (std::uint32_t tile = 0; tile < t.count; tile += kThreads) {
    const std::uint32_t j = tile + threadIdx.x;
    const std::int64_t i = t.begin + j;
    const bool c = j < t.count && changed(p, i);
    int found = 0;
    const std::int64_t at = next + numerics::tile_rank<kThreads>(c, warp_total, &found);
    if (c) {
      if (p.index_bytes == 8) static_cast<long long*>(p.indices)[at] = i;
      else static_cast<int*>(p.indices)[at] = static_cast<int>(i);
      switch (p.elem_bytes) {
        case 1: put<unsigned char>(p.values, at, p.target, i); break;
        case 2: put<unsigned short>(p.values, at, p.target, i); break;
        case 4: put<unsigned int>(p.values, at, p.target, i); break;
        default: put<unsigned long long>(p.values, at, p.target, i); break;
      }
    }
    next += found;
  }
}

}  // namespace

int launch_diff_count(const DiffPair* pairs, const DiffTask* tasks, int task_count, std::int32_t* counts,
                      unsigned long long* sums, void* stream) {
  if (task_count <= 0) return 0;
  diff_count_kernel<<<static_cast<unsigned>(task_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      pairs, tasks, counts, sums);
  return static_cast<int>(cudaGetLastError());
}

int launch_diff_collect(const DiffPair* pairs, const DiffTask* tasks, int task_count, const std::int64_t* slot,
                        void* stream) {
  if (task_count <= 0) return 0;
  diff_collect_kernel<<<static_cast<unsigned>(task_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      pairs, tasks, slot);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
