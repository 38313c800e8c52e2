// reload/layout_landing.h: a patch's effect on layout-derived members
// (internal to the reload layer; Note [Patches through layout derivations]
// in layout_landing.cpp).
//
//   std::vector<gk::PatchLanding> ls = ...;                   // the layer's entries, in captured storage
//   gk::land_patch_entries(ls, sp, ...);                      // the parameters' writes
//   std::size_t moved = gk::land_layout_elements(lp, ls, sp);  // where the layouts put those elements
#pragma once

#include "patch_landing.h"
#include "patch_stage.h"

#include <graphkeep/reload/slot_plan.h>

#include <cstddef>
#include <vector>

namespace gk {

// Adds to `sp` the writes (and their undo) that bring the outputs of lp's
// layout derivations up to date with the landings `ls` into their sources:
// each changed source element is written wherever the layout put it.
// Returns the number of output elements written. One synchronization per
// layer with touched layouts; O(changed elements) memory and work.
std::size_t land_layout_elements(const LayerPlan& lp, const std::vector<PatchLanding>& ls, StagedPatch& sp);

}  // namespace gk
