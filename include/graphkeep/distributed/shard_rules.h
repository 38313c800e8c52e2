// graphkeep/distributed/shard_rules.h
//
// How each checkpoint tensor is split across the tensor-parallel ranks
// (replicated, column- or row-parallel) and the name the rank's model
// expects it under.
//
//   gk::ShardRules rules;
//   rules.column("*.qkv.weight").row("*.o_proj.weight");   // the rest: replicated
//   gk::ShardRule r = rules("layers.0.attn.qkv.weight");    // {Split::column, ""}
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gk {

// Sharding rules: for each checkpoint name, how the tensor is split across
// the tensor-parallel ranks, and the name the rank's model expects.
enum class Split {
  replicated,  // every rank gets the whole tensor
  column,      // column-parallel: split along dim 0 (output features of a linear)
  row,         // row-parallel: split along dim 1 (input features of a linear)
};
std::string_view to_string(Split s) noexcept;

struct ShardRule {
  Split split = Split::replicated;
  std::string rename;  // the name in this rank's model; empty: the checkpoint name
};

using ShardFn = std::function<ShardRule(const std::string& checkpoint_name)>;

// Pattern -> rule, first match wins; names no pattern matches are
// replicated. Patterns are globs where '*' matches any run of characters
// (dots included): "layers.*.mlp.up.weight", "*.o_proj.weight".
class ShardRules {
 public:
  ShardRules& add(std::string pattern, ShardRule rule);
  ShardRules& replicated(std::string pattern) { return add(std::move(pattern), {Split::replicated, {}}); }
  ShardRules& column(std::string pattern) { return add(std::move(pattern), {Split::column, {}}); }
  ShardRules& row(std::string pattern) { return add(std::move(pattern), {Split::row, {}}); }
  ShardRule operator()(const std::string& checkpoint_name) const;

 private:
  std::vector<std::pair<std::string, ShardRule>> rules_;
};

bool glob_match(std::string_view pattern, std::string_view name) noexcept;

}  // namespace gk
