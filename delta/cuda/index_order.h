// delta/cuda/index_order.h: the range and order of many index tensors in
// one kernel launch (internal to the delta layer; no torch here).
// validate_patch drives it (Note [Validating indices in one pass] in
// delta/patch.cpp).
#pragma once

#include <cstdint>

namespace gk::cuda {

// Indices one block reads at most.
inline constexpr std::int64_t kOrderTaskIndices = std::int64_t{1} << 16;

// One tensor of indices: `count` (> 0) of index_bytes each.
struct OrderEntry {
  const void* indices = nullptr;
  std::int64_t count = 0;
  std::int64_t index_bytes = 0;  // 4 (int32) or 8 (int64)
};

// One block's work: indices [first, first + kOrderTaskIndices) of `entry`.
struct OrderTask {
  std::int64_t first = 0;
  std::int64_t entry = 0;
};

// Per entry e, out[3e] = its first index, out[3e + 1] its last, and
// out[3e + 2] (zeroed by the caller) the number of neighbour pairs
// (i - 1, i) of e with indices[i] <= indices[i - 1]. One launch on
// `stream`; every pointer is device memory. Returns the cudaError_t as an
// int (0 on success).
int launch_index_order(const OrderEntry* entries, const OrderTask* tasks, std::int64_t task_count,
                       std::int64_t* out, void* stream);

}  // namespace gk::cuda
