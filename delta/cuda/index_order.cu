// The kernel of delta/cuda/index_order.h: each block compares its indices
// with their predecessors (the first with the previous block's last), counts
// the pairs out of order, and adds the count with one atomic.
#include "index_order.h"

#include <graphkeep/numerics/block_sum.h>

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ std::int64_t index_at(const OrderEntry& e, std::int64_t i) {
  return e.index_bytes == 4 ? static_cast<std::int64_t>(static_cast<const std::int32_t*>(e.indices)[i])
                            : static_cast<const std::int64_t*>(e.indices)[i];
}

__global__ void __launch_bounds__(kThreads) order_kernel(const OrderEntry* entries, const OrderTask* tasks,
                                                         std::int64_t* out) {
  const OrderTask task = tasks[blockIdx.x];
  const OrderEntry e = entries[task.entry];
  const std::int64_t end = e.count - task.first < kOrderTaskIndices ? e.count : task.first + kOrderTaskIndices;
  std::uint64_t bad = 0;
  for (std::int64_t i = task.first + threadIdx.x; i < end; i += kThreads) {
    if (i == 0) out[3 * task.entry] = index_at(e, 0);
    if (i == e.count - 1) out[3 * task.entry + 1] = index_at(e, i);
    if (i > 0 && index_at(e, i) <= index_at(e, i - 1)) ++bad;
  }
  numerics::add_block_sum<kThreads>(bad, reinterpret_cast<unsigned long long*>(out + 3 * task.entry + 2));
}

}  // namespace

int launch_index_order(const OrderEntry* entries, const OrderTask* tasks, std::int64_t task_count,
                       std::int64_t* out, void* stream) {
  if (task_count <= 0) return 0;
  if (task_count > 0x7FFFFFFF) return static_cast<int>(cudaErrorInvalidConfiguration);
  order_kernel<<<static_cast<unsigned>(task_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(entries, tasks,
                                                                                                       out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
