// reload/patch_scatter.h: writing a weight patch's changed elements into
// flat tensors, and nothing else (internal to the reload layer). The commit
// of a patch writes captured storage with it; Note [Scatter tasks] in
// reload/cuda/patch_scatter.h describes the CUDA kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace gk {

// One tensor's writes.
struct ScatterItem {
  at::Tensor dst;      // a contiguous 1-D view of the destination, as integers of its element size
  at::Tensor indices;  // 1-D int32 or int64 on dst's device, in range and unique; undefined: dense
  at::Tensor values;   // 1-D, dst's dtype, on dst's device: as long as `indices` (dense: as `dst`)
  // The elements are whole 32-byte sectors (Note [Sector images] in
  // cuda/patch_scatter.h): dst is a 32-byte-aligned region as int64 words
  // (4 per sector), indices number its sectors, values holds each one's
  // complete image (4 words per index).
  bool sectors = false;

  // Bytes written into dst.
  std::size_t bytes() const;
};

// Per item, whether its destination meets another item's, each taken as
// the aligned `grain`-byte units it spans (1: bytes; 8: the words of Note
// [Exclusive writes] in graphkeep/hashing/overlay_load.h).
std::vector<char> destinations_meeting(const std::vector<ScatterItem>& items, std::uintptr_t grain);

// Bytes that new allocations on `device` can take: the driver's free
// memory and what the caching allocator holds unallocated (0 on the CPU
// and in builds without CUDA).
std::size_t device_headroom(c10::Device device);

// dst[indices[i]] = values[i] for every item (dense: dst = values). CUDA
// items go through the scatter kernel on each device's current stream (one
// launch per 1,000 tasks of at most 16,384 elements; dense items through
// gk::copy_slots), CPU items through at::parallel_for. Does not wait for
// the device.
void scatter_items(const std::vector<ScatterItem>& items);

// Fills the undefined `values` of the sparse items with what their
// destinations hold at their indices (a commit's undo): on a CUDA device one
// buffer and one launch (per 1,000 tasks) for all of them, on the current
// stream; on the CPU index_select. Does not wait for the device.
void gather_items(std::vector<ScatterItem>& items);

// Waits for the current stream of every device the items' destinations are on.
void wait_for(const std::vector<ScatterItem>& items);

}  // namespace gk
