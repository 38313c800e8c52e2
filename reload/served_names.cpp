// gk::detail::ServedNames: the plan's checkpoint tensor names, sorted once
// (Note [Served names are the plan's] in served_names.h).
#include "served_names.h"

#include <graphkeep/core/check.h>
#include <graphkeep/hashing/content_hash.h>

#include <algorithm>
#include <numeric>

namespace gk::detail {

ServedNames::ServedNames(const SlotPlan& plan) {
  std::vector<std::string> in_plan_order;
  layer_first_.reserve(plan.layers().size() + 1);
  for (const LayerPlan& lp : plan.layers()) {
    layer_first_.push_back(in_plan_order.size());
    for (const CheckpointParam& cp : lp.params)
      for (const CheckpointTensor& ct : cp.tensors) in_plan_order.push_back(lp.full_name(ct.name));
  }
  layer_first_.push_back(in_plan_order.size());
  std::vector<std::size_t> order(in_plan_order.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return in_plan_order[a] < in_plan_order[b]; });
  sorted_.reserve(order.size());
  position_.assign(order.size(), 0);
  value_at_.reserve(order.size());
  std::size_t bytes = 0;
  for (const std::string& n : in_plan_order) bytes += n.size() + 1 + 8;
  version_bytes_.reserve(bytes);
  for (std::size_t i = 0; i < order.size(); ++i) {
    position_[order[i]] = i;
    std::string& n = in_plan_order[order[i]];
    GK_INTERNAL_ASSERT(i == 0 || sorted_.back() != n, "checkpoint tensor '", n, "' is listed twice in the plan");
    version_bytes_ += n;
    version_bytes_.push_back('\0');
    value_at_.push_back(version_bytes_.size());
    version_bytes_.append(8, '\0');
    sorted_.push_back(std::move(n));
  }
}

std::optional<std::size_t> ServedNames::find(std::string_view name, std::size_t* cursor) const {
  auto first = sorted_.begin(), last = sorted_.end();
  if (cursor != nullptr && *cursor < sorted_.size()) {
    const std::size_t c = *cursor;
    if (sorted_[c] == name) return c;
    if (c + 1 < sorted_.size() && sorted_[c + 1] == name) return *cursor = c + 1;
    if (sorted_[c] < name)
      first += static_cast<std::ptrdiff_t>(c + 1);
    else
      last = first + static_cast<std::ptrdiff_t>(c);
  }
  const auto it = std::lower_bound(first, last, name, [](const std::string& e, std::string_view n) { return e < n; });
  if (it == last || *it != name) return std::nullopt;
  const auto at = static_cast<std::size_t>(it - sorted_.begin());
  if (cursor != nullptr) *cursor = at;
  return at;
}

std::uint64_t ServedNames::content_version(const std::vector<std::uint64_t>& values) const {
  GK_INTERNAL_ASSERT(values.size() == sorted_.size(), "content_version: ", values.size(), " values for ",
                     sorted_.size(), " names");
  std::string bytes = version_bytes_;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint64_t h = values[i];
    for (int b = 0; b < 8; ++b) bytes[value_at_[i] + static_cast<std::size_t>(b)] = static_cast<char>((h >> (8 * b)) & 0xff);
  }
  return content_hash_bytes({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
}

}  // namespace gk::detail
