// Tensor-parallel reload over c10d: the bucketed broadcast source, the
// manifest handshake and the two-phase commit. See docs/distributed.md.
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
#include <graphkeep/distributed/distributed.h>

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/reload/reload_engine.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <typeinfo>

// ReloadAbortedError carries the failed votes besides the message.
#define GK_THROW_ABORTED(message, ...) \
  ::gk::detail::fail<ReloadAbortedError>(__func__, __FILE__, __LINE__, message, __VA_ARGS__)

namespace gk {

using detail::concat;

namespace {

constexpr std::int64_t kMagic = 0x676b2d6263737431;  // "gk-bcst1"
constexpr std::int64_t kMaxEntries = 512;            // tensor pieces per bucket
constexpr std::int64_t kMessageBytes = 1024;         // abort message in the header
constexpr std::int64_t kHeaderFixed = 8;
constexpr std::int64_t kHeaderWords = kHeaderFixed + 3 * kMaxEntries + kMessageBytes / 8;
constexpr std::int64_t kVoteBytes = 1024;
constexpr std::int64_t kAlign = 16;  // piece offsets: any dtype can be viewed in place

enum BucketKind : std::int64_t { kData = 0, kEnd = 1, kAbort = 2 };

std::int64_t align_up(std::int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::int64_t numel_of(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string_view kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::declaration: return "DeclarationError";
    case ErrorKind::weights: return "WeightError";
    case ErrorKind::mismatch: return "MismatchError";
    case ErrorKind::drift: return "DriftError";
    case ErrorKind::state: return "StateError";
    case ErrorKind::internal: return "InternalError";
  }
  return "Error";
}

std::string type_name(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : t.name();
  std::free(d);
  return out;
}

std::string describe_exception(const std::exception_ptr& e) {
  if (!e) return {};
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return concat(kind_name(x.kind()), ": ", x.what());
  } catch (const c10::Error& x) {
    return concat("c10::Error: ", x.what_without_backtrace());
  } catch (const std::exception& x) {
    return concat(type_name(typeid(x)), ": ", x.what());
  } catch (...) {
    return "unknown exception";
  }
}

// A CPU int64 tensor's values.
std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const std::int64_t* p = c.data_ptr<std::int64_t>();
  return {p, p + c.numel()};
}

at::Tensor from_vector(const std::vector<std::int64_t>& v, c10::Device device) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(v.size())}, at::kLong);
  std::memcpy(t.data_ptr<std::int64_t>(), v.data(), v.size() * sizeof(std::int64_t));
  return t.to(device);
}

at::Tensor bytes_tensor(std::string_view s, std::int64_t size, c10::Device device) {
  at::Tensor t = at::zeros({size}, at::kByte);
  std::memcpy(t.data_ptr<std::uint8_t>(), s.data(), std::min<std::size_t>(s.size(), static_cast<std::size_t>(size)));
  return t.to(device);
}

std::string bytes_string(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const char* p = reinterpret_cast<const char*>(c.data_ptr<std::uint8_t>());
  return std::string(p, p + c.numel());
}

std::string truncate(std::string s, std::size_t n) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

std::string format_failures(const std::vector<RankVote>& votes) {
  // Ranks with the same reason are listed together.
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

// The ranks where it failed first: not those that failed because of a peer,
// unless every failure is of that kind.
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

}  // namespace

// ---------------------------------------------------------------------------
// Collective

Collective::Collective(c10::intrusive_ptr<c10d::ProcessGroup> group) : group_(std::move(group)) {
  GK_CHECK(StateError, group_.defined(), "gk::Collective needs a process group, got a null one");
}
Collective::Collective(c10::intrusive_ptr<c10d::Backend> backend) : backend_(std::move(backend)) {
  GK_CHECK(StateError, backend_.defined(), "gk::Collective needs a c10d backend, got a null one");
}
Collective::Collective(const Collective&) = default;
Collective& Collective::operator=(const Collective&) = default;
Collective::~Collective() = default;

int Collective::rank() const { return group_ ? group_->getRank() : backend_->getRank(); }
int Collective::size() const { return group_ ? group_->getSize() : backend_->getSize(); }

