#include "staging_copies.h"

#include <graphkeep/registry/role.h>

#include <ATen/ATen.h>

namespace gk {

StagingCopies::StagingCopies(const SlotPlan& plan) {
  for (const LayerPlan& lp : plan.layers())
    for (const PlannedSlot& s : lp.slots) {
      if (!s.defined() || !s.captured.has_storage() || s.captured.storage().nbytes() == 0) continue;
      bool& copy = read_[key(s.captured)];
      copy = copy || s.role.effective_init() == Init::copy_new;
    }
}

bool StagingCopies::captured(const at::Tensor& t) const {
  return t.defined() && t.has_storage() && read_.count(key(t)) > 0;
}

void StagingCopies::redirect(const at::Tensor& t) {
  const void* k = key(t);
  auto it = copies_.find(k);
  if (it == copies_.end()) {
    at::Tensor bytes = at::empty({0}, t.options().dtype(at::kByte).requires_grad(false));
    bytes.set_(t.storage(), 0, {static_cast<std::int64_t>(t.storage().nbytes())}, {1});
    const bool read = read_.at(k);
    const at::Tensor copy = read ? bytes.clone() : at::zeros_like(bytes);
    it = copies_.emplace(k, Copy{copy.storage(), read ? copy.clone() : at::Tensor(), copy, bytes}).first;
  }
  at::Tensor view = at::empty({0}, t.options().requires_grad(false));
  view.set_(it->second.storage, t.storage_offset(), t.sizes(), t.strides());
  t.set_data(view);
}

bool StagingCopies::restore_captured(const at::Tensor& t) {
  auto it = copies_.find(key(t));
  if (it == copies_.end() || !it->second.before.defined()) return false;
  it->second.captured.copy_(it->second.before);
  return true;
}

bool StagingCopies::untouched(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  if (untouched_.empty())
    for (const auto& [k, c] : copies_)
      untouched_.emplace(c.storage.unsafeGetStorageImpl(), c.before.defined() && at::equal(c.bytes, c.before));
  auto it = untouched_.find(t.storage().unsafeGetStorageImpl());
  return it != untouched_.end() && it->second;
}

}  // namespace gk
