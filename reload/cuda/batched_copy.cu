// The multi-slot copy kernel behind gk::copy_slots: one block per task of at
// most 64 KiB, 16-byte vector loads and stores where both ends are aligned.
#include "reload/cuda/batched_copy.h"

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

__global__ void batched_copy_kernel(const CopyTask* __restrict__ tasks) {
  const CopyTask t = tasks[blockIdx.x];
  std::uint64_t done = 0;
  const auto ends = reinterpret_cast<std::uintptr_t>(t.src) | reinterpret_cast<std::uintptr_t>(t.dst);
  if ((ends & 15u) == 0) {
    const std::uint64_t n16 = t.bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(t.src);
    uint4* d = reinterpret_cast<uint4*>(t.dst);
    for (std::uint64_t i = threadIdx.x; i < n16; i += blockDim.x) d[i] = s[i];
    done = n16 * 16;
  }
  for (std::uint64_t i = done + threadIdx.x; i < t.bytes; i += blockDim.x) t.dst[i] = t.src[i];
}

}  // namespace

int launch_batched_copy(const CopyTask* tasks, std::int64_t count, void* stream) {
  if (count <= 0) return 0;
  batched_copy_kernel<<<static_cast<unsigned>(count), 256, 0, static_cast<cudaStream_t>(stream)>>>(tasks);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
