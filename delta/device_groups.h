// delta/device_groups.h: a patch's entries grouped by the device their data
// is on, so that each group's results come to the host in one copy.
// Internal to the layer.
//
//   detail::DeviceGroups groups;
//   for (std::size_t i = 0; i < patch.entries.size(); ++i) groups.add(patch.entries[i].values.device(), i);
//   for (const auto& [device, which] : groups.list()) { ... one .cpu() for `which` ... }
#pragma once

#include <c10/core/Device.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace gk::detail {

class DeviceGroups {
 public:
  using Group = std::pair<c10::Device, std::vector<std::size_t>>;

  // Adds entry `i` to the group of `device` (groups in the order first seen).
  void add(c10::Device device, std::size_t i) {
    auto it = std::find_if(groups_.begin(), groups_.end(), [&](const Group& g) { return g.first == device; });
    if (it == groups_.end()) it = groups_.insert(groups_.end(), {device, {}});
    it->second.push_back(i);
  }
  const std::vector<Group>& list() const { return groups_; }

 private:
  std::vector<Group> groups_;
};

}  // namespace gk::detail