void Collective::broadcast(at::Tensor& t, int root) const {
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto work = group_ ? group_->broadcast(v, o) : backend_->broadcast(v, o);
  work->wait();
}

std::vector<at::Tensor> Collective::allgather(const at::Tensor& t) const {
  std::vector<at::Tensor> in{t};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(at::empty_like(t));
  auto work = group_ ? group_->allgather(out, in) : backend_->allgather(out, in);
  work->wait();
  return out[0];
}

// ---------------------------------------------------------------------------
// WeightManifest

WeightManifest::WeightManifest(std::vector<WeightEntry> entries) : entries_(std::move(entries)) {
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const std::string& n = entries_[i].name;
    GK_CHECK(WeightError, !n.empty() && n.find_first_of("\t\n") == std::string::npos,
             "manifest tensor name '", n, "' is empty or has a tab or newline");
    GK_CHECK(WeightError, i == 0 || entries_[i - 1].name != n, "manifest lists '", n, "' twice");
    for (auto d : entries_[i].shape)
      GK_CHECK(WeightError, d >= 0, "manifest tensor '", n, "' has a negative size");
  }
}

WeightManifest WeightManifest::of(const std::vector<NamedTensor>& tensors) {
  std::vector<WeightEntry> e;
  e.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    GK_CHECK(WeightError, t.shard == 0, "a manifest describes whole tensors; '", t.name, "' is shard ",
             t.shard);
    GK_CHECK(WeightError, t.value.defined(), "manifest tensor '", t.name, "' is undefined");
    e.push_back({t.name, t.value.sizes().vec(), t.value.scalar_type()});
  }
  return WeightManifest(std::move(e));
}

std::int64_t WeightManifest::index_of(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const WeightEntry& e, std::string_view n) { return e.name < n; });
  if (it == entries_.end() || it->name != name) return -1;
  return it - entries_.begin();
}

std::size_t WeightManifest::total_bytes() const {
  std::size_t n = 0;
  for (const auto& e : entries_) n += static_cast<std::size_t>(numel_of(e.shape)) * c10::elementSize(e.dtype);
  return n;
}

std::string WeightManifest::serialize() const {
  std::string out;
  for (const auto& e : entries_) out += concat(e.name, '\t', c10::toString(e.dtype), '\t', shape_str(e.shape), '\n');
  return out;
}

std::uint64_t WeightManifest::hash() const {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : serialize()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

WeightManifest WeightManifest::parse(std::string_view text) {
  std::vector<WeightEntry> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    GK_CHECK(WeightError, eol != std::string_view::npos, "malformed manifest: unterminated line");
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    const std::size_t t1 = line.find('\t');
    const std::size_t t2 = t1 == std::string_view::npos ? t1 : line.find('\t', t1 + 1);
    GK_CHECK(WeightError, t2 != std::string_view::npos, "malformed manifest line '", line, "'");
    WeightEntry e;
    e.name = std::string(line.substr(0, t1));
    const std::string_view dt = line.substr(t1 + 1, t2 - t1 - 1);
    bool found = false;
    for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions) && !found; ++i) {
      const auto st = static_cast<at::ScalarType>(i);
      if (dt == c10::toString(st)) {
        e.dtype = st;
        found = true;
      }
    }
    GK_CHECK(WeightError, found, "malformed manifest: unknown dtype '", dt, "'");
    std::string shape(line.substr(t2 + 1));
    GK_CHECK(WeightError, shape.size() >= 2 && shape.front() == '[' && shape.back() == ']',
             "malformed manifest shape '", shape, "'");
    std::istringstream is(shape.substr(1, shape.size() - 2));
    std::string tok;
    while (std::getline(is, tok, ',')) e.shape.push_back(std::stoll(tok));
    out.push_back(std::move(e));
  }
  return WeightManifest(std::move(out));
}

