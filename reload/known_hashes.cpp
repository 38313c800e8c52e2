#include "known_hashes.h"

namespace gk::detail {

void KnownHashes::add(const at::Tensor& t, std::size_t offset, std::size_t nbytes, std::size_t index) {
  const c10::Storage& s = t.storage();
  const void* p = static_cast<const std::byte*>(t.const_data_ptr()) + offset;
  by_data_.insert_or_assign(p, Entry{nbytes, index, s.getWeakStorageImpl(), s.data()});
}

std::optional<std::size_t> KnownHashes::find(const void* p, std::size_t n) const {
  const auto it = by_data_.find(p);
  if (it == by_data_.end() || it->second.nbytes != n) return std::nullopt;
  const c10::intrusive_ptr<c10::StorageImpl> live = it->second.storage.lock();
  if (!live || live->data() != it->second.storage_data) return std::nullopt;
  return it->second.index;
}

}  // namespace gk::detail
