// reload/storage_backups.h: undo logs kept per captured storage (internal
// to the reload layer).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace gk {

// Note [Undo by storage]
// ~~~~~~~~~~~~~~~~~~~~~~
// Several slots can view one captured storage: an exact alias, a prefix or
// interior view (q, k and v of a fused QKV weight), a strided view. An undo
// log kept per *slot* (the old values of each slot swapped into its new
// tensor) breaks there: the second slot's new tensor may be a view of the
// storage the first swap has just filled with old values, and the second
// copy then writes old values into the captured storage while the report
// says the reload succeeded. So every undo is kept per *storage*: before
// anything of a reload may write a captured storage (PWAL, which may write
// in place into the tensors it is handed, or the commit), the whole storage
// is copied once; a rollback copies each back. Overlap between slots then
// cannot matter, and neither can the order in which slots are restored.
class StorageBackups {
 public:
  // Copies the whole storage of each of `ts` unless this log holds it
  // already (undefined and empty tensors are skipped): a device's storages
  // into one buffer by one launch (gk::copy_slots), their byte views made
  // without dispatch. A MoE layer's PWAL guard saves several small storages
  // (its kernels' stride arrays), and a clone each cost about 15 us of host
  // time (docs/performance.md, "Figures behind the code").
  void take_all(const std::vector<at::Tensor>& ts);
  // Writes every saved storage back (newest first) and forgets them.
  void restore();
  void release() { entries_.clear(); }

 private:
  struct Entry {
    const void* key;
    at::Tensor storage;  // the whole captured storage, as bytes
    at::Tensor saved;    // its contents before the reload wrote it
  };
  std::vector<Entry> entries_;
};

}  // namespace gk