std::string WeightManifest::diff(const WeightManifest& reference, const WeightManifest& mine, std::size_t limit) {
  std::vector<std::string> d;
  std::size_t i = 0, j = 0;
  const auto& a = reference.entries_;
  const auto& b = mine.entries_;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].name < b[j].name)) {
      d.push_back(concat("'", a[i].name, "' is on the trainer but not here"));
      ++i;
    } else if (i == a.size() || b[j].name < a[i].name) {
      d.push_back(concat("'", b[j].name, "' is here but not on the trainer"));
      ++j;
    } else {
      if (a[i].shape != b[j].shape)
        d.push_back(concat("'", a[i].name, "' has shape ", shape_str(a[i].shape), " on the trainer but ",
                           shape_str(b[j].shape), " here"));
      if (a[i].dtype != b[j].dtype)
        d.push_back(concat("'", a[i].name, "' has dtype ", c10::toString(a[i].dtype), " on the trainer but ",
                           c10::toString(b[j].dtype), " here"));
      ++i;
      ++j;
    }
  }
  std::string out;
  for (std::size_t k = 0; k < d.size() && k < limit; ++k) out += (k ? "; " : "") + d[k];
  if (d.size() > limit) out += concat("; ... (", d.size() - limit, " more)");
  return out;
}

// ---------------------------------------------------------------------------
// Shard rules

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

// ---------------------------------------------------------------------------
// Votes

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

// ---------------------------------------------------------------------------
// BroadcastSource

struct BroadcastSource::Impl {
  // What this rank does with manifest entry i.
  struct Plan {
    Split split = Split::replicated;
    std::string target;                     // the name this rank's model expects
    std::vector<std::int64_t> shard_shape;  // what this rank keeps
    std::int64_t rows = 0;                  // dim 0 (1 for a 0-dim tensor)
    std::int64_t row_bytes = 0;
    std::int64_t part = 0;                  // this rank's length along the split dim
  };
  struct Assembly {
    at::Tensor target;
    std::int64_t seen = 0;  // rows of the full tensor received so far
  };
  // Trainer: the tensor being cut into buckets.
  struct Current {
    std::int64_t index = -1;
    at::Tensor bytes;  // the whole tensor, contiguous, as bytes
    std::int64_t next_row = 0;
  };

  Impl(Collective g, WeightManifest m, ShardFn s, BroadcastConfig c, WeightSource* f)
      : group(std::move(g)), manifest(std::move(m)), shard(std::move(s)), config(c), full(f) {}

  Collective group;
  WeightManifest manifest;
  ShardFn shard;
  BroadcastConfig config;
  WeightSource* full;
  enum class Stage { start, streaming, done } stage = Stage::start;
  std::int64_t seq = 0;
  std::vector<Plan> plans;
  std::map<std::int64_t, Assembly> open;
  std::deque<NamedTensor> ready;
  Current cur;
  bool source_done = false;
  std::vector<bool> sent;
  BroadcastStats stats;

  bool trainer() const { return group.rank() == config.trainer_rank; }
  bool receives() const { return config.tp_rank >= 0; }

  std::string role() const {
    const std::string tp = concat("tp ", config.tp_rank, "/", config.tp_size);
    if (trainer()) return receives() ? "trainer + " + tp : "trainer";
    return receives() ? tp : "no model";
  }

  // Plans every manifest entry; returns why a tensor cannot be sharded ("" if fine).
  std::string make_plans() {
    plans.assign(manifest.size(), {});
    std::vector<std::string> bad;
    for (std::size_t i = 0; i < manifest.size(); ++i) {
      const WeightEntry& e = manifest.entries()[i];
      Plan& p = plans[i];
      p.rows = e.shape.empty() ? 1 : e.shape[0];
      const std::int64_t bytes = numel_of(e.shape) * static_cast<std::int64_t>(c10::elementSize(e.dtype));
      p.row_bytes = p.rows > 0 ? bytes / p.rows : 0;
      p.shard_shape = e.shape;
      p.target = e.name;
      if (!receives()) continue;
      ShardRule rule = shard ? shard(e.name) : ShardRule{};
      p.split = rule.split;
      if (!rule.rename.empty()) p.target = rule.rename;
      const int dim = p.split == Split::column ? 0 : 1;
      if (p.split == Split::replicated) continue;
      if (static_cast<int>(e.shape.size()) <= dim || e.shape[dim] % config.tp_size != 0) {
        bad.push_back(concat("'", e.name, "' ", shape_str(e.shape), " cannot be split ", to_string(p.split),
                             " into ", config.tp_size, " equal parts"));
        continue;
      }
      p.part = e.shape[dim] / config.tp_size;
      p.shard_shape[dim] = p.part;
    }
    std::string out;
    for (std::size_t k = 0; k < bad.size() && k < 8; ++k) out += (k ? "; " : "") + bad[k];
    if (bad.size() > 8) out += concat("; ... (", bad.size() - 8, " more)");
    return out;
  }

