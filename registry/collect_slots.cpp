// Groups the tensor locations of one walk into slots (aliases merged).
#include <graphkeep/registry/for_each_slot.h>

#include <c10/core/TensorImpl.h>

#include <unordered_map>

namespace gk {

bool same_region(const at::Tensor& a, const at::Tensor& b) noexcept {
  if (!a.defined() || !b.defined()) return false;
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return true;
  if (!a.has_storage() || !b.has_storage()) return false;
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset() && a.sizes().equals(b.sizes()) &&
         a.strides().equals(b.strides()) && a.scalar_type() == b.scalar_type();
}

namespace {

class SlotCollector final : public Walker {
 public:
  explicit SlotCollector(SlotFilter filter) : filter_(filter) {}

  void tensor(const SlotPath& path, const RoleSpec& role, std::string_view owner,
              at::Tensor& t) override {
    if (filter_ == SlotFilter::graph_visible && !role.graph_visible()) return;
    if (t.defined()) {
      // Aliases: the same TensorImpl, or a coinciding view of the same storage.
      const void* key = t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl())
                                        : static_cast<const void*>(t.unsafeGetTensorImpl());
      auto range = by_storage_.equal_range(key);
      for (auto it = range.first; it != range.second; ++it) {
        Slot& s = slots_[it->second];
        if (!same_region(*s.tensor, t)) continue;
        GK_CHECK(DeclarationError, s.role == role, path.str(), " (", owner,
                 ") and ", s.path(), " (", s.owner,
                 ") hold the same tensor but declare different roles (",
                 to_string(role.role), "/", to_string(role.effective_init()), " vs ",
                 to_string(s.role.role), "/", to_string(s.role.effective_init()),
                 "): an aliased slot has one role; make the declarations agree");
        s.paths.push_back(path);
        return;
      }
      by_storage_.emplace(key, slots_.size());
    }
    slots_.push_back(Slot{{path}, role, std::string(owner), &t});
  }

  std::vector<Slot> take() { return std::move(slots_); }

 private:
  SlotFilter filter_;
  std::vector<Slot> slots_;
  std::unordered_multimap<const void*, std::size_t> by_storage_;
};

}  // namespace

std::vector<Slot> collect_slots(ObjectRef root, SlotFilter filter, std::string_view root_name) {
  SlotCollector c(filter);
  c.path().set_root(root_name);
  root.walk(c);
  return c.take();
}

}  // namespace gk
