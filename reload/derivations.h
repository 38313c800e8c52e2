// reload/derivations.h: holding declared derivations to their word (internal
// to the reload layer; Note [Declared derivations] in
// graphkeep/registry/role.h).
//
//   // after PWAL, before the copy-back:
//   detail::check_declared_derivations(lp, run.current, run.mismatched);  // throws DeclarationError
#pragma once

#include <graphkeep/reload/slot_plan.h>

#include <ATen/core/Tensor.h>

#include <vector>

namespace gk::detail {

// A derived slot of the layer is skipped by a weight patch when its
// declaration says a patch cannot change it (from_shapes).
bool patch_leaves_unchanged(const PlannedSlot& s);

// Compares what PWAL built (`current`, per slot of lp; undefined or
// `mismatched` slots are skipped) with what each declared derivation
// predicts, bit for bit: a from_shapes slot must hold what its captured
// storage holds. Throws gk::DeclarationError naming the class, the member,
// the slot and the first differing element. One batched comparison and one
// synchronization per layer, and none for a layer without declarations.
void check_declared_derivations(const LayerPlan& lp, const std::vector<at::Tensor>& current,
                                const std::vector<char>& mismatched);

}  // namespace gk::detail
