// reload/reload_internal.h: helpers shared by the reload sources (not installed).
#pragma once

#include <graphkeep/reload/slot_plan.h>

#include <ATen/ATen.h>

namespace torch::nn {
class Module;
}

#include <string>
#include <vector>

#include <graphkeep/core/check.h>

namespace gk {
using detail::concat;
}

namespace gk::detail {

// A new TensorImpl viewing t's storage with t's geometry: a strong reference
// to the storage that survives anything done to t itself (set_data, rebind).
at::Tensor storage_view(const at::Tensor& t);

// An empty tensor of t's device and dtype over a storage of its own, of no
// bytes, that cannot be resized: what a detached parameter holds until the
// load gives it data (Note [Storage views without dispatch] in slot_plan.cpp).
at::Tensor placeholder_like(const at::Tensor& t);

// Records t's layout and captured storage into s.
void record_layout(PlannedSlot& s, const at::Tensor& t);

// The module's own parameter (or buffer) `name` as a handle sharing its
// TensorImpl; undefined when the module has none of that name. (Note: the
// OrderedDicts libtorch returns are temporaries; never keep a pointer into one.)
at::Tensor module_parameter(torch::nn::Module& m, const std::string& name);
at::Tensor module_buffer(torch::nn::Module& m, const std::string& name);
// The module tensor a parameter or buffer slot names.
at::Tensor module_tensor(torch::nn::Module& m, const PlannedSlot& s);

// The message for a gk::testing::EngineHooks::<option> entry that names no
// slot of the plan, with the closest slot names.
std::string unknown_slot_message(const SlotPlan& plan, std::string_view option, std::string_view name);

// What differs between the captured layout of s and t ("shape [4] -> [8]").
std::vector<std::string> layout_differences(const PlannedSlot& s, const at::Tensor& t);

// Points every location of slot s (the module's parameter or buffer, every
// declared path) back at its captured storage (layer_pipeline.cpp).
void repoint(LayerPlan& lp, const PlannedSlot& s);

}  // namespace gk::detail
