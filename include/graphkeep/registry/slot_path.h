// graphkeep/registry/slot_path.h
//
// A slot path names one tensor location inside an object tree, such as
// `quant_method.kernel.workspace_` or `experts[3].w13`, and re-resolves it
// directly: each element carries the function that steps from a parent object
// to the child. The reload engine stores paths once (the slot plan) and
// resolves them after PWAL without walking the tree again, in O(depth).
//
//   gk::SlotPath p = ...;              // recorded by a gk::Walker
//   p.str()                            "moe.fused_experts.ab_strides1"
//   at::Tensor* t = p.resolve_tensor(root_ptr);   // nullptr if the path broke
//
// A path breaks when the object tree changed shape: a container shrank, an
// optional became empty, or a polymorphic member now holds another dynamic
// type. The engine reports a broken path as a mismatch that needs recapture.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

namespace gk {

// One step from an object to a part of it.
struct PathElem {
  enum class Kind : std::uint8_t {
    member,       // a named data member: ".name"
    base,         // a registered base class subobject (not printed)
    element,      // an element of a sequence or tuple: "[i]"
    key,          // an element of a map: "[key]"
    deref,        // the value of an optional or smart pointer (not printed)
    alternative,  // the active alternative of a variant (not printed)
    dynamic,      // the most-derived object behind a polymorphic pointer
  };
  using Resolve = void* (*)(void* parent, const PathElem& self);

  Kind kind = Kind::member;
  std::string_view name{};                // member name, static storage
  std::size_t index = 0;                  // element or alternative index
  std::string key{};                      // map key, printed form
  const std::type_info* type = nullptr;   // dynamic: the type seen when recorded
  Resolve resolve = nullptr;
};

class SlotPath {
 public:
  SlotPath() = default;
  explicit SlotPath(std::string_view root) : root_(root) {}

  void push(PathElem e) { elems_.push_back(std::move(e)); }
  void pop() { elems_.pop_back(); }
  const std::vector<PathElem>& elems() const noexcept { return elems_; }
  std::size_t depth() const noexcept { return elems_.size(); }
  std::string_view root() const noexcept { return root_; }
  void set_root(std::string_view root) { root_ = std::string(root); }

  // "root.a.b[2][key]"; the root prefix is omitted when empty.
  std::string str() const;

  // Follows the path from `root`; nullptr when a step no longer resolves.
  void* resolve(void* root) const;
  at::Tensor* resolve_tensor(void* root) const { return static_cast<at::Tensor*>(resolve(root)); }

  // The first element whose step failed from `root`, for error messages.
  std::size_t broken_at(void* root) const;

 private:
  std::string root_;
  std::vector<PathElem> elems_;
};

}  // namespace gk
