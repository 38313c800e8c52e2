// graphkeep/reload/slot_plan.h
//
// The persistent slot plan: built once by ReloadEngine::prepare(), after the
// first load and PWAL and before any capture. For every layer it lists the
// tensors a captured graph may read (parameters, buffers and the registry's
// declared slots, aliases merged) and keeps a strong reference to each one's
// captured storage, so those addresses stay allocated for as long as the plan
// lives. A reload resolves its k slots through the stored paths (O(depth)
// each) and never walks the object tree again.
//
//   gk::SlotPlan plan = gk::build_slot_plan(model);
//   plan.num_slots();                       // slots tracked
//   plan.find_owner(ptr)                    // which slot's storage holds ptr
//
// For negative tests, build_slot_plan(model, {"layer.kernel_.workspace_"})
// leaves declared members out as if their class had declared them not
// graph-visible (gk::testing::EngineHooks::undeclared_members).
#pragma once

#include <graphkeep/registry/for_each_slot.h>
#include <graphkeep/model/layer.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}

namespace gk {

struct PlannedSlot {
  enum class Kind : std::uint8_t { parameter, buffer, declared };

  Kind kind = Kind::declared;
  std::string name;               // full path in the model, e.g. "layers.0.mlp.kernel_.workspace_"
  std::string local;              // parameter/buffer name, or the declared canonical path
  RoleSpec role;
  std::string owner;              // declared: the class that declares the member (for messages)
  std::vector<SlotPath> paths;    // declared paths from the layer's registered root (aliases after the first)
  std::vector<at::Tensor> originals;  // per path: the tensor handle the field held at prepare()
  at::Tensor captured;            // a view of the captured storage, with the captured geometry

  // The captured layout; a reload whose PWAL changes any of it is a mismatch.
  std::vector<std::int64_t> sizes, strides;
  std::int64_t storage_offset = 0;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::kCPU;
  std::size_t storage_nbytes = 0;

  // The slots that view the same captured storage, this one included, as a
  // range of the plan's address index (set by SlotPlan::index; empty for a
  // slot without storage). Exact aliases merge into one slot, but prefix,
  // interior and strided views (q, k, v of a fused weight) are slots of
  // their own; a graph reading the storage is verified against all of them
  // (SlotPlan::for_each_sharing_storage).
  std::uint32_t storage_group_begin = 0, storage_group_end = 0;

  bool defined() const noexcept { return captured.defined(); }
  // [storage base, storage base + storage_nbytes): the addresses this slot owns.
  std::uintptr_t storage_begin() const;
  std::uintptr_t storage_end() const { return storage_begin() + storage_nbytes; }
};

// A configuration value of a registered member (a non-tensor member that a
// kernel may have taken by value into a captured graph).
struct PlannedConfig {
  std::string name;
  SlotPath path;
  const ConfigOps* ops = nullptr;
  std::shared_ptr<const void> captured;  // its value at prepare(), what the graphs were captured with
};

// A block derivation of the layer (graphkeep/model/block_derivation.h)
// bound to its slots by prepare() (Note [Declared derivations] in
// graphkeep/registry/role.h).
struct PlannedDerivation {
  std::string name;
  std::size_t source = 0;  // the checkpoint parameter's slot
  std::int64_t rows = 0, cols = 0;  // the source as the derivation sees it (a 2-D view of all of it)
  std::int64_t block_rows = 1, block_cols = 1;
  struct Output {
    std::size_t slot;
    BlockLayout layout;
    std::int64_t per_block = 1;  // values per block (the one_per_block layouts)
  };
  std::vector<Output> outputs;
  BlockFn fn;
};

// A layout derivation of the layer (Note [Layout derivations] in
// graphkeep/model/block_derivation.h) bound by prepare(): the output
// elements that hold source elements, ordered by source index.
struct PlannedLayout {
  std::string name;
  std::size_t source = 0, output = 0;  // slots
  LayoutFn fn;
  // int32 where the source's and the output's element counts fit, else int64:
  at::Tensor sorted_source;  // [M]: the source index of each moved output element, ascending
  at::Tensor position;       // [M]: that output element's flat index
};

struct LayerPlan {
  std::string prefix;                   // module path in the model ("" for the root)
  torch::nn::Module* module = nullptr;
  ReloadableLayer* layer = nullptr;     // nullptr: a plain module
  ObjectRef root;                       // the layer's registered members
  std::vector<CheckpointParam> params;  // what the checkpoint fills
  std::vector<PlannedSlot> slots;
  std::vector<PlannedConfig> configs;
  std::vector<PlannedDerivation> derivations;
  std::vector<PlannedLayout> layouts;

