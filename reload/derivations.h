// reload/derivations.h: holding declared derivations to their word (internal
// to the reload layer; Note [Declared derivations] in
// graphkeep/registry/role.h).
//
//   // after PWAL, before the copy-back:
//   detail::check_block_derivations(lp, run.current, "nothing was copied", &run.mismatched);  // throws
//   run.from_shapes = detail::launch_from_shapes_check(lp, run.current, run.mismatched);
//   ...
//   detail::finish_from_shapes_check(lp, run.current, run.from_shapes);  // throws DeclarationError
#pragma once

#include "late_bytes.h"

#include <graphkeep/reload/slot_plan.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gk::detail {

// A derived slot of the layer is skipped by a weight patch when its
// declaration says a patch cannot change it (from_shapes).
bool patch_leaves_unchanged(const PlannedSlot& s);

// The block derivation of lp whose output is slot `slot`, or nullptr.
const PlannedDerivation* derivation_of(const LayerPlan& lp, std::size_t slot);
// The layout derivation of lp whose output is slot `slot`, or nullptr.
const PlannedLayout* layout_of(const LayerPlan& lp, std::size_t slot);

// Block derivations' coordinates (graphkeep/model/block_derivation.h): the
// flat source elements of blocks `ids` (row-major over the blocks, each
// block's elements row-major), [ids * bh * bw] int64; and where output `o`
// holds those blocks' values (`elements` for same_as_source, else
// o.per_block indices per block, block by block). A source is
// [nbr * bh, nbc * bw].
at::Tensor block_elements(const at::Tensor& ids, std::int64_t bh, std::int64_t bw, std::int64_t k);
at::Tensor block_output_index(const PlannedDerivation::Output& o, const at::Tensor& ids, const at::Tensor& elements,
                              std::int64_t nbr, std::int64_t nbc);
// The values output `o` of d holds per block.
std::int64_t values_per_block(const PlannedDerivation& d, const PlannedDerivation::Output& o);

// Refuses (gk::DeclarationError, `after` ending the message) what `fn`
// returned for `count` blocks of d when it is not one tensor per output of
// the output's dtype and element count.
void check_block_outputs(const LayerPlan& lp, const PlannedDerivation& d, const std::vector<at::Tensor>& outs,
                         std::int64_t count, std::string_view after);

// Binds the layer's block and layout derivations
// (ReloadableLayer::declare_derivations) to its slots, at prepare(), with the
// fields as captured, and learns each layout's map. Throws
// gk::DeclarationError naming the member for a member declared by_blocks()
// or by_layout() that nothing binds, an output declared otherwise, a source
// that is no checkpoint parameter of the layer, shapes the block shape does
// not tile, or a layout function that computes values instead of moving
// them. A derivation whose output the plan left out (testing hook
// undeclared_members) is dropped, and the members it bound then re-run.
void bind_block_derivations(LayerPlan& lp, const std::vector<std::string>& left_out);

// Recomputes every block derivation of lp over all of its source's blocks
// (in two interleaved halves, in chunks: Note [Checking block derivations in
// chunks] in derivations.cpp), and every layout derivation of its source,
// and compares with the outputs, bit for bit:
// `current` per slot (undefined: the captured tensor; an empty vector: all
// captured). `after` ends the message ("prepare() refused", "nothing was
// copied ..."). Throws gk::DeclarationError naming the class, the member,
// the slot and the first differing element. One synchronization per layer.
// With `mismatched` (per slot), derivations reading or writing a slot whose
// layout PWAL changed are skipped: the pipeline reports those.
void check_block_derivations(const LayerPlan& lp, const std::vector<at::Tensor>& current, std::string_view after,
                             const std::vector<char>* mismatched = nullptr);

// What PWAL built (`current`, per slot of lp; undefined or `mismatched`
// slots are skipped) against what a from_shapes declaration predicts, bit
// for bit: a from_shapes slot must hold what its captured storage holds. In
// two steps, for the layer pipeline: launch_from_shapes_check enqueues the
// copies of both to the host (Note [Comparing on the host] in
// late_bytes.h); finish_from_shapes_check waits for them, compares, and
// throws gk::DeclarationError naming the class, the member, the slot and
// the first differing element.
struct FromShapesCheck {
  std::vector<std::size_t> slots;  // compared: slot j's bytes are 2j (now) and 2j + 1 (captured)
  LateBytes bytes;
};
FromShapesCheck launch_from_shapes_check(const LayerPlan& lp, const std::vector<at::Tensor>& current,
                                         const std::vector<char>& mismatched);
void finish_from_shapes_check(const LayerPlan& lp, FromShapesCheck& check);

}  // namespace gk::detail
