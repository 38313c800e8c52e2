// graphkeep/delta/patch_file.h
//
// Writes and reads patch files: safetensors files in the format of Note
// [Patch format v1] (patch.h), so that any safetensors reader (the Python
// `safetensors` package, huggingface tooling) opens them, and a trainer
// written in Python can produce them (docs/delta.md has the snippet).
//
//   gk::write_patch("step-42.gkpatch.safetensors", patch);
//   gk::Patch p = gk::read_patch("step-42.gkpatch.safetensors");   // validated, zero copy
//   p = p.to(at::kCUDA);
#pragma once

#include <graphkeep/delta/patch.h>

#include <string>

namespace gk {

// Writes `patch` to `path` (tensors on another device are copied to the CPU),
// atomically: a temporary file renamed over `path`, so a reader never sees a
// partial patch. validate_patch runs first: nothing is written for a bad
// patch. gk::WeightError for a bad patch or an I/O failure.
void write_patch(const std::string& path, const Patch& patch);

// Reads and validates the patch file `path` (validate_patch included): the
// header and its agreement with the file's tensors (every entry's tensors
// present with the header's dtype and shape, no other tensor). The entries'
// tensors are CPU tensors over the file's read-only mapping (Note [Zero-copy
// tensors from a mapping] in graphkeep/sources/safetensors_source.h). The
// patch's label is "patch file '<path>'". gk::WeightError naming the file and
// the tensor for any malformed input.
Patch read_patch(const std::string& path);

}  // namespace gk