  void handshake() {
    ScopedMsTimer t(stats.handshake_ms);
    const c10::Device dev = config.device;
    const std::string text = manifest.serialize();
    // 1. the trainer's manifest
    at::Tensor head = from_vector({kMagic, static_cast<std::int64_t>(text.size()),
                                   static_cast<std::int64_t>(manifest.hash()), 0},
                                  dev);
    group.broadcast(head, config.trainer_rank);
    const std::vector<std::int64_t> h = to_vector(head);
    std::string theirs;
    if (h[0] == kMagic && h[1] > 0) {
      at::Tensor body = trainer() ? bytes_tensor(text, h[1], dev) : at::empty({h[1]}, at::TensorOptions(at::kByte).device(dev));
      group.broadcast(body, config.trainer_rank);
      theirs = bytes_string(body);
    }
    // 2. the layout: tp_size agreed, every tp rank present
    const std::vector<at::Tensor> layout = group.allgather(from_vector({config.tp_rank, config.tp_size}, dev));
    std::int64_t tp_size = -1;
    std::set<std::int64_t> present;
    std::string layout_error;
    for (std::size_t r = 0; r < layout.size(); ++r) {
      const auto v = to_vector(layout[r]);
      if (v[0] < 0) continue;
      if (tp_size < 0) tp_size = v[1];
      if (v[1] != tp_size || v[0] >= v[1])
        layout_error = concat("rank ", r, " is tp ", v[0], "/", v[1], " but another rank has tp_size ", tp_size);
      present.insert(v[0]);
    }
    if (layout_error.empty() && tp_size > 0 && static_cast<std::int64_t>(present.size()) != tp_size)
      layout_error = concat("tp_size is ", tp_size, " but only ", present.size(), " distinct tp rank(s) take part");
    if (!layout_error.empty()) {
      stage = Stage::done;
      GK_THROW_ABORTED(concat("the weight broadcast from rank ", config.trainer_rank,
                                      " cannot start: inconsistent tensor-parallel layout: ", layout_error),
                               std::vector<RankVote>());
    }
    // 3. this rank's verdict: same manifest, every tensor shardable
    std::string reason;
    if (h[0] != kMagic) {
      reason = "the trainer's handshake is not graphkeep's (was every rank's collective sequence the same?)";
    } else if (!trainer() && theirs != text) {
      try {
        reason = concat("its manifest differs from the trainer's (rank ", config.trainer_rank,
                        "): ", WeightManifest::diff(WeightManifest::parse(theirs), manifest));
      } catch (const std::exception& e) {
        reason = concat("the trainer's manifest is unreadable: ", e.what());
      }
    }
    if (reason.empty()) reason = make_plans();
    if (reason.empty() && trainer() && full == nullptr)
      reason = "this is the trainer rank but it was given no source of full weights";
    const auto votes = gather_votes(group, dev, {group.rank(), reason.empty(), role(), reason, false});
    if (!all_ok(votes)) {
      stage = Stage::done;
      GK_THROW_ABORTED(concat("the weight broadcast from rank ", config.trainer_rank,
                                      " cannot start: ", format_failures(votes)),
                               failures_of(votes));
    }
    sent.assign(manifest.size(), false);
    stage = Stage::streaming;
  }

