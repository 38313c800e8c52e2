// graphkeep/distributed/votes.h
//
// Every rank's vote (an allgather): the handshake votes on the manifest, a
// distributed reload votes before it commits. A failed vote names the rank,
// its role and why; ReloadAbortedError carries the failures.
//
//   std::vector<gk::RankVote> all = gk::gather_votes(group, device, {.rank = r, .ok = ok, .reason = why});
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/distributed/collective.h>

#include <c10/core/Device.h>

#include <string>
#include <utility>
#include <vector>

namespace gk {

// The vote of one rank.
struct RankVote {
  int rank = 0;
  bool ok = true;
  std::string role;    // "tp 1/2", "trainer", ...
  std::string reason;  // "" when ok; "WeightError: graphkeep: ..." otherwise (truncated)
  // Failed only because another rank did (the trainer aborted the broadcast,
  // the handshake refused to start): such votes are not listed as failures.
  bool peer = false;
};

// A distributed reload (or the weight broadcast) aborted on every rank: each
// keeps its old weights. failures() lists the ranks where it failed first,
// with their reasons (empty for a group-wide error such as an inconsistent
// tensor-parallel layout).
class ReloadAbortedError : public WeightError {
 public:
  ReloadAbortedError(std::string message, std::vector<RankVote> failures, SourceLocation where = {})
      : WeightError(std::move(message), where), failures_(std::move(failures)) {}
  const std::vector<RankVote>& failures() const noexcept { return failures_; }

 private:
  std::vector<RankVote> failures_;
};

// The votes of every rank (an allgather over `group` on `device`).
std::vector<RankVote> gather_votes(const Collective& group, c10::Device device, const RankVote& mine);

}  // namespace gk
