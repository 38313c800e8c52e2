// reload/patch_scatter.h: writing a weight patch's changed elements into
// flat tensors, and nothing else (internal to the reload layer). The commit
// of a patch writes captured storage with it; Note [Scatter tasks] in
// reload/cuda/patch_scatter.h describes the CUDA kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
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

// The writes of `items` (each sparse, element form, indices ascending) as
// whole sectors: per item, a sector item for the changed elements in the
// 32-byte-aligned interior of item.dst, and an element item for those in the
// partial sectors at its ends (when any), in the items' order. Each image is
// dst's current bytes with the values applied, so the result is exact only
// while dst holds what it holds now: a staged patch's commit is refused when
// the served weights changed since staging. An item with no whole sector to
// write comes back as it is. O(changed) work and memory; two
// synchronizations per device for all the items (the split at the whole
// sectors' edges, the count of touched sectors; Note [Sector images in three
// passes] in patch_scatter.cpp).
std::vector<ScatterItem> sector_images(const std::vector<ScatterItem>& items);

// At most the bytes sector_images allocates for `item` (32 per touched sector
// and its index; a sector per changed element, or every whole sector of
// dst, whichever is fewer). 0 for an item it would not convert.
std::size_t sector_image_bytes_bound(const ScatterItem& item);

// Bytes that new allocations on `device` can take: the driver's free
// memory and what the caching allocator holds unallocated (0 on the CPU
// and in builds without CUDA).
std::size_t device_headroom(c10::Device device);

// Rewrites `items` with sector_images() where `use(item)` says so and the
// item's destination bytes overlap no other item's (two tensors sharing bytes
// keep element writes, which cannot overwrite each other's changes).
void use_sector_images(std::vector<ScatterItem>& items, const std::function<bool(const ScatterItem&)>& use);

// dst[indices[i]] = values[i] for every item (dense: dst = values). CUDA
// items go through the scatter kernel on each device's current stream (one
// launch per 1,000 tasks of at most 16,384 elements; dense items through
// gk::copy_slots), CPU items through at::parallel_for. Does not wait for
// the device.
void scatter_items(const std::vector<ScatterItem>& items);

// Waits for the current stream of every device the items' destinations are on.
void wait_for(const std::vector<ScatterItem>& items);

}  // namespace gk
