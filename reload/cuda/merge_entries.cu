// The merge kernel of Note [Merging entries in one launch] (merge_entries.h).
#include "merge_entries.h"

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ void copy_values(const MergeEntry& e, std::int64_t i) {
  static_cast<T*>(e.out_values)[i] = static_cast<const T*>(e.values)[i];
}

__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeEntry* entries, const MergeBlock* blocks) {
  const MergeBlock b = blocks[blockIdx.x];
  const MergeEntry e = entries[b.entry];
  const std::int64_t end = e.count - b.first < kMergeChunk ? e.count : b.first + kMergeChunk;
  for (std::int64_t i = b.first + threadIdx.x; i < end; i += kThreads) {
    const std::int64_t v = (e.index_bytes == 4 ? static_cast<std::int64_t>(static_cast<const std::int32_t*>(e.indices)[i])
                                               : static_cast<const std::int64_t*>(e.indices)[i]) + e.add;
    if (e.out_index_bytes == 4) static_cast<std::int32_t*>(e.out_indices)[i] = static_cast<std::int32_t>(v);
    else static_cast<std::int64_t*>(e.out_indices)[i] = v;
    switch (e.value_bytes) {
      case 1: copy_values<std::uint8_t>(e, i); break;
      case 2: copy_values<std::uint16_t>(e, i); break;
      case 4: copy_values<std::uint32_t>(e, i); break;
      default: copy_values<std::uint64_t>(e, i); break;
    }
  }
}

}  // namespace

int launch_merge_entries(const MergeEntry* entries, const MergeBlock* blocks, std::int64_t block_count, void* stream) {
  if (block_count <= 0) return 0;
  if (block_count > 0x7FFFFFFF) return static_cast<int>(cudaErrorInvalidConfiguration);
  merge_kernel<<<static_cast<unsigned>(block_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(entries, blocks);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
