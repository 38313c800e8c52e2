#include "storage_backups.h"

#include <ATen/ATen.h>

namespace gk {

void StorageBackups::take(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return;
  const void* key = t.storage().unsafeGetStorageImpl();
  for (const Entry& e : entries_)
    if (e.key == key) return;
  at::Tensor bytes = at::empty({0}, t.options().dtype(at::kByte).requires_grad(false));
  bytes.set_(t.storage(), 0, {static_cast<std::int64_t>(t.storage().nbytes())}, {1});
  entries_.push_back({key, bytes, bytes.clone()});
}

void StorageBackups::restore() {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) it->storage.copy_(it->saved);
  entries_.clear();
}

}  // namespace gk