  // Pulls the trainer's next full tensor; false when its source is exhausted.
  bool pull() {
    std::optional<NamedTensor> nt = full->next();
    if (!nt) return false;
    const std::string who = concat("the trainer's source (", full->describe(), ")");
    const std::int64_t i = manifest.index_of(nt->name);
    if (i < 0) abort_stream(concat(who, " yields '", nt->name, "', which is not in the manifest"));
    const WeightEntry& e = manifest.entries()[i];
    if (sent[i]) abort_stream(concat(who, " yields '", e.name, "' twice"));
    if (nt->shard != 0)
      abort_stream(concat(who, " yields shard ", nt->shard, " of '", e.name,
                          "'; the trainer sends whole tensors (the ranks shard them)"));
    if (!nt->value.defined()) abort_stream(concat(who, " yields an undefined tensor '", e.name, "'"));
    if (nt->value.sizes().vec() != e.shape)
      abort_stream(concat(who, " yields '", e.name, "' with shape ", shape_str(nt->value.sizes().vec()),
                          " but the manifest says ", shape_str(e.shape)));
    if (nt->value.scalar_type() != e.dtype)
      abort_stream(concat(who, " yields '", e.name, "' with dtype ", nt->value.scalar_type(),
                          " but the manifest says ", c10::toString(e.dtype)));
    sent[i] = true;
    cur.index = i;
    cur.next_row = 0;
    cur.bytes = nt->value.contiguous().reshape({-1}).view(at::kByte);
    return true;
  }

  [[noreturn]] void abort_stream(const std::string& message) {
    std::vector<std::int64_t> h(kHeaderWords, 0);
    h[0] = kMagic;
    h[1] = seq++;
    h[2] = kAbort;
    const std::string m = truncate(message, kMessageBytes - 1);
    std::memcpy(h.data() + kHeaderFixed + 3 * kMaxEntries, m.data(), m.size());
    at::Tensor head = from_vector(h, config.device);
    stage = Stage::done;
    group.broadcast(head, config.trainer_rank);
    GK_THROW(WeightError, message);
  }

