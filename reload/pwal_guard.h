// reload/pwal_guard.h: what protects the captured storage while a layer's
// PWAL runs, for each kind of pass (internal to the reload layer).
#pragma once

#include "layer_run.h"
#include "staging_copies.h"

#include "run_options.h"

#include <graphkeep/reload/reload_options.h>
#include <graphkeep/reload/slot_plan.h>

#include <functional>
#include <string>

namespace gk {

// Note [PWAL guards]
// ~~~~~~~~~~~~~~~~~~
// Three passes run the same layer pipeline (layer_pipeline.cpp) and differ
// in one thing: what keeps the captured storage safe while PWAL, which may
// write in place into any tensor it can reach, runs.
//   - FirstLoadGuard (gk::load_weights): nothing is captured yet. Nothing to
//     protect, and no slot to check, adopt into or copy back.
//   - ReloadGuard (reload()): the captured storages PWAL can reach are
//     copied before it runs and written back if the layer fails (Note [Undo
//     by storage]); with restore_in_place_writes off, the layer is only
//     marked unguarded, so that its failure refuses replay.
//   - StageGuard (stage()): no captured byte may be written at all. PWAL is
//     handed copies (Note [Staging copies]); after the checks, a post-PWAL
//     tensor that still views captured storage was reached through a handle
//     that is no slot location, and the stage is refused. It also hashes
//     the tensors the layer adopted (Note [Adopted tensors are hashed]).
// The pipeline asks the guard, never which pass it is in.
class PwalGuard {
 public:
  virtual ~PwalGuard() = default;
  // False for the first load: there is no captured storage, so the pipeline
  // checks no slot, adopts nothing and commits nothing.
  virtual bool captured() const noexcept { return true; }
  // After the layer's weights are loaded, before the non-finite check and PWAL.
  virtual void after_load(LayerRun& /*run*/, const detail::RunOptions& /*o*/, ReloadReport& /*rep*/) {}
  // Right before the layer's PWAL.
  virtual void before_pwal(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o) = 0;
  // After the layer's checks (run.current holds the post-PWAL tensors).
  virtual void after_check(LayerPlan& /*lp*/, LayerRun& /*run*/) {}
};

class FirstLoadGuard final : public PwalGuard {
 public:
  bool captured() const noexcept override { return false; }
  void before_pwal(LayerPlan&, LayerRun&, const detail::RunOptions&) override {}
};

class ReloadGuard final : public PwalGuard {
 public:
  void before_pwal(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o) override;
};

class StageGuard final : public PwalGuard {
 public:
  // `on_unrestored(reason)`: called when PWAL may have written what the
  // graphs read and its values could not be written back (the engine's
  // mark_inconsistent).
  StageGuard(const SlotPlan& plan, std::function<void(std::string)> on_unrestored)
      : copies_(plan), on_unrestored_(std::move(on_unrestored)) {}
  void after_load(LayerRun& run, const detail::RunOptions& o, ReloadReport& rep) override;
  void before_pwal(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o) override;
  void after_check(LayerPlan& lp, LayerRun& run) override;
  StagingCopies& copies() noexcept { return copies_; }

 private:
  StagingCopies copies_;
  std::function<void(std::string)> on_unrestored_;
};

// True when PWAL can reach slot s's captured storage: a declared member, a
// buffer or parameter the checkpoint does not fill (not detached), or a
// detached parameter that a declared member holds through its own handle.
bool pwal_can_write(const LayerPlan& lp, const PlannedSlot& s);

}  // namespace gk
