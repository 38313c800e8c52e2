#include "storage_backups.h"

#include <graphkeep/reload/copy_slots.h>

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>

namespace gk {
namespace {

// `nbytes` bytes of `storage` from byte `offset`, as a 1-D byte tensor made
// without dispatch (Note [Views without dispatch] in
// graphkeep/delta/detail/element_bits.h); `like` gives the dispatch keys.
at::Tensor byte_view(const c10::Storage& storage, std::int64_t offset, std::int64_t nbytes, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(storage), like.key_set(),
                                                   c10::scalarTypeToTypeMeta(at::kByte));
  impl->set_sizes_contiguous({nbytes});
  impl->set_storage_offset(offset);
  return at::Tensor(std::move(impl));
}

bool savable(const at::Tensor& t) { return t.defined() && t.has_storage() && t.storage().nbytes() > 0; }

}  // namespace

void StorageBackups::take_all(const std::vector<at::Tensor>& ts) {
  std::vector<const at::Tensor*> fresh;  // each storage once, none held already
  auto held = [&](const void* key) {
    return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.key == key; }) ||
           std::any_of(fresh.begin(), fresh.end(),
                       [&](const at::Tensor* f) { return f->storage().unsafeGetStorageImpl() == key; });
  };
  for (const at::Tensor& t : ts)
    if (savable(t) && !held(t.storage().unsafeGetStorageImpl())) fresh.push_back(&t);
  if (fresh.empty()) return;
  // Per device, one buffer: each storage at a 16-byte boundary (the batched
  // copy's vector loads).
  struct Buffer {
    c10::Device device;
    std::int64_t bytes = 0;
    at::Tensor values;
    std::int64_t next = 0;  // the next free byte
  };
  std::vector<Buffer> buffers;  // (a few devices at most)
  auto buffer_of = [&](c10::Device d) -> Buffer& {
    for (Buffer& b : buffers)
      if (b.device == d) return b;
    return buffers.emplace_back(Buffer{d, 0, at::Tensor(), 0});
  };
  auto padded = [](const at::Tensor* t) { return (static_cast<std::int64_t>(t->storage().nbytes()) + 15) / 16 * 16; };
  for (const at::Tensor* t : fresh) buffer_of(t->device()).bytes += padded(t);
  for (Buffer& b : buffers) b.values = at::empty({b.bytes}, at::TensorOptions().dtype(at::kByte).device(b.device));
  std::vector<at::Tensor> dst, src;
  dst.reserve(fresh.size());
  src.reserve(fresh.size());
  for (const at::Tensor* t : fresh) {
    const auto nbytes = static_cast<std::int64_t>(t->storage().nbytes());
    Buffer& b = buffer_of(t->device());
    at::Tensor bytes = byte_view(t->storage(), 0, nbytes, *t);
    at::Tensor saved = byte_view(b.values.storage(), b.next, nbytes, b.values);
    b.next += padded(t);
    dst.push_back(saved);
    src.push_back(bytes);
    entries_.push_back({t->storage().unsafeGetStorageImpl(), std::move(bytes), std::move(saved)});
  }
  copy_slots(dst, src);
}

void StorageBackups::restore() {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) it->storage.copy_(it->saved);
  entries_.clear();
}

}  // namespace gk