  void pump() {
    const c10::Device dev = config.device;
    std::vector<std::int64_t> h(kHeaderWords, 0);
    std::vector<at::Tensor> pieces;  // trainer: the bytes of each entry
    if (trainer()) {
      std::int64_t n = 0, used = 0;
      const auto budget = static_cast<std::int64_t>(config.bucket_bytes);
      while (n < kMaxEntries) {
        if (cur.index < 0) {
          if (source_done) break;
          if (!pull()) {
            source_done = true;
            break;
          }
        }
        const Plan& p = plans[cur.index];
        std::int64_t take = p.rows - cur.next_row;
        std::int64_t off = used;
        if (p.row_bytes > 0) {
          off = align_up(used);
          std::int64_t fit = std::max<std::int64_t>(0, budget - off) / p.row_bytes;
          if (fit == 0) {
            if (n > 0) break;
            fit = 1;  // one row larger than the budget: a bucket of its own
          }
          take = std::min(take, fit);
        }
        std::int64_t* entry = h.data() + kHeaderFixed + 3 * n;
        entry[0] = cur.index;
        entry[1] = cur.next_row;
        entry[2] = cur.next_row + take;
        pieces.push_back(cur.bytes.narrow(0, cur.next_row * p.row_bytes, take * p.row_bytes));
        used = off + take * p.row_bytes;
        cur.next_row += take;
        ++n;
        if (cur.next_row == p.rows) {
          cur = {};
          stats.tensors_sent += 1;
        }
      }
      h[0] = kMagic;
      h[1] = seq;
      if (n == 0) {
        std::vector<std::string> missing;
        for (std::size_t i = 0; i < sent.size(); ++i)
          if (!sent[i]) missing.push_back(concat("'", manifest.entries()[i].name, "'"));
        if (!missing.empty()) {
          std::string list;
          for (std::size_t k = 0; k < missing.size() && k < 20; ++k) list += (k ? ", " : "") + missing[k];
          if (missing.size() > 20) list += concat(", ... (", missing.size() - 20, " more)");
          abort_stream(concat("the trainer's source (", full->describe(), ") ended without ",
                              missing.size(), " manifest tensor(s): ", list));
        }
        h[2] = kEnd;
      } else {
        h[2] = kData;
        h[3] = n;
        h[4] = used;
      }
    }
    at::Tensor head = trainer() ? from_vector(h, dev) : at::empty({kHeaderWords}, at::TensorOptions(at::kLong).device(dev));
    {
      ScopedMsTimer t(stats.broadcast_ms);
      group.broadcast(head, config.trainer_rank);
    }
    if (!trainer()) h = to_vector(head);
    if (h[0] != kMagic || h[1] != seq) {
      stage = Stage::done;
      GK_THROW(WeightError, "the weight broadcast is out of step: expected bucket ", seq,
                               ", got a header for bucket ", h[1], (h[0] != kMagic ? " (not graphkeep's)" : ""));
    }
    ++seq;
    if (h[2] == kAbort) {
      stage = Stage::done;
      std::string m(reinterpret_cast<const char*>(h.data() + kHeaderFixed + 3 * kMaxEntries), kMessageBytes);
      m = m.substr(0, m.find('\0'));
      GK_THROW_ABORTED(
          concat("the trainer (rank ", config.trainer_rank, ") aborted the weight broadcast: ", m),
          std::vector<RankVote>{RankVote{config.trainer_rank, false, "trainer", m, false}});
    }
    if (h[2] == kEnd) {
      stage = Stage::done;
      GK_CHECK(WeightError, open.empty(), "the weight broadcast ended with ", open.size(),
               " tensor(s) incomplete");
      return;
    }
    const std::int64_t n = h[3], bytes = h[4];
    GK_CHECK(WeightError, n > 0 && n <= kMaxEntries && bytes >= 0, "malformed bucket header");
    at::Tensor payload;
    if (trainer()) {
      payload = at::empty({bytes}, at::TensorOptions(at::kByte).device(dev));
      std::int64_t used = 0;
      for (std::int64_t k = 0; k < n; ++k) {
        const Plan& p = plans[h[kHeaderFixed + 3 * k]];
        if (p.row_bytes == 0) continue;
        const std::int64_t off = align_up(used);
        payload.narrow(0, off, pieces[k].numel()).copy_(pieces[k]);
        used = off + pieces[k].numel();
      }
    } else {
      payload = at::empty({bytes}, at::TensorOptions(at::kByte).device(dev));
    }
    if (bytes > 0) {
      ScopedMsTimer t(stats.broadcast_ms);
      group.broadcast(payload, config.trainer_rank);
    }
    stats.buckets += 1;
    stats.bytes_broadcast += static_cast<std::size_t>(bytes);
    stats.max_bucket_bytes = std::max(stats.max_bucket_bytes, static_cast<std::size_t>(bytes));
    if (receives()) unpack(h, payload);
  }

  void unpack(const std::vector<std::int64_t>& h, const at::Tensor& payload) {
    ScopedMsTimer t(stats.unpack_ms);
    const std::int64_t n = h[3];
    std::int64_t used = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t* entry = h.data() + kHeaderFixed + 3 * k;
      const std::int64_t i = entry[0], rb = entry[1], re = entry[2];
      GK_CHECK(WeightError, i >= 0 && i < static_cast<std::int64_t>(plans.size()) && rb >= 0 && re >= rb,
               "malformed bucket entry");
      const Plan& p = plans[i];
      const WeightEntry& e = manifest.entries()[i];
      GK_CHECK(WeightError, re <= p.rows, "malformed bucket entry for '", e.name, "'");
      auto [it, fresh] = open.try_emplace(i);
      Assembly& a = it->second;
      if (fresh) a.target = at::empty(p.shard_shape, at::TensorOptions(e.dtype).device(config.device));
      const std::int64_t rows = re - rb;
      if (p.row_bytes > 0 && rows > 0) {
        const std::int64_t off = align_up(used);
        used = off + rows * p.row_bytes;
        at::Tensor piece = payload.narrow(0, off, rows * p.row_bytes).view(e.dtype);
        if (e.shape.empty()) {
          piece = piece.reshape({});
          a.target.copy_(piece);
        } else {
          std::vector<std::int64_t> shape = e.shape;
          shape[0] = rows;
          piece = piece.view(shape);
          switch (p.split) {
            case Split::replicated: a.target.narrow(0, rb, rows).copy_(piece); break;
            case Split::column: {
              const std::int64_t lo = config.tp_rank * p.part, hi = lo + p.part;
              const std::int64_t s = std::max(rb, lo), t2 = std::min(re, hi);
              if (s < t2) a.target.narrow(0, s - lo, t2 - s).copy_(piece.narrow(0, s - rb, t2 - s));
              break;
            }
            case Split::row:
              a.target.narrow(0, rb, rows).copy_(piece.narrow(1, config.tp_rank * p.part, p.part));
              break;
          }
        }
      }
      a.seen += rows;
      if (a.seen == p.rows) {
        stats.tensors_yielded += 1;
        stats.bytes_yielded += a.target.nbytes();
        ready.push_back({p.target, std::move(a.target), 0});
        open.erase(it);
      }
    }
  }
};

