// graphkeep/distributed/distributed.h
//
// Reloading a tensor-parallel engine from a trainer rank, through libtorch's
// own distributed engine (c10d): ProcessGroupGloo on CPUs, ProcessGroupNCCL
// on GPUs, the same code path (only c10d::ProcessGroup / c10d::Backend
// collectives are used: broadcast and allgather).
//
//   // every rank: the manifest of the full (unsharded) checkpoint, the rules
//   gk::WeightManifest manifest = ...;       // names, shapes, dtypes
//   gk::ShardRules rules;
//   rules.column("*.qkv.weight").row("*.o_proj.weight");   // the rest: replicated
//   gk::BroadcastConfig cfg{.trainer_rank = 0, .tp_rank = tp, .tp_size = 2};
//
//   // the trainer rank also passes the full weights (any WeightSource)
//   gk::BroadcastSource src(pg, manifest, rules, cfg, is_trainer ? &full : nullptr);
//
//   // two-phase commit: succeeds on every rank or on none
//   gk::DistributedReload dist(pg, engine_or_nullptr);   // nullptr on a trainer without a model
//   gk::DistributedReport r = dist.reload(src);           // collective: every rank calls it
//
// BroadcastSource: the trainer streams its tensors in buckets (several
// tensors, or row ranges of a large one, flattened into one byte buffer of at
// most `bucket_bytes`), one broadcast per bucket plus a small header; every
// inference rank keeps only its shard of each tensor (replicated, or split
// along dim 0 or dim 1 by the rule for its name) and yields it under the name
// its model expects. No inference rank ever holds the whole model: at most
// one bucket and the shards not yet taken by the engine. Before the first
// bucket the trainer broadcasts its manifest; a rank whose manifest differs,
// or that cannot shard a tensor by its rules, makes every rank fail with a
// gk::ReloadAbortedError (a gk::WeightError) naming the rank and the
// difference.
//
// DistributedReload: each inference rank runs gk::ReloadEngine::reload in
// transactional mode (load, PWAL, checks: phase 1); in ReloadOptions::
// before_commit every rank votes (an allgather of status and reason). Only a
// unanimous yes commits; otherwise every rank rolls back, keeps its old
// weights and throws gk::ReloadAbortedError naming the failing rank(s) and
// why. A rank that fails before the vote still finishes the broadcast
// (drain) and votes no, so the collectives of all ranks stay in step.
//
// See docs/distributed.md for the design, the guarantees and their limits.
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/report.h>
#include <graphkeep/sources/weight_source.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace gk {

// ---------------------------------------------------------------------------
// The communicator: a c10d::ProcessGroup (which picks its backend by the
// device of the tensors: Gloo for CPU, NCCL for CUDA) or a single
// c10d::Backend. Every operation is a collective over the whole group.
class Collective {
 public:
  Collective(c10::intrusive_ptr<c10d::ProcessGroup> group);  // NOLINT: implicit on purpose
  Collective(c10::intrusive_ptr<c10d::Backend> backend);     // NOLINT
  Collective(const Collective&);
  Collective& operator=(const Collective&);
  ~Collective();

  int rank() const;
  int size() const;
  // In place: `t` (contiguous) holds root's values on every rank afterwards.
  void broadcast(at::Tensor& t, int root) const;
  // Every rank's `t` (same shape, dtype and device on every rank), by rank.
  std::vector<at::Tensor> allgather(const at::Tensor& t) const;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::intrusive_ptr<c10d::Backend> backend_;
};

// ---------------------------------------------------------------------------
// The manifest of a full (unsharded) checkpoint: one entry per tensor, kept
// sorted by name, so two manifests of the same checkpoint serialize equally
// whatever order their tensors came in.
struct WeightEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  friend bool operator==(const WeightEntry&, const WeightEntry&) = default;
};

class WeightManifest {
 public:
  WeightManifest() = default;
  // Throws gk::WeightError on a duplicate name or a name with a tab or newline.
  explicit WeightManifest(std::vector<WeightEntry> entries);
  // From the tensors of a full checkpoint (each tensor once, shard 0).
  static WeightManifest of(const std::vector<NamedTensor>& tensors);
  // The inverse of serialize(); throws gk::WeightError on malformed text.
  static WeightManifest parse(std::string_view text);

  const std::vector<WeightEntry>& entries() const noexcept { return entries_; }
  std::size_t size() const noexcept { return entries_.size(); }
  // Index into entries(), or -1.
  std::int64_t index_of(std::string_view name) const;
  std::size_t total_bytes() const;

