// graphkeep/delta/make_patch.h
//
// Makes the patch from one version of a checkpoint to the next: a bitwise
// comparison of every tensor, done where the tensors are (a trainer's GPU
// compares and extracts the changed indices on the device).
//
//   std::vector<gk::NamedTensor> before = ..., after = ...;   // same names, shapes, dtypes
//   gk::Patch p = gk::make_patch(before, after, {.base_version = "step-41", .target_version = "step-42"});
//   gk::write_patch("step-42.gkpatch.safetensors", p);
//
// Note [Changed means different bits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An element has changed when its bits differ: the tensors are compared as
// integers of their element size, so 0.0 -> -0.0 and one NaN payload ->
// another are changes (a numeric comparison would drop them, and the target
// hash would then refuse the result), and NaN -> the same NaN is none. Each
// tensor's entry is sparse unless its indices and values would take more
// bytes than the whole tensor, then dense (MakePatchOptions::encoding forces
// either). A tensor with no change gets no entry unless record_unchanged.
#pragma once

#include <graphkeep/delta/patch.h>
#include <graphkeep/sources/weight_source.h>

#include <string>
#include <vector>

namespace gk {

struct MakePatchOptions {
  std::string base_version = {};  // (initialized: designated initializers may leave them out)
  std::string target_version = {};
  enum class Encoding : std::uint8_t { automatic, sparse, dense };
  Encoding encoding = Encoding::automatic;
  // An entry (sparse, no element) for each unchanged tensor too, so that
  // applying the patch checks the base hash of every tensor.
  bool record_unchanged = false;
  // Dense entries hold the target tensor itself (when it is contiguous and on
  // the patch's device) instead of a copy: no copy of the largest entries,
  // but the patch then changes if the target tensor is written. For tools
  // that read the target from a file; a trainer that goes on updating its
  // weights keeps the default.
  bool share_dense = false;
};

// The patch from `base` to `target`: the same names (in any order; no name
// twice, shard 0), and for each name the same shape, dtype and device. The
// patch's tensors are on the tensors' device; hashes are computed there too
// (on a CUDA device in the same read as the comparison; on the host, one
// batched content_hashes call for both sides). gk::WeightError naming the
// tensor when the two sets disagree or a dtype has no safetensors name.
Patch make_patch(const std::vector<NamedTensor>& base, const std::vector<NamedTensor>& target,
                 const MakePatchOptions& options = {});

}  // namespace gk
