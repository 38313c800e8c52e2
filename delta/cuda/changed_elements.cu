// The two kernels of Note [Changed elements on the device]
// (delta/changed_elements.cpp).
#include "changed_elements.h"

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

__global__ void __launch_bounds__(kThreads)
    diff_count_kernel(const DiffPair* __restrict__ pairs, const DiffTask* __restrict__ tasks,
                      std::int32_t* __restrict__ counts) {
  __shared__ int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  const DiffTask t = tasks[blockIdx.x];
  const DiffPair p = pairs[t.pair];
  int n = 0;
  for (std::uint32_t j = threadIdx.x; j < t.count; j += kThreads) n += changed(p, t.begin + j);
  for (int o = 16; o > 0; o >>= 1) n += __shfl_down_sync(0xffffffffu, n, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(&total, n);
  __syncthreads();
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads)
    diff_collect_kernel(const DiffPair* __restrict__ pairs, const DiffTask* __restrict__ tasks,
                        const std::int64_t* __restrict__ slot) {
  __shared__ int warp_total[kWarps];
  const DiffTask t = tasks[blockIdx.x];
  const DiffPair p = pairs[t.pair];
  if (p.indices == nullptr) return;  // uniform across the block
  std::int64_t next = slot[blockIdx.x];
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
                      void* stream) {
  if (task_count <= 0) return 0;
  diff_count_kernel<<<static_cast<unsigned>(task_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      pairs, tasks, counts);
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