  // One line per tensor: "name<TAB>dtype<TAB>[d0, d1]".
  std::string serialize() const;
  std::uint64_t hash() const;  // FNV-1a 64 of serialize()
  // The differences of `mine` from `reference` ("" when equal), up to
  // `limit` of them, e.g. "'l2.weight' has shape [8, 16] on the trainer but
  // [8, 12] here; 'l3.bias' is missing here".
  static std::string diff(const WeightManifest& reference, const WeightManifest& mine, std::size_t limit = 8);

  friend bool operator==(const WeightManifest& a, const WeightManifest& b) { return a.entries_ == b.entries_; }

 private:
  std::vector<WeightEntry> entries_;
};

// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
struct BroadcastConfig {
  int trainer_rank = 0;  // group rank that holds the full weights and sends them
  int tp_rank = 0;       // this rank's tensor-parallel rank; -1: no model here (a dedicated trainer)
  int tp_size = 1;
  std::size_t bucket_bytes = std::size_t{64} << 20;  // a larger single row gets a bucket of its own
  // Where buckets and the yielded shards live: the model's device (cuda:N
  // with NCCL; CPU with Gloo). Must be a device the group's backend serves.
  c10::Device device = c10::Device(c10::kCPU);
};

struct BroadcastStats {
  std::size_t buckets = 0;
  std::size_t bytes_broadcast = 0;   // payload bytes (headers not counted)
  std::size_t max_bucket_bytes = 0;
  std::size_t tensors_sent = 0;      // on the trainer
  std::size_t tensors_yielded = 0;   // shards handed to the engine here
  std::size_t bytes_yielded = 0;
  double handshake_ms = 0, broadcast_ms = 0, unpack_ms = 0;
};

// A WeightSource fed by broadcasts from the trainer rank. One instance per
// reload and rank; every rank of the group must consume it to the end (the
// engine does, or drain()), because each bucket is a collective.
class BroadcastSource final : public WeightSource {
 public:
  // `full`: on the trainer rank, the full checkpoint (each manifest tensor
  // exactly once, unsharded, any order, any device); nullptr elsewhere.
  BroadcastSource(Collective group, WeightManifest manifest, ShardFn shard, BroadcastConfig config,
                  WeightSource* full = nullptr);
  ~BroadcastSource() override;

  // This rank's next shard. The first call runs the manifest handshake.
  // Errors raise on every rank: a manifest difference or a tensor the rules
  // cannot shard (gk::ReloadAbortedError naming the ranks), a bad tensor in
  // the trainer's source (gk::WeightError on the trainer,
  // gk::ReloadAbortedError naming the trainer elsewhere).
  std::optional<NamedTensor> next() override;
  std::string describe() const override;

  // Takes part in the rest of the broadcast without yielding anything: what
  // a rank whose engine failed, or a trainer without a model, does. Throws
  // like next() (the stream is then finished on every rank).
  void drain();
  bool finished() const noexcept;

  // "trainer", "tp 1/2", "trainer + tp 0/2": for messages.
  std::string role() const;
  const BroadcastStats& stats() const noexcept;
  const BroadcastConfig& config() const noexcept;
  const Collective& group() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
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

struct DistributedReport {
  std::optional<ReloadReport> reload;  // absent on a rank without a model
  BroadcastStats broadcast;            // when the source was a BroadcastSource
  double vote_ms = 0;
  std::string summary() const;
};

struct DistributedOptions {
  // For every reload, with mode forced to transactional; default: the
  // engine's own options. A before_commit set here runs before the vote.
  std::optional<ReloadOptions> reload;
  // Where the vote tensors live; default: the BroadcastSource's device, or
  // CPU for another source. Must be a device the group's backend serves.
  std::optional<c10::Device> device;
};

// Two-phase commit of a reload across every rank of `group`.
class DistributedReload {
 public:
  // `engine`: this rank's prepared engine, or nullptr on a rank without a
  // model (a dedicated trainer, which only sends and votes).
  DistributedReload(Collective group, ReloadEngine* engine, DistributedOptions options = {});
  ~DistributedReload();

  // Collective: every rank of the group calls it, each with its own source
  // (usually a BroadcastSource over the same group). Returns on every rank
  // with the new weights committed, or throws on every rank:
  //   gk::ReloadAbortedError  phase 1 failed somewhere; every rank rolled back
  //   gk::StateError          every rank voted yes but a commit failed after
  //                           the vote on some rank (see docs/distributed.md);
  //                           replay is refused until a reload succeeds
  // A failure of the communication itself surfaces as the backend's error.
  DistributedReport reload(WeightSource& source);

  // The engine's state, and no rank diverged in the last reload.
  bool replay_allowed() const noexcept;
  void check_replay_allowed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The votes of every rank (an allgather over `group` on `device`).
std::vector<RankVote> gather_votes(const Collective& group, c10::Device device, const RankVote& mine);

}  // namespace gk
