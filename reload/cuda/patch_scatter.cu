// The scatter kernel behind a patch's commit (Note [Scatter tasks] in
// patch_scatter.h): one block per task, each thread moving elements as
// integers of their size, or halves of whole sectors (Note [Sector images]),
// several loads in flight per thread.
#include "patch_scatter.h"

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <class T, class I>
__device__ void scatter(const ScatterTask& t) {
  T* dst = static_cast<T*>(t.dst);
  const I* idx = static_cast<const I*>(t.indices);
  const T* val = static_cast<const T*>(t.values);
  const std::uint32_t n = t.count;
  std::uint32_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    I k[kUnroll];
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      k[u] = idx[i + u * kThreads];
      v[u] = val[i + u * kThreads];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[k[u]] = v[u];
  }
  for (; i < n; i += kThreads) dst[idx[i]] = val[i];
}

// Note [Sector images] in patch_scatter.h: thread pair (2j, 2j+1) writes
// the two 16-byte halves of sector idx[j]; the images are read coalesced.
template <class I>
__device__ void scatter_sectors(const ScatterTask& t) {
  uint4* dst = static_cast<uint4*>(t.dst);
  const I* idx = static_cast<const I*>(t.indices);
  const uint4* val = static_cast<const uint4*>(t.values);
  const std::uint32_t n = 2 * t.count;  // halves
  std::uint32_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    I k[kUnroll];
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      k[u] = idx[(i + u * kThreads) >> 1];
      v[u] = val[i + u * kThreads];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[2 * static_cast<std::uint64_t>(k[u]) + ((i + u * kThreads) & 1)] = v[u];
  }
  for (; i < n; i += kThreads) dst[2 * static_cast<std::uint64_t>(idx[i >> 1]) + (i & 1)] = val[i];
}

// The mirror of scatter(): values[i] = dst[indices[i]] (a commit's undo,
// read from the served storage at staging).
template <class T, class I>
__device__ void gather(const ScatterTask& t) {
  const T* src = static_cast<const T*>(t.dst);
  const I* idx = static_cast<const I*>(t.indices);
  T* out = static_cast<T*>(const_cast<void*>(t.values));
  const std::uint32_t n = t.count;
  std::uint32_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    I k[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) k[u] = idx[i + u * kThreads];
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[k[u]];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out[i + u * kThreads] = v[u];
  }
  for (; i < n; i += kThreads) out[i] = src[idx[i]];
}

template <bool kGather, class T, class I>
__device__ void move(const ScatterTask& t) {
  if constexpr (kGather) gather<T, I>(t);
  else scatter<T, I>(t);
}

// A task of the scatter or, kGather, of its mirror (elements only).
template <bool kGather, class I>
__device__ void move_by_size(const ScatterTask& t) {
  switch (t.elem_bytes) {
    case 1: move<kGather, unsigned char, I>(t); break;
    case 2: move<kGather, unsigned short, I>(t); break;
    case 4: move<kGather, unsigned int, I>(t); break;
    case 8: move<kGather, unsigned long long, I>(t); break;
    case kSectorBytes:
      if constexpr (!kGather) scatter_sectors<I>(t);
      break;
    default: break;
  }
}

template <bool kGather>
__global__ void __launch_bounds__(kThreads) patch_move_kernel(const __grid_constant__ ScatterBatch batch) {
  const ScatterTask& t = batch.task[blockIdx.x];
  if (t.index_bytes == 8) move_by_size<kGather, long long>(t);
  else move_by_size<kGather, int>(t);
}

template <bool kGather>
int launch(const ScatterBatch& batch, void* stream) {
  if (batch.count <= 0) return 0;
  patch_move_kernel<kGather><<<static_cast<unsigned>(batch.count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_patch_scatter(const ScatterBatch& batch, void* stream) { return launch<false>(batch, stream); }

int launch_patch_gather(const ScatterBatch& batch, void* stream) { return launch<true>(batch, stream); }

}  // namespace gk::cuda
