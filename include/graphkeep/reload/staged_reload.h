// graphkeep/reload/staged_reload.h
//
// Online reload: the new weights are loaded, processed (PWAL) and checked
// into new storage while the serving thread goes on replaying the captured
// graphs on the old weights; the serving thread then commits them between two
// replays, and the pause is the copy into the captured storage alone.
//
//   // staging thread (the trainer's side): may take seconds
//   gk::StagedReload staged = engine.stage(source);   // throws: nothing changed
//   // serving thread, between two replays (it holds its own replay lock):
//   gk::ReloadReport r = engine.commit(std::move(staged));
//   r.times.commit_ms;            // the pause
//   engine.weight_version();      // +1, readable from any thread
//   // or, to drop the new weights:  staged.abort();  (or let it go out of scope)
//
// A StagedReload holds the staged tensors (a full new copy of everything the
// reload changes) until it is committed, aborted or destroyed. It never
// writes a captured storage: the graphs read the old values until commit().
// Threading rules and failure guarantees: Note [Online reload threading] in
// reload/staged_reload.cpp and docs/reload.md, "Online reload".
#pragma once

#include <graphkeep/reload/report.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gk {

class ReloadEngine;

namespace detail {
struct StagedState;
}

class StagedReload {
 public:
  // An empty object: holds nothing; commit() on it is a gk::StateError.
  StagedReload() noexcept;
  StagedReload(StagedReload&& other) noexcept;
  // Aborts what this object held, then takes other's.
  StagedReload& operator=(StagedReload&& other) noexcept;
  StagedReload(const StagedReload&) = delete;
  StagedReload& operator=(const StagedReload&) = delete;
  // Aborts (see abort()).
  ~StagedReload();

  // True while it holds a staged reload that was neither committed nor
  // aborted (it may still be stale: commit() says why).
  bool pending() const noexcept;
  explicit operator bool() const noexcept { return pending(); }

  // Commits through the engine that staged it: ReloadEngine::commit(std::move(*this)).
  ReloadReport commit();
  // Releases the staged tensors; the model and the captured storage stay as
  // they were (they were never written). Idempotent, never throws; call it on
  // the serving thread or wherever the engine's rules allow (docs/reload.md).
  void abort() noexcept;

  // The weight version the reload was staged against; a commit makes the
  // engine's version base_version() + 1 (and is refused if the engine has
  // moved on since).
  std::uint64_t base_version() const noexcept;
  // Bytes held by the staged tensors (the memory cost of being staged).
  std::size_t staged_bytes() const noexcept;
  // What stage() did: tensors and bytes loaded, phase times, times.stage_ms.
  const ReloadReport& report() const;

 private:
  friend class ReloadEngine;
  explicit StagedReload(std::unique_ptr<detail::StagedState> state) noexcept;
  std::unique_ptr<detail::StagedState> state_;
};

}  // namespace gk
