// reload/patch_landing.h: how a patch's entries for captured storage become
// the commit's writes and undo (internal to the reload layer; Note [One
// scatter per storage] in patch_landing.cpp).
//
//   std::vector<gk::PatchLanding> ls = ...;   // one per entry: where it lands, its data on that device
//   gk::land_patch_entries(ls, *staged_patch, verify);
#pragma once

#include "patch_stage.h"

#include <graphkeep/delta/patch.h>

#include <ATen/core/Tensor.h>

#include <vector>

namespace gk {

// The storage `t` views, as a key (entries landing in one storage merge).
inline const void* storage_key(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

// One entry of a patch and the captured tensor it writes (contiguous, in
// checkpoint format: the entry's flat indices are its flat indices).
struct PatchLanding {
  at::Tensor dst;
  at::Tensor bits;  // detail::flat_bits(dst): what the writes and the target hash see
  const PatchEntry* entry = nullptr;
  at::Tensor indices, values;  // on dst's device; values as integers of their size; indices undefined: dense
};

// Adds the landings' writes and their undo (the elements they overwrite) to
// `sp`, one item per destination storage where the entries can share one;
// with `verify`, each destination with its name and target hash for
// gk::testing::EngineHooks::verify_served. No host synchronization; a few
// launches per storage, not per entry.
void land_patch_entries(const std::vector<PatchLanding>& ls, StagedPatch& sp, bool verify);

}  // namespace gk
