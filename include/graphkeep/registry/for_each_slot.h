// graphkeep/registry/for_each_slot.h
//
// The visitor the reload engine uses for snapshot and copy-back: every
// graph-visible slot of an object tree, exactly once. A slot is one tensor
// location together with its aliases: when two members hold the same storage
// region (`c_strides2 = ab_strides1`), they are one slot with two paths.
//
//   gk::for_each_slot(method, [](const gk::Slot& s) {
//     std::cout << s.path() << " " << gk::to_string(s.role.role)
//               << " aliases=" << s.paths.size() - 1 << "\n";
//   });
//
// Paths that alias one storage must agree on the role; otherwise the call
// raises gk::DeclarationError naming both paths.
#pragma once

#include <graphkeep/registry/walk.h>

#include <string>
#include <vector>

namespace gk {

struct Slot {
  std::vector<SlotPath> paths;  // the first is the canonical path
  RoleSpec role;
  std::string owner;            // the type that declares the canonical member
  at::Tensor* tensor = nullptr;  // the canonical location

  std::string path() const { return paths.front().str(); }
};

enum class SlotFilter { graph_visible, all };

// Walks `root` once and groups its tensor locations into slots. With
// SlotFilter::graph_visible, not-graph-visible tensors are left out.
std::vector<Slot> collect_slots(ObjectRef root, SlotFilter filter = SlotFilter::graph_visible,
                                std::string_view root_name = {});

template <class F>
void for_each_slot(ObjectRef root, F&& f, SlotFilter filter = SlotFilter::graph_visible) {
  for (const Slot& s : collect_slots(root, filter)) f(s);
}

template <Registered T, class F>
void for_each_slot(T& obj, F&& f, SlotFilter filter = SlotFilter::graph_visible) {
  for_each_slot(ObjectRef::of(obj), std::forward<F>(f), filter);
}

// True when a and b view the same storage region with the same geometry
// (the same TensorImpl, or two views of one storage that coincide).
bool same_region(const at::Tensor& a, const at::Tensor& b) noexcept;

}  // namespace gk
