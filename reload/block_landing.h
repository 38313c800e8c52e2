// reload/block_landing.h: a patch's effect on block-derived members
// (internal to the reload layer; Note [Patches through block derivations]
// in block_landing.cpp).
//
//   std::vector<gk::PatchLanding> ls = ...;                 // the layer's entries, in captured storage
//   gk::land_patch_entries(ls, sp, ...);                    // the parameters' writes
//   std::size_t blocks = gk::land_derived_blocks(lp, ls, sp);  // their derived blocks' writes
#pragma once

#include "patch_landing.h"
#include "patch_stage.h"

#include <graphkeep/reload/slot_plan.h>

#include <cstddef>
#include <vector>

namespace gk {

// The landings of `ls` into the elements of `src` (a contiguous tensor: a
// derivation's source), in src's flat coordinates: int64 indices and their
// values (bits), the landings concatenated; both undefined when none lands there.
struct SourceEntries {
  at::Tensor flat, values;
};
SourceEntries entries_in_source(const at::Tensor& src, const std::vector<PatchLanding>& ls);

// Adds to `sp` a write of `values` (bits of dst's element size, one per
// index) at the flat `index` of `dst` (distinct, any order), and its undo.
void add_indexed_write(StagedPatch& sp, const at::Tensor& dst, const at::Tensor& index, const at::Tensor& values);

// Adds to `sp` the writes (and their undo) that bring the outputs of lp's
// block derivations up to date with the landings `ls` into their sources:
// only the blocks the landings touch are recomputed, from the captured
// source with the landings applied; every block, where a source receives
// at least as many entries as it has blocks (Note [Recomputing every
// block] in block_landing.cpp). Returns the number of blocks recomputed.
// One synchronization per derivation that takes the touched blocks (their
// count and chunks), none for one that takes every block; per output,
// O(touched blocks) memory or at most twice the output, whichever is less,
// and a copy of the source for one that takes every block.
// `chunk_elements` (> 0) replaces the source elements per call of the
// function (testing::EngineHooks::land_chunk_elements).
std::size_t land_derived_blocks(const LayerPlan& lp, const std::vector<PatchLanding>& ls, StagedPatch& sp,
                                std::int64_t chunk_elements = 0);

}  // namespace gk
