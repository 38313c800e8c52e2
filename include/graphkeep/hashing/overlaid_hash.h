// graphkeep/hashing/overlaid_hash.h
//
// The content hashes tensors will have after a set of writes, computed from
// their hashes now and the writes, without making the writes, without a
// copy, and without reading the bytes no write covers: a weight patch's stage
// checks each touched tensor's target hash over exactly the bytes its commit
// will write (the sector images and element writes of
// reload/patch_scatter.h), while the served tensors stay as they are.
//
//   const std::vector<gk::HashOverlay> writes = {{flat_dst, indices, values, 2}};
//   const std::vector<std::uint64_t> after = gk::overlaid_content_hashes({w0, w1}, {h0, h1}, writes);
//   // after[i] == gk::content_hash(w_i with the writes made), given h_i == gk::content_hash(w_i)
//
// Note [Hashing through the writes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A patch's stage must know, before anything is served, that its commit
// leaves each touched tensor with the patch's target hash. It once cloned
// every touched tensor, scattered the patch into the clone and hashed the
// clone (at a dense 1 % patch the whole model written once and read twice);
// then it hashed each tensor whole, reading each word through the writes
// that cover it (one read of the whole model for 64 bits per tensor;
// docs/performance.md, "Figures behind the code"). The content hash is now
// a sum of one term per word (Note
// [Content hash: gk-sum64 v1] in content_hash.h), so
//
//   hash(after) = hash(before) + sum over covered words (term(after) - term(before))
//
// and only the covered words are read: the writes' own bytes and the served
// bytes they replace (OverlayLoad::delta in overlay_load.h: a cursor per
// list of writes, from covered word to covered word), O(changed). The writes
// read are the commit's own, so a sector image or element write that held a
// wrong byte fails its tensor's target hash at the stage, before anything is
// served. hash(before) is the caller's: the stage passes the served hash,
// which the patch's base hash was checked against. What the stage no longer
// reads, it no longer checks: bytes of captured storage that a third party
// changed outside the words a patch writes go unseen here, as they do by
// every patch path that writes in place (gk::testing::EngineHooks::
// verify_served hashes the touched tensors again after the commit). Writes
// apply in the order given (where two write one byte, the later one's byte
// counts); a tensor that more than kMaxOverlaySources lists of writes
// overlap is hashed whole from a copy with the writes made (rare: tied
// tensors; not the fast path).
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
  // The caller's promise that no other overlay writes a byte this one
  // writes (sector images: use_sector_images makes them so). Where its
  // writes also cover whole words of a tensor at an 8-byte aligned address,
  // the change is summed write by write, not walked (Note [Exclusive
  // writes] in overlay_load.h). A broken promise gives a hash that matches
  // nothing, never a write.
  bool exclusive = false;
};

// The content hash (content_hash.h) of each tensor's bytes with every
// overlay that overlaps them applied, in order, given `hashes`, each
// tensor's content hash now (the caller's promise, not checked: a wrong one
// gives a hash that matches nothing); an overlay is applied to a tensor of
// its device wherever their bytes meet (by address: an overlay on a whole
// storage applies to the views of it). CUDA tensors of one device: one
// launch and one synchronization; CPU tensors: on the host, the same code.
// gk::WeightError for a tensor content_hash refuses, a count of hashes that
// is not the count of tensors, or an overlay whose dst, indices, values or
// unit do not fit each other (naming its position).
std::vector<std::uint64_t> overlaid_content_hashes(const std::vector<at::Tensor>& tensors,
                                                   const std::vector<std::uint64_t>& hashes,
                                                   const std::vector<HashOverlay>& overlays);

}  // namespace gk
