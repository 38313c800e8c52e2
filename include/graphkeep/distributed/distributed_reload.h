// graphkeep/distributed/distributed_reload.h
//
// Two-phase commit of a reload across the ranks of a group: each inference
// rank runs gk::ReloadEngine::reload in transactional mode (load, PWAL,
// checks: phase 1); in ReloadOptions::before_commit every rank votes. Only a
// unanimous yes commits; otherwise every rank rolls back, keeps its old
// weights and throws gk::ReloadAbortedError naming the failing rank(s) and
// why. A rank that fails before the vote still finishes the broadcast
// (drain) and votes no, so the collectives of all ranks stay in step.
//
//   gk::DistributedReload dist(group, engine_or_nullptr);   // nullptr on a trainer without a model
//   gk::DistributedReport r = dist.reload(src);             // collective: every rank calls it
#pragma once

#include <graphkeep/distributed/broadcast_source.h>
#include <graphkeep/distributed/collective.h>
#include <graphkeep/distributed/votes.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/report.h>
#include <graphkeep/sources/weight_source.h>

#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>

namespace gk {

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

}  // namespace gk