BroadcastSource::BroadcastSource(Collective group, WeightManifest manifest, ShardFn shard, BroadcastConfig config,
                                 WeightSource* full)
    : impl_(std::make_unique<Impl>(std::move(group), std::move(manifest), std::move(shard), config, full)) {
  const Impl& m = *impl_;
  GK_CHECK(StateError, config.trainer_rank >= 0 && config.trainer_rank < m.group.size(),
           "BroadcastSource: trainer_rank ", config.trainer_rank, " is not a rank of the group (size ",
           m.group.size(), ")");
  GK_CHECK(StateError, config.tp_size >= 1 && config.tp_rank >= -1 && config.tp_rank < config.tp_size,
           "BroadcastSource: tp rank ", config.tp_rank, " of ", config.tp_size,
           " is invalid (tp_rank -1: a rank without a model)");
  GK_CHECK(StateError, config.bucket_bytes > 0, "BroadcastSource: bucket_bytes must be positive");
}

BroadcastSource::~BroadcastSource() = default;

std::optional<NamedTensor> BroadcastSource::next() {
  Impl& m = *impl_;
  if (m.stage == Impl::Stage::start) m.handshake();
  while (m.ready.empty() && m.stage == Impl::Stage::streaming) m.pump();
  if (m.ready.empty()) return std::nullopt;
  NamedTensor t = std::move(m.ready.front());
  m.ready.pop_front();
  return t;
}

void BroadcastSource::drain() {
  Impl& m = *impl_;
  if (m.stage == Impl::Stage::start) m.handshake();
  while (m.stage == Impl::Stage::streaming) {
    m.pump();
    m.ready.clear();
  }
  m.ready.clear();
}

std::string BroadcastSource::describe() const {
  return concat("the weight broadcast from rank ", impl_->config.trainer_rank, " (this rank ", impl_->group.rank(),
                ": ", impl_->role(), ")");
}
bool BroadcastSource::finished() const noexcept { return impl_->stage == Impl::Stage::done; }
std::string BroadcastSource::role() const { return impl_->role(); }
const BroadcastStats& BroadcastSource::stats() const noexcept { return impl_->stats; }
const BroadcastConfig& BroadcastSource::config() const noexcept { return impl_->config; }
const Collective& BroadcastSource::group() const noexcept { return impl_->group; }

// ---------------------------------------------------------------------------
// DistributedReload

struct DistributedReload::Impl {
  Impl(Collective g, ReloadEngine* e, DistributedOptions o) : group(std::move(g)), engine(e), options(std::move(o)) {}
  Collective group;
  ReloadEngine* engine;
  DistributedOptions options;
  bool diverged = false;
  std::string reason;
};

DistributedReload::DistributedReload(Collective group, ReloadEngine* engine, DistributedOptions options)
    : impl_(std::make_unique<Impl>(std::move(group), engine, std::move(options))) {}
DistributedReload::~DistributedReload() = default;

