// Sharding rules (shard_rules.h): glob patterns to splits.
#include <graphkeep/distributed/shard_rules.h>

#include <string>
#include <string_view>
#include <utility>

namespace gk {

std::string_view to_string(Split s) noexcept {
  switch (s) {
    case Split::replicated: return "replicated";
    case Split::column: return "column-parallel (dim 0)";
    case Split::row: return "row-parallel (dim 1)";
  }
  return "?";
}

bool glob_match(std::string_view p, std::string_view s) noexcept {
  std::size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && p[pi] == s[si]) {
      ++pi;
      ++si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

ShardRules& ShardRules::add(std::string pattern, ShardRule rule) {
  rules_.emplace_back(std::move(pattern), std::move(rule));
  return *this;
}

ShardRule ShardRules::operator()(const std::string& name) const {
  for (const auto& [pattern, rule] : rules_)
    if (glob_match(pattern, name)) return rule;
  return {};
}

}  // namespace gk
