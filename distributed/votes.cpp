// Every rank's vote (votes.h), and reading a set of votes (wire.h).
#include <graphkeep/distributed/votes.h>

#include "wire.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace gk {

using detail::concat;
using namespace detail::wire;

std::vector<RankVote> gather_votes(const Collective& group, c10::Device device, const RankVote& mine) {
  std::string text = concat(mine.ok ? '1' : mine.peer ? 'p' : '0', '\x1f', mine.role, '\x1f', mine.reason);
  text = truncate(std::move(text), kVoteBytes - 1);
  const std::vector<at::Tensor> all = group.allgather(bytes_tensor(text, kVoteBytes, device));
  std::vector<RankVote> out;
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::string s = bytes_string(all[r]);
    s = s.substr(0, s.find('\0'));
    RankVote v;
    v.rank = static_cast<int>(r);
    const std::size_t a = s.find('\x1f');
    const std::size_t b = a == std::string::npos ? a : s.find('\x1f', a + 1);
    v.ok = !s.empty() && s[0] == '1';
    v.peer = !s.empty() && s[0] == 'p';
    if (b != std::string::npos) {
      v.role = s.substr(a + 1, b - a - 1);
      v.reason = s.substr(b + 1);
    } else {
      v.ok = false;
      v.reason = "unreadable vote";
    }
    out.push_back(std::move(v));
  }
  return out;
}

namespace detail::wire {

std::string format_failures(const std::vector<RankVote>& votes) {
  std::vector<std::pair<std::string, std::vector<const RankVote*>>> groups;
  for (const RankVote& v : votes) {
    if (v.ok) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v.reason; });
    if (it == groups.end()) groups.push_back({v.reason, {&v}});
    else it->second.push_back(&v);
  }
  std::string out;
  for (const auto& [reason, who] : groups) {
    if (!out.empty()) out += "; ";
    out += who.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < who.size(); ++i)
      out += concat(i ? ", " : "", who[i]->rank, " (", who[i]->role, ")");
    out += concat(": ", reason.empty() ? std::string("(no reason given)") : reason);
  }
  return out;
}

std::vector<RankVote> failures_of(const std::vector<RankVote>& votes) {
  std::vector<RankVote> out;
  for (const RankVote& v : votes)
    if (!v.ok && !v.peer) out.push_back(v);
  if (out.empty())
    for (const RankVote& v : votes)
      if (!v.ok) out.push_back(v);
  return out;
}

bool all_ok(const std::vector<RankVote>& votes) {
  return std::all_of(votes.begin(), votes.end(), [](const RankVote& v) { return v.ok; });
}

}  // namespace detail::wire

}  // namespace gk
