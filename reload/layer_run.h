// reload/layer_run.h: what one reload call knows about one layer while it
// runs (internal to the reload layer): which of its checkpoint tensors have
// arrived, what it adopted, the post-PWAL tensors, the undo log.
#pragma once

#include "derivations.h"
#include "layer_record.h"
#include "storage_backups.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gk {

// LayerRun::Pending::tensor of a whole parameter delivered under its own name.
inline constexpr std::size_t kWholeParam = static_cast<std::size_t>(-1);

// Which shards of a layer's checkpoint tensors have arrived: one byte per
// shard, the shards of tensor `flat` at [first[flat], first[flat + 1]).
// `first` is the layer's, made once per plan (ReloadEngine::Impl::
// index_expected) and shared by every reload's runs: a reload allocates
// one array per layer, not one per checkpoint tensor (18,000 at the MoE).
class CompletionSet {
 public:
  CompletionSet() = default;
  explicit CompletionSet(std::shared_ptr<const std::vector<std::size_t>> first)
      : first_(std::move(first)), arrived_(first_->empty() ? 0 : first_->back(), 0) {}

  std::int64_t shards(std::size_t flat) const { return static_cast<std::int64_t>((*first_)[flat + 1] - (*first_)[flat]); }
  bool has(std::size_t flat, std::int64_t shard) const { return arrived_[at(flat, shard)] != 0; }
  void mark(std::size_t flat, std::int64_t shard) { arrived_[at(flat, shard)] = 1; }
  bool any(std::size_t flat) const { return count(flat) > 0; }
  bool complete(std::size_t flat) const { return count(flat) == shards(flat); }
  void mark_all(std::size_t flat) {
    for (std::size_t i = (*first_)[flat]; i < (*first_)[flat + 1]; ++i) arrived_[i] = 1;
  }

 private:
  std::size_t at(std::size_t flat, std::int64_t shard) const { return (*first_)[flat] + static_cast<std::size_t>(shard); }
  std::int64_t count(std::size_t flat) const {
    std::int64_t n = 0;
    for (std::size_t i = (*first_)[flat]; i < (*first_)[flat + 1]; ++i) n += arrived_[i];
    return n;
  }
  std::shared_ptr<const std::vector<std::size_t>> first_;
  std::vector<char> arrived_;
};

struct LayerRun {
  enum class Phase { waiting, processed, copied_back };
  Phase phase = Phase::waiting;
  bool detached = false;
  CompletionSet shards;  // which shards of its checkpoint tensors arrived
  std::size_t loaded = 0, expected = 0;  // checkpoint tensors complete, and in all
  struct Pending {
    std::size_t param, tensor;  // tensor: kWholeParam for a whole parameter
    std::int64_t shard;
    at::Tensor value;
    std::string name;  // as delivered
  };
  std::vector<Pending> pending;
  // Source tensors the layer's parameters adopted (Note [Adopting source
  // tensors] in layer_pipeline.cpp), with their version counters at adoption.
  struct Adopted {
    at::Tensor value, param;  // the source's tensor; the parameter that adopted it
    std::int64_t value_version, param_version;
    std::string name;
    std::uint64_t hash = 0;  // its content hash at adoption (stage() only; Note [Adopted tensors are hashed])
  };
  std::vector<Adopted> adopted;
  // A staged commit's check of the adopted tensors it copies, made by the
  // copy itself (Note [Adopted tensors are hashed] in staged_reload.cpp):
  // which of `adopted`, and the hashes of what the copy read.
  std::vector<std::size_t> adopted_copied;
  std::shared_ptr<detail::CopiedHashes> adopted_hashes;
  std::vector<std::shared_ptr<const void>> configs;  // snapshot, per PlannedConfig (null: did not resolve)
  std::vector<at::Tensor> current;                   // per slot: the post-PWAL tensor (a storage view)
  std::vector<char> mismatched;                      // per slot
  detail::FromShapesCheck from_shapes;               // launched by the check, read before the copy-back
  StorageBackups backups;                            // captured storages this layer may write, before it did
  bool pwal_unguarded = false;  // PWAL ran on writable captured storage without a backup (restore_in_place_writes off)
  std::vector<std::shared_ptr<const void>> configs_after;  // staged: the configuration values PWAL left
  LayerRecord record;  // content hashes and landings (Note [Patch landings] in layer_record.h)
};

}  // namespace gk
