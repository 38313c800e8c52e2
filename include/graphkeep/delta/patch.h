// graphkeep/delta/patch.h
//
// A weight patch: what changed between two versions of a checkpoint, in
// checkpoint coordinates (checkpoint tensor names, flat row-major element
// indices, values in the checkpoint dtype). An RL trainer's step changes 1-2%
// of a bf16 model's elements; a patch carries those and nothing else, plus
// the content hashes that pin it to the bytes it was made from and for.
//
//   gk::Patch p = gk::make_patch(old_weights, new_weights, {.base_version = "step-41",
//                                                           .target_version = "step-42"});
//   gk::write_patch("step-42.gkpatch.safetensors", p);        // patch_file.h
//   gk::Patch q = gk::read_patch("step-42.gkpatch.safetensors");
//   gk::apply_patch_in_place(q, engine_weights);              // apply_patch.h
//
// A Patch is the in-memory form of the format (Note [Patch format v1]); its
// tensors live on any one device: CPU tensors over the file's mapping when
// read from a file, CUDA tensors when a trainer makes it on its GPU.
//
// Note [Patch format v1]
// ~~~~~~~~~~~~~~~~~~~~~~
// A patch file is a safetensors file (any safetensors reader opens it). Its
// "__metadata__" holds the key "gk_patch", whose value is a JSON object (the
// header):
//
//   {"format": "gk-patch", "version": 1,
//    "base": "<base version id>", "target": "<target version id>",
//    "hash": "gk-sum64 v1",
//    "tensors": {"<name>": {"dtype": "BF16", "shape": [4096, 4096],
//                           "encoding": "sparse", "count": 1234,
//                           "base_hash": "<16 hex digits>", "target_hash": "<16 hex digits>"}, ...}}
//
// with one member per checkpoint tensor the patch touches. "dtype" (a
// safetensors dtype name) and "shape" are the checkpoint tensor's;
// "base_hash" and "target_hash" are the content hashes ("hash" names the
// function, graphkeep/hashing/content_hash.h) of its bytes before and after.
// "count" is the number of elements the entry stores. The entry's data are
// the file's tensors
//   encoding "sparse":  <name>::indices  I32 when the tensor has fewer than
//                                        2^31 elements, else I64; shape [count];
//                                        flat row-major element indices,
//                                        strictly ascending, in [0, numel)
//                       <name>::values   the checkpoint dtype, shape [count]:
//                                        the target's elements at those indices
//   encoding "dense":   <name>::dense    the checkpoint dtype and shape: the
//                                        whole target tensor (count = numel)
// and the file holds no other tensor. Other "__metadata__" keys are ignored;
// a v1 reader rejects unknown members of the header and of its entries, and a
// version other than 1 (a later format changes the version). An entry may
// store no element (sparse, count 0): it only pins the tensor's base hash.
// Names are non-empty and contain no "::". Applying an entry sets
// target.flatten()[indices[i]] = values[i] (sparse) or target = dense, to a
// tensor whose content hash is base_hash; the result's must be target_hash.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gk {

// The format version this graphkeep writes and reads.
inline constexpr int kPatchFormatVersion = 1;
// The "__metadata__" key holding the header.
inline constexpr std::string_view kPatchMetadataKey = "gk_patch";
// Name suffixes of an entry's tensors in the file.
inline constexpr std::string_view kPatchIndicesSuffix = "::indices";
inline constexpr std::string_view kPatchValuesSuffix = "::values";
inline constexpr std::string_view kPatchDenseSuffix = "::dense";

enum class PatchEncoding : std::uint8_t { sparse, dense };

// "sparse" or "dense".
std::string_view patch_encoding_name(PatchEncoding encoding);

// The index dtype of a sparse entry for a tensor of `numel` elements: kInt
// below 2^31 elements, kLong from there.
at::ScalarType patch_index_dtype(std::int64_t numel);

// One checkpoint tensor the patch touches.
struct PatchEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  PatchEncoding encoding = PatchEncoding::sparse;
  std::uint64_t base_hash = 0;
  std::uint64_t target_hash = 0;
  // sparse: 1-D, patch_index_dtype(numel()), strictly ascending, in [0, numel()).
  // dense: undefined.
  at::Tensor indices;
  // sparse: 1-D, `dtype`, as long as `indices`. dense: `dtype` and `shape`.
  at::Tensor values;

  std::int64_t numel() const;
  // Elements stored: indices.numel() (sparse) or numel() (dense).
  std::int64_t count() const;
  // Bytes of indices and values.
  std::size_t payload_bytes() const;
};

struct Patch {
  int version = kPatchFormatVersion;
  std::string base_version;
  std::string target_version;
  // Sorted by name, one per tensor.
  std::vector<PatchEntry> entries;
  // Names the patch in errors: "patch file '<path>'" (read_patch) or
  // "in-memory patch '<base>' -> '<target>'" (make_patch).
  std::string label;

  // The entry named `name`, or nullptr.
  const PatchEntry* find(std::string_view name) const;
  // Bytes of every entry's indices and values.
  std::size_t payload_bytes() const;
  // The same patch with every tensor on `device` (a copy where it is elsewhere).
  Patch to(c10::Device device) const;
};

// Checks that `patch` is well formed (Note [Patch format v1]) before anything
// is written with it: the version; entries sorted by unique names without
// "::"; each entry's dtype (one the safetensors format has), shape, index
// dtype, tensor ranks, lengths and devices; and, computed where the tensors
// are (on the device: reductions, then one copy of a few numbers per device
// to the host; never a device-side assert), every index within [0, numel)
// and strictly ascending. gk::WeightError naming the patch (its label) and
// the tensor.
void validate_patch(const Patch& patch);

}  // namespace gk
