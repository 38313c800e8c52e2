// gk::non_finite_values (graphkeep/delta/non_finite.h): the NaN and infinite
// values each patch entry writes, computed on the values' device.
#include <graphkeep/core/check.h>
#include <graphkeep/delta/non_finite.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "device_groups.h"
#include "patch_errors.h"

namespace gk {

namespace {

// Whether values of `type` can be NaN or infinite. Float4 (e2m1, two to a
// byte) has neither, and no safetensors name.
bool may_be_non_finite(at::ScalarType type) {
  return at::isFloatingType(type) && type != at::ScalarType::Float4_e2m1fn_x2;
}

// [count, first element, first value's bits as a double] of one entry (with
// values), as an int64 tensor of 3 on the values' device: no synchronization.
at::Tensor entry_stats(const PatchEntry& e) {
  at::Tensor v = e.values.reshape({-1});
  if (at::isFloat8Type(v.scalar_type())) v = v.to(at::kFloat);  // isfinite has no float8 kernels
  const at::Tensor bad = at::logical_not(at::isfinite(v));
  const at::Tensor count = bad.sum(at::kLong).reshape({1});
  // The first maximum: the first non-finite position, or 0 when there is none.
  const at::Tensor pos = bad.to(at::kByte).argmax().reshape({1});
  const at::Tensor element =
      e.encoding == PatchEncoding::dense ? pos : e.indices.reshape({-1}).index_select(0, pos).to(at::kLong);
  const at::Tensor value = v.index_select(0, pos).to(at::kDouble).view(at::kLong);
  return at::cat({count, element, value});
}

}  // namespace

std::vector<NonFiniteValues> non_finite_values(const Patch& patch) {
  std::vector<NonFiniteValues> out(patch.entries.size());
  // The entries to read, by device: one copy to the host per device.
  detail::DeviceGroups by_device;
  for (std::size_t i = 0; i < patch.entries.size(); ++i) {
    const PatchEntry& e = patch.entries[i];
    if (!e.values.defined() || e.values.numel() == 0 || !may_be_non_finite(e.values.scalar_type())) continue;
    if (e.encoding == PatchEncoding::sparse) {
      GK_CHECK(WeightError, e.indices.defined() && e.indices.numel() == e.values.numel(), detail::patch_label(patch),
               ": tensor '", e.name, "': ", e.indices.defined() ? e.indices.numel() : 0, " indices but ",
               e.values.numel(), " values");
      GK_CHECK(WeightError, e.indices.device() == e.values.device(), detail::patch_label(patch), ": tensor '", e.name,
               "': the indices are on ", e.indices.device(), " and the values on ", e.values.device());
    }
    by_device.add(e.values.device(), i);
  }
  for (const auto& [device, which] : by_device.list()) {
    std::vector<at::Tensor> stats;
    stats.reserve(which.size());
    for (const std::size_t i : which) stats.push_back(entry_stats(patch.entries[i]));
    const at::Tensor host = at::stack(stats).cpu();
    const auto* s = host.const_data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < which.size(); ++k, s += 3) {
      if (s[0] == 0) continue;
      NonFiniteValues& r = out[which[k]];
      r.count = s[0];
      r.first_element = s[1];
      std::memcpy(&r.first_value, &s[2], sizeof(double));
    }
  }
  return out;
}

}  // namespace gk
