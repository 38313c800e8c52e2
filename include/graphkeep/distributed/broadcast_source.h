// graphkeep/distributed/broadcast_source.h
//
// A WeightSource fed by the trainer rank's broadcasts: the trainer streams
// its tensors in buckets (several tensors, or row ranges of a large one,
// flattened into one byte buffer of at most `bucket_bytes`), one broadcast
// per bucket plus a small header; every inference rank keeps only its shard
// of each tensor (by the ShardRules for its name) and yields it under the
// name its model expects. No inference rank ever holds the whole model.
// Before the first bucket the trainer broadcasts its manifest; a rank whose
// manifest differs, or that cannot shard a tensor by its rules, makes every
// rank fail with a gk::ReloadAbortedError naming the rank and the difference.
//
//   gk::BroadcastConfig cfg{.trainer_rank = 0, .tp_rank = tp, .tp_size = 2};
//   gk::BroadcastSource src(group, manifest, rules, cfg, is_trainer ? &full : nullptr);
//   engine.reload(src);   // or gk::DistributedReload (distributed_reload.h)
#pragma once

#include <graphkeep/distributed/collective.h>
#include <graphkeep/distributed/shard_rules.h>
#include <graphkeep/distributed/weight_manifest.h>
#include <graphkeep/sources/weight_source.h>

#include <c10/core/Device.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

namespace gk {

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

}  // namespace gk
