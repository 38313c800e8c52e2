// The multi-slot copy kernel behind gk::copy_slots: one block per task of at
// most kCopyChunk bytes, the task list passed by value as the kernel's parameter (Note
// [Copy tasks travel as kernel parameters] in batched_copy.h), 16-byte
// vector loads and stores where both ends are aligned, four in flight per
// thread.
#include "batched_copy.h"

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// The first tasks of a CopyBatch, for a launch of few: the launch's cost grows
// with its parameter's bytes (Note [Small batches travel small]).
struct SmallCopyBatch {
  const unsigned char* src[kSmallTasks];
  unsigned char* dst[kSmallTasks];
  std::uint32_t bytes[kSmallTasks];
};

template <class Batch>
__global__ void __launch_bounds__(kThreads) batched_copy_kernel(const __grid_constant__ Batch batch) {
  const unsigned char* src = batch.src[blockIdx.x];
  unsigned char* dst = batch.dst[blockIdx.x];
  const std::uint32_t bytes = batch.bytes[blockIdx.x];
  std::uint32_t done = 0;
  if (((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15u) == 0) {
    const std::uint32_t n16 = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    std::uint32_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kThreads < n16; i += kUnroll * kThreads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * kThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = v[u];
    }
    for (; i < n16; i += kThreads) d[i] = s[i];
    done = n16 * 16;
  }
  for (std::uint32_t i = done + threadIdx.x; i < bytes; i += kThreads) dst[i] = src[i];
}

}  // namespace

int launch_batched_copy(const CopyBatch& batch, void* stream) {
  if (batch.count <= 0) return 0;
  const auto blocks = static_cast<unsigned>(batch.count);
  const auto s = static_cast<cudaStream_t>(stream);
  if (batch.count <= kSmallTasks) {
    SmallCopyBatch small;
    for (int i = 0; i < batch.count; ++i) {
      small.src[i] = batch.src[i];
      small.dst[i] = batch.dst[i];
      small.bytes[i] = batch.bytes[i];
    }
    batched_copy_kernel<SmallCopyBatch><<<blocks, kThreads, 0, s>>>(small);
  } else {
    batched_copy_kernel<CopyBatch><<<blocks, kThreads, 0, s>>>(batch);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
