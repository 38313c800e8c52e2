// The trainer's weights, broadcast in buckets and sharded on arrival
// (broadcast_source.h): the manifest handshake, then the stream (Note [The
// collective sequence] in wire.h).
#include <graphkeep/distributed/broadcast_source.h>

#include <graphkeep/core/stopwatch.h>

#include "wire.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gk {

using detail::concat;
using namespace detail::wire;

namespace {

constexpr std::int64_t kMagic = 0x676b2d6263737431;  // "gk-bcst1"
constexpr std::int64_t kMaxEntries = 512;            // tensor pieces per bucket
constexpr std::int64_t kMessageBytes = 1024;         // abort message in the header
constexpr std::int64_t kHeaderFixed = 8;
constexpr std::int64_t kHeaderWords = kHeaderFixed + 3 * kMaxEntries + kMessageBytes / 8;
constexpr std::int64_t kAlign = 16;  // piece offsets: any dtype can be viewed in place

enum BucketKind : std::int64_t { kData = 0, kEnd = 1, kAbort = 2 };

std::int64_t align_up(std::int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

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

}  // namespace gk
