// reload/copied_from.h: where a layer's loaded bytes were copied from, byte
// for byte, so that a content hash of the source covers them too (internal
// to the reload layer; Note [Hashes of verbatim copies]).
//
//   detail::CopiedFrom copied;
//   copied.add(dst_ptr, src_ptr, nbytes);              // as each load copies
//   if (const void* s = copied.source_of(p, n)) ...    // the source's bytes for [p, p + n)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gk::detail {

// Note [Hashes of verbatim copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A streaming reload from a resident source scans and hashes the source's
// tensors before its first copy (Note [Scanning a resident source first]
// in weight_stream.cpp), and the layers' loads then hash what they loaded
// (Note [Patch landings] in layer_record.h). An adopted tensor is the
// source's own, so its hash is found by address (KnownHashes). A tensor
// the load copied -- a MoE's experts into their stacked parameter, or any
// tensor with adopt_source_tensors off -- used to be read a second time
// (docs/performance.md, "The copied path"). Where the copy moves bytes and
// nothing else (BatchedLoads, or a whole parameter's copy_ between two
// contiguous tensors of one dtype), the loaded bytes are the source's bytes,
// so the layer records each such copy here, and the loaded range's hash is
// the scan's hash of the range it came from. A range no single recorded
// copy covers, or one that two recorded copies wrote, is hashed as before.
class CopiedFrom {
 public:
  // The n bytes at `to` were copied verbatim from the n bytes at `from`.
  void add(const void* to, const void* from, std::size_t n);
  // Where the n bytes at p came from: the matching bytes of one recorded
  // copy's source, or nullptr.
  const void* source_of(const void* p, std::size_t n) const;
  bool empty() const noexcept { return copies_.empty(); }

 private:
  struct Copy {
    std::uintptr_t to, from;
    std::size_t n;
    bool overlapped;  // another copy wrote some of these bytes
  };
  // Sorts by destination and marks the overlaps (once after the adds).
  void sort() const;
  mutable std::vector<Copy> copies_;
  mutable bool sorted_ = true, in_order_ = true;
};

}  // namespace gk::detail
