// graphkeep/hashing/overlaid_hash.h
//
// The content hashes tensors will have after a set of writes, computed from
// the bytes they hold now and the writes, without making the writes and
// without a copy: a weight patch's stage checks each touched tensor's target
// hash over exactly the bytes its commit will write (the sector images and
// element writes of reload/patch_scatter.h), while the served tensors stay
// as they are.
//
//   const std::vector<gk::HashOverlay> writes = {{flat_dst, indices, values, 2}};
//   const std::vector<std::uint64_t> after = gk::overlaid_content_hashes({w0, w1}, writes);
//   // after[i] == gk::content_hash(w_i with the writes made)
//
// Note [Hashing through the writes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A patch's stage used to clone every touched tensor, scatter the patch into
// the clone and hash the clone: at a dense 1 % patch that is the whole
// model written once and read twice (a clone per tensor, then the hash),
// with a launch or two per tensor, to learn one 64-bit number per tensor.
// The hash reads its input once, in ascending address order, a word at a
// time (Note [One quad of threads per block]); a read can as well take each
// word from the write that covers it, if any (OverlayLoad in overlay_load.h:
// a cursor per list of writes, advanced as the addresses ascend). So one
// launch hashes every touched tensor as it will be, reading the served bytes
// once and each write's bytes once, and the writes it reads are the commit's
// own: a sector image that held a wrong byte would fail its tensor's target
// hash at the stage, before anything is served. Writes apply in the order
// given (where two write one byte, the later one's byte counts); a tensor
// that more than kMaxOverlaySources lists of writes overlap is hashed from
// a copy with the writes made (rare: tied tensors; not the fast path).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace gk {

// One list of writes, each `unit` bytes: write k puts bytes
// [k * unit, (k + 1) * unit) of `values` at byte indices[k] * unit of
// `dst`. The indices ascend strictly (the caller's promise: the writes of a
// validated patch, or sector images; not checked, and a violation gives a
// hash that matches nothing, never a write).
struct HashOverlay {
  at::Tensor dst;      // contiguous, on the device of the tensors it overlaps
  at::Tensor indices;  // 1-D, int32 or int64, contiguous, each < dst.nbytes() / unit
  at::Tensor values;   // contiguous, indices.numel() * unit bytes
  int unit = 0;        // 1, 2, 4, 8 or 32
};

// The content hash (content_hash.h) of each tensor's bytes with every
// overlay that overlaps them applied, in order; an overlay is applied to a
// tensor of its device wherever their bytes meet (by address: an overlay on
// a whole storage applies to the views of it). CUDA tensors of one device:
// one launch and one synchronization; CPU tensors: on the host, the same
// code. gk::WeightError for a tensor content_hash refuses, or an overlay
// whose dst, indices, values or unit do not fit each other (naming its
// position).
std::vector<std::uint64_t> overlaid_content_hashes(const std::vector<at::Tensor>& tensors,
                                                   const std::vector<HashOverlay>& overlays);

}  // namespace gk