  std::string full_name(std::string_view local) const;
};

class SlotPlan {
 public:
  std::vector<LayerPlan>& layers() noexcept { return layers_; }
  const std::vector<LayerPlan>& layers() const noexcept { return layers_; }
  std::size_t num_slots() const noexcept;
  std::size_t num_declared_slots() const noexcept;
  std::size_t captured_bytes() const noexcept;

  // Note [Slot names]
  // ~~~~~~~~~~~~~~~~~
  // A slot's name is its full path in the model: the module path, then the
  // parameter or buffer name ("layers.0.mlp.weight"), or the declared
  // member's path from the layer's registered root, with containers indexed
  // by position or key ("layers.0.mlp.kernel_.workspace_",
  // "moe.experts_[3].w13_"). Aliases of one slot are listed under the first
  // path. These are the names gk::testing::EngineHooks::unprotected_slots and
  // gk::testing::EngineHooks::undeclared_members take, and the ones errors and gk-slots
  // print.
  std::vector<std::string> slot_names() const;
  // The slot of that name, or nullptr.
  const PlannedSlot* find_slot(std::string_view name) const;
  // Up to `n` slot names closest to `name` (edit distance), closest first.
  std::vector<std::string> closest_slot_names(std::string_view name, std::size_t n = 3) const;

  // The full paths (every alias path) of the declared members that
  // build_slot_plan left out because gk::testing::EngineHooks::undeclared_members named
  // them. The collector reports the tensors at these paths as not graph-
  // visible (reason gk::kUndeclaredMemberReason), so the capture manifest
  // names them as undeclared tensors.
  const std::vector<std::string>& undeclared() const noexcept { return undeclared_; }
  std::vector<std::string>& undeclared() noexcept { return undeclared_; }
  bool is_undeclared(std::string_view path) const noexcept;

  struct Owner {
    const LayerPlan* layer;
    const PlannedSlot* slot;
  };
  // The slot whose captured storage contains `address`, if any. O(log n)
  // after index().
  std::optional<Owner> find_owner(std::uintptr_t address) const;
  // Builds the address index used by find_owner (done by build_slot_plan).
  void index();
  // Calls f(layer index, slot index) for every slot whose captured storage
  // is s's, s included. O(group size), no allocation.
  template <class F>
  void for_each_sharing_storage(const PlannedSlot& s, F&& f) const {
    for (std::uint32_t k = s.storage_group_begin; k < s.storage_group_end; ++k) f(ranges_[k].layer, ranges_[k].slot);
  }

 private:
  std::vector<LayerPlan> layers_;
  struct Range {
    std::uintptr_t begin, end;
    std::uint32_t layer, slot;
    std::uintptr_t reach = 0;  // the largest `end` of this range and every one before it
  };
  std::vector<Range> ranges_;
  std::vector<std::string> undeclared_;
};

// The reason the collector gives a member left out of the plan by
// gk::testing::EngineHooks::undeclared_members (its role is reported as not_graph_visible).
inline constexpr std::string_view kUndeclaredMemberReason =
    "treated as undeclared by gk::testing::EngineHooks::undeclared_members";

// Walks `model` (modules, parameters, buffers, registered members) once and
// records every graph-visible tensor. Raises gk::DeclarationError for a
// declaration the model contradicts (a gk::parameter member that is no
// parameter, a checkpoint param that names no parameter, ...).
//
// `undeclared` (gk::testing::EngineHooks::undeclared_members, for negative tests): full
// slot names of declared members to leave out of the plan, as if their class
// had declared them not graph-visible. Each is checked against the complete
// plan first: a name that is no slot, or names a parameter or buffer, is a
// gk::StateError (listing the closest slot names).
SlotPlan build_slot_plan(torch::nn::Module& model, const std::vector<std::string>& undeclared = {});

}  // namespace gk