DistributedReport DistributedReload::reload(WeightSource& source) {
  Impl& m = *impl_;
  ReloadOptions o = m.options.reload ? *m.options.reload : (m.engine ? m.engine->options().defaults : ReloadOptions{});
  o.mode = ReloadMode::transactional;
  auto* bsrc = dynamic_cast<BroadcastSource*>(&source);
  const c10::Device dev = m.options.device ? *m.options.device : (bsrc ? bsrc->config().device : c10::Device(c10::kCPU));
  const std::string role = bsrc ? bsrc->role() : concat("rank ", m.group.rank());
  DistributedReport rep;

  bool voted = false;
  std::vector<RankVote> votes;
  std::exception_ptr local;
  bool peer = false;  // local is a ReloadAbortedError: it failed everywhere, first elsewhere
  auto vote = [&](bool ok, std::string reason) {
    voted = true;
    ScopedMsTimer t(rep.vote_ms);
    votes = gather_votes(m.group, dev, {m.group.rank(), ok, role, std::move(reason), !ok && peer});
  };
  auto throw_aborted = [&] {
    if (bsrc) rep.broadcast = bsrc->stats();
    // Every rank failed through the same group-wide error (the handshake):
    // it names the ranks already.
    const bool all_peer = std::all_of(votes.begin(), votes.end(), [](const RankVote& v) { return !v.ok && v.peer; });
    if (all_peer && local && peer) std::rethrow_exception(local);
    const std::vector<RankVote> failed = failures_of(votes);
    GK_THROW_ABORTED(concat("distributed reload aborted on every rank, each keeps its old weights: ",
                                    format_failures(failed)),
                             failed);
  };
  // Phase 1 ends here on a rank whose load, PWAL and checks all passed.
  const std::function<void()> user_hook = o.before_commit;
  o.before_commit = [&] {
    if (user_hook) user_hook();
    vote(true, {});
    if (!all_ok(votes)) throw_aborted();
  };

  try {
    if (m.engine != nullptr) {
      rep.reload = m.engine->reload(source, o);
    } else if (bsrc != nullptr) {
      bsrc->drain();
    } else {
      while (source.next()) {
      }
    }
  } catch (const ReloadAbortedError&) {
    local = std::current_exception();
    peer = true;
  } catch (...) {
    local = std::current_exception();
  }

  if (!voted) {
    // Failed before the vote (the engine rolled back), or a rank without a
    // model: finish the broadcast so every rank's collectives stay in step.
    if (local && bsrc != nullptr) {
      try {
        bsrc->drain();
      } catch (...) {
      }
    }
    vote(local == nullptr, describe_exception(local));
    if (!all_ok(votes)) throw_aborted();
  } else if (!all_ok(votes)) {
    throw_aborted();  // this rank voted yes; the engine rolled back in before_commit
  }

  // Every rank voted yes and committed: did every commit (and verify) work?
  std::vector<RankVote> outcome;
  {
    ScopedMsTimer t(rep.vote_ms);
    outcome = gather_votes(m.group, dev, {m.group.rank(), local == nullptr, role, describe_exception(local), false});
  }
  if (bsrc) rep.broadcast = bsrc->stats();
  if (!all_ok(outcome)) {
    m.diverged = true;
    m.reason = concat("every rank voted to commit, but after the vote the reload failed on ", format_failures(outcome),
                      "; the other ranks hold the new weights");
    GK_THROW(StateError, "distributed reload diverged: ", m.reason,
                            ". Replay is refused until a reload succeeds on every rank");
  }
  m.diverged = false;
  m.reason.clear();
  return rep;
}

bool DistributedReload::replay_allowed() const noexcept {
  return !impl_->diverged && (impl_->engine == nullptr || impl_->engine->replay_allowed());
}

void DistributedReload::check_replay_allowed() const {
  GK_CHECK(StateError, !impl_->diverged, "replay refused: ", impl_->reason);
  if (impl_->engine != nullptr) impl_->engine->check_replay_allowed();
}

std::string DistributedReport::summary() const {
  std::string out = reload ? reload->summary() : std::string("no model on this rank");
  out += concat("; broadcast: ", broadcast.buckets, " bucket(s), ", broadcast.bytes_broadcast, " B, ",
                broadcast.tensors_yielded, " shard(s) yielded (", broadcast.bytes_yielded, " B); vote ", vote_ms, " ms");
  return out;
}

}  // namespace gk
