// distributed/wire.h: what the distributed layer's sources share about the
// collectives they issue (private to the layer): the sequence every rank
// follows, the sizes of the fixed messages, tensors <-> bytes and int64
// lists, and the helpers that read a set of votes.
//
// Note [The collective sequence]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank of the group issues exactly the same collectives in the same
// order, whatever fails where; otherwise a backend pairs unrelated calls or
// waits forever. One distributed reload is:
//
//   handshake  broadcast  int64[4]        {magic, manifest length, hash, 0}
//              broadcast  uint8[length]   the trainer's serialized manifest
//              allgather  int64[2]        {tp_rank, tp_size} of every rank
//              allgather  uint8[1024]     manifest vote (RankVote)
//   stream     per bucket:
//              broadcast  int64[kHeaderWords]  header: kind, entries, payload size
//              broadcast  uint8[payload]       (only when payload > 0)
//              ... until a header of kind `end` or `abort`
//   vote       allgather  uint8[1024]     phase 1 done here? (RankVote)
//   outcome    allgather  uint8[1024]     only after a unanimous yes: did the commit work?
//
// A rank that fails before the stream ends drains it (BroadcastSource::drain)
// and then votes; a rank whose handshake fails has nothing left to drain,
// since the handshake fails on every rank alike.
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/distributed/votes.h>

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

// Throws gk::ReloadAbortedError, which carries the failed votes besides the message.
#define GK_THROW_ABORTED(message, ...) \
  ::gk::detail::fail<::gk::ReloadAbortedError>(__func__, __FILE__, __LINE__, message, __VA_ARGS__)

namespace gk::detail::wire {

constexpr std::int64_t kVoteBytes = 1024;  // one RankVote, as text

inline std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline std::int64_t numel_of(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// A CPU int64 tensor's values.
inline std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const std::int64_t* p = c.data_ptr<std::int64_t>();
  return {p, p + c.numel()};
}

inline at::Tensor from_vector(const std::vector<std::int64_t>& v, c10::Device device) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(v.size())}, at::kLong);
  std::memcpy(t.data_ptr<std::int64_t>(), v.data(), v.size() * sizeof(std::int64_t));
  return t.to(device);
}

inline at::Tensor bytes_tensor(std::string_view s, std::int64_t size, c10::Device device) {
  at::Tensor t = at::zeros({size}, at::kByte);
  std::memcpy(t.data_ptr<std::uint8_t>(), s.data(), std::min<std::size_t>(s.size(), static_cast<std::size_t>(size)));
  return t.to(device);
}

inline std::string bytes_string(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const char* p = reinterpret_cast<const char*>(c.data_ptr<std::uint8_t>());
  return std::string(p, p + c.numel());
}

inline std::string truncate(std::string s, std::size_t n) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

// "rank 1 (tp 1/2): WeightError: ...; ranks 0, 2 (...): ...": the failed
// votes, ranks with the same reason together.
std::string format_failures(const std::vector<RankVote>& votes);
// The ranks where it failed first: not those that failed because of a peer,
// unless every failure is of that kind.
std::vector<RankVote> failures_of(const std::vector<RankVote>& votes);
bool all_ok(const std::vector<RankVote>& votes);

}  // namespace gk::detail::wire
