// graphkeep/delta/apply_patch.h
//
// Applies a patch to a set of named tensors in checkpoint coordinates, with
// every check the format allows done before anything is written, and the
// result checked against the patch's target hashes. The reference for any
// faster application (a reload engine applying patches through derived
// tensors is tested against this).
//
//   gk::Patch p = gk::read_patch("step-42.gkpatch.safetensors");
//   gk::check_patch(p, model_expectations);                     // names, shapes, dtypes; nothing read
//   std::vector<gk::NamedTensor> next = gk::apply_patch(p, weights);   // out of place
//   gk::apply_patch_in_place(p, weights);                       // or into the tensors themselves
//
// Note [Apply is transactional]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Before the first write: validate_patch (format, index ranges and order,
// computed on the patch's device with no device-side assert), every entry
// names a given tensor whose shape and dtype agree, and (verify_base) the
// content hashes of the base tensors equal the entries' base hashes (one
// batched hash per device). Then the entries are applied; afterwards
// (verify_target) the touched tensors are hashed again and must equal the
// target hashes. Out of place, a failure leaves nothing behind (the inputs
// are never written). In place, the elements an entry overwrites are saved
// first (a gather of the indexed elements; a copy of the tensor for a dense
// entry) and restored if anything fails after the first write, a target hash
// mismatch included, so the tensors end bitwise as they were. Either way the
// error is a gk::WeightError naming the patch and the tensor.
#pragma once

#include <graphkeep/delta/patch.h>
#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/sources/weight_source.h>

#include <vector>

namespace gk {

struct ApplyPatchOptions {
  // Check the base tensors' content hashes before writing.
  bool verify_base = true;
  // Check the results' content hashes after writing (and roll back in place).
  bool verify_target = true;
};

// validate_patch, then every entry against `expected` (a model's checkpoint
// tensors: name, shape, dtype): an entry naming a tensor not in `expected`,
// or whose shape or dtype differ, is a gk::WeightError naming the patch and
// the tensor. Reads no tensor data besides the patch's indices.
void check_patch(const Patch& patch, const std::vector<ExpectedTensor>& expected);

// The tensors after the patch, in the order of `base`: a touched tensor is a
// new contiguous tensor on its base tensor's device; an untouched one is the
// base tensor itself (not a copy). `base` is never written. Note [Apply is
// transactional].
std::vector<NamedTensor> apply_patch(const Patch& patch, const std::vector<NamedTensor>& base,
                                     const ApplyPatchOptions& options = {});

// Writes the patch into the tensors themselves (each touched one must be
// contiguous); on any failure they are restored bitwise. Note [Apply is
// transactional].
void apply_patch_in_place(const Patch& patch, const std::vector<NamedTensor>& tensors,
                          const ApplyPatchOptions& options = {});

}  // namespace gk
