// reload/served_names.h: every checkpoint tensor's full name, sorted once
// per slot plan, so that what a load serves is a vector of hashes, not a
// vector of names (internal to the reload layer).
//
//   auto names = std::make_shared<const ServedNames>(plan);   // in prepare()
//   std::vector<std::uint64_t> values(names->size());          // per reload
//   values[names->position(li, k)] = hash_of_tensor_k_of_layer_li;
//   std::uint64_t v = names->content_version(values);          // == the old definition
//
// Note [Served names are the plan's]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each load used to build a (full name, hash) pair per checkpoint tensor,
// then sort the pairs by name and lay them out as the content version's
// input. At the MoE (18,870 tensors) that was a string made, moved, sorted
// and freed per tensor, every reload: the largest piece of the host time
// left after a reload's last launch (docs/performance.md, "Figures behind
// the code"). The names
// are the plan's and do not change between reloads, so they are sorted
// here once, with each tensor's place in that order and the content
// version's input laid out with room for the hashes; a load then writes
// 8 bytes per tensor where they go. The content version is unchanged: the
// sum of the same bytes (Note [Content hash: gk-sum64 v1]).
#pragma once

#include <graphkeep/reload/slot_plan.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gk::detail {

class ServedNames {
 public:
  // The plan's checkpoint tensors in plan order: by layer, parameter, then
  // the parameter's tensors (as LayerRecord::hashes lists a layer's).
  explicit ServedNames(const SlotPlan& plan);

  std::size_t size() const noexcept { return sorted_.size(); }
  // The i-th name in sorted order.
  const std::string& name(std::size_t i) const { return sorted_[i]; }
  // Where tensor k of layer li (in plan order) lies in sorted order.
  std::size_t position(std::size_t li, std::size_t k) const { return position_[layer_first_[li] + k]; }
  // The tensors of layer li.
  std::size_t layer_size(std::size_t li) const { return layer_first_[li + 1] - layer_first_[li]; }
  // The sorted position of `name`, if it is one of the plan's. With a
  // `cursor` (the position found last, 0 at first) the names at and after it
  // are compared first, and the search covers only the side of it where
  // `name` lies: a patch's entries come in name order, so each is found
  // next to the one before. *cursor becomes the position found.
  std::optional<std::size_t> find(std::string_view name, std::size_t* cursor = nullptr) const;
  // The content version of `values` (per sorted name): the hash of every
  // name in sorted order, each followed by a NUL byte and its value's 8
  // little-endian bytes.
  std::uint64_t content_version(const std::vector<std::uint64_t>& values) const;

 private:
  std::vector<std::string> sorted_;
  std::vector<std::size_t> position_;     // per tensor in plan order
  std::vector<std::size_t> layer_first_;  // per layer, its first tensor in plan order; one past the last
  std::string version_bytes_;             // the content version's input, the values zero
  std::vector<std::size_t> value_at_;     // per sorted name, where its value's bytes lie in version_bytes_
};

}  // namespace gk::detail
