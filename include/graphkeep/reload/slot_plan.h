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
#pragma once

#include <graphkeep/registry/for_each_slot.h>
#include <graphkeep/reload/layer.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
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
  std::vector<SlotPath> paths;    // declared paths from the layer's registered root (aliases after the first)
  std::vector<at::Tensor> originals;  // per path: the tensor handle the field held at prepare()
  at::Tensor captured;            // a view of the captured storage, with the captured geometry

  // The captured layout; a reload whose PWAL changes any of it is a mismatch.
  std::vector<std::int64_t> sizes, strides;
  std::int64_t storage_offset = 0;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::kCPU;
  std::size_t storage_nbytes = 0;

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
};

struct LayerPlan {
  std::string prefix;                   // module path in the model ("" for the root)
  torch::nn::Module* module = nullptr;
  ReloadableLayer* layer = nullptr;     // nullptr: a plain module
  ObjectRef root;                       // the layer's registered members
  std::vector<CheckpointParam> params;  // what the checkpoint fills
  std::vector<PlannedSlot> slots;
  std::vector<PlannedConfig> configs;

  std::string full_name(std::string_view local) const;
};

class SlotPlan {
 public:
  std::vector<LayerPlan>& layers() noexcept { return layers_; }
  const std::vector<LayerPlan>& layers() const noexcept { return layers_; }
  std::size_t num_slots() const noexcept;
  std::size_t num_declared_slots() const noexcept;
  std::size_t captured_bytes() const noexcept;

  struct Owner {
    const LayerPlan* layer;
    const PlannedSlot* slot;
  };
  // The slot whose captured storage contains `address`, if any. O(log n)
  // after index().
  std::optional<Owner> find_owner(std::uintptr_t address) const;
  // Builds the address index used by find_owner (done by build_slot_plan).
  void index();

 private:
  std::vector<LayerPlan> layers_;
  struct Range {
    std::uintptr_t begin, end;
    std::uint32_t layer, slot;
  };
  std::vector<Range> ranges_;
};

// Walks `model` (modules, parameters, buffers, registered members) once and
// records every graph-visible tensor. Raises gk::DeclarationError for a
// declaration the model contradicts (a gk::parameter member that is no
// parameter, a checkpoint param that names no parameter, ...).
SlotPlan build_slot_plan(torch::nn::Module& model);

}  // namespace gk
