// reload/sector_images.h: a weight patch's element writes as writes of whole
// 32-byte sectors (Note [Sector images] in cuda/patch_scatter.h), made at
// staging so that the commit writes sectors without reading them back
// (internal to the reload layer).
#pragma once

#include "patch_scatter.h"

#include <cstddef>
#include <functional>
#include <vector>

namespace gk {

// The writes of `items` (each sparse, element form, indices ascending) as
// whole sectors: per item, a sector item for the changed elements in the
// 32-byte-aligned interior of item.dst, and element items for those in the
// partial sectors at its ends (when any: slices of the item's own indices and
// values), in the items' order. Each image is
// dst's current bytes with the values applied, so the result is exact only
// while dst holds what it holds now: a staged patch's commit is refused when
// the served weights changed since staging. An item with no whole sector to
// write comes back as it is. O(changed) work and memory. On a CUDA device two
// launches and one synchronization for all its items (Note [Sector images on
// the device] in cuda/sector_images.h); on the CPU, tensor operations in
// three passes (Note [Sector images in three passes] in sector_images.cpp).
std::vector<ScatterItem> sector_images(const std::vector<ScatterItem>& items);

// At most the bytes sector_images allocates for `item` (32 per touched sector
// and its index; a sector per changed element, or every whole sector of
// dst, whichever is fewer). 0 for an item it would not convert.
std::size_t sector_image_bytes_bound(const ScatterItem& item);

// Rewrites `items` with sector_images() where `use(item)` says so and the
// item's destination bytes overlap no other item's (two tensors sharing bytes
// keep element writes, which cannot overwrite each other's changes).
void use_sector_images(std::vector<ScatterItem>& items, const std::function<bool(const ScatterItem&)>& use);

}  // namespace gk
