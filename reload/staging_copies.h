// reload/staging_copies.h: copies of the captured storages that a stage()
// hands to PWAL (internal to the reload layer).
#pragma once

#include <graphkeep/reload/slot_plan.h>

#include <ATen/core/Tensor.h>

#include <unordered_map>

namespace gk {

// Note [Staging copies]
// ~~~~~~~~~~~~~~~~~~~~~
// stage() must not write a byte of any captured storage, yet PWAL may write
// in place into every captured tensor it can reach (a declared member, a
// buffer it does not load, a view of a parameter's storage; Note [Undo by
// storage]). So before a layer's PWAL every location of its slots -- the
// module's parameter or buffer, every declared path -- that still points at
// a captured storage is pointed (set_data, so every holder of that handle
// follows) at the same view of a *copy* of that whole storage. One copy per
// storage for the whole stage: slots viewing one storage (alias, prefix,
// interior, strided, tied across layers) keep viewing one storage, so the
// layout and alias checks see what a reload would. The copy holds the old
// values where a slot of that storage is copy_new (graphs read weights and
// never write them, so copying them races with nothing; a buffer the graphs
// write must be declared zero or preserve); a storage whose slots are all zero or
// preserve (lock workspaces, scratch: the graphs write them while they
// replay) is copied as zeros instead of read, its value being the init
// policy's business. After the checks every post-PWAL tensor must lie
// outside the captured storages (else PWAL reached one through a handle that
// is no slot location and may have written what the graphs read: stage()
// refuses, writing the old values back from the copy of that storage, or,
// without one, refusing replay until a reload), the fields are pointed back at
// the captured tensors, and the post-PWAL tensors are the staged tensors.
// A copy PWAL left bitwise as it was (compared with a second copy taken with
// it, freed when stage() returns) is not staged: its slots commit "in place",
// as a reload commits a tensor PWAL did not touch, so a buffer the graphs
// write (a cache) is not reverted to its value at stage() time. Plain modules
// have no PWAL: nothing of theirs is redirected.
class StagingCopies {
 public:
  explicit StagingCopies(const SlotPlan& plan);
  // True when t views one of the plan's captured storages.
  bool captured(const at::Tensor& t) const;
  // Points t (one handle: a module tensor or a declared field) at the same
  // view of its storage's copy.
  void redirect(const at::Tensor& t);
  // Writes the captured values saved with the copy of t's (captured) storage
  // back into it; false when there is no such copy of its values.
  bool restore_captured(const at::Tensor& t);
  // After PWAL: true when t views a copy of captured values that PWAL left
  // bitwise unchanged.
  bool untouched(const at::Tensor& t);

 private:
  static const void* key(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }
  struct Copy {
    at::Storage storage;  // what PWAL is handed
    at::Tensor before;    // its bytes as copied (undefined for a zero-filled copy)
    at::Tensor bytes;     // `storage` as bytes
    at::Tensor captured;  // the captured storage, as bytes
  };
  std::unordered_map<const void*, bool> read_;  // captured storage -> copy its values (else zeros)
  std::unordered_map<const void*, Copy> copies_;
  std::unordered_map<const void*, bool> untouched_;  // per copy's storage, filled after the last PWAL
};

}  // namespace gk
