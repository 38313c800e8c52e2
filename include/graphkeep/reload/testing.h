// graphkeep/reload/testing.h
//
// Hooks for tests and demonstrations: they make a ReloadEngine misbehave on
// purpose, to show that a failure is real and that graphkeep catches it. A
// product never sets them; they are kept apart from ReloadOptions so that no
// per-call setting can switch a protection off.
//
//   gk::testing::EngineHooks h;
//   h.fault = [](gk::testing::FaultPoint s, const std::string& layer) {
//     if (s == gk::testing::FaultPoint::pwal && layer == "layers.3") throw std::runtime_error("injected");
//   };
//   gk::testing::set_hooks(engine, h);   // every later call of this engine
//   gk::testing::set_hooks(engine, {});  // back to none
#pragma once

#include <functional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include <graphkeep/reload/reload_options.h>
#include <graphkeep/reload/report.h>

namespace at {
class Tensor;
}  // namespace at

namespace torch::nn {
class Module;
}

namespace gk {
class ReloadEngine;
class WeightSource;
}

namespace gk::testing {

// Where a reload can be made to fail (layer pipeline order). Not the
// stages of stage(): points in any call, named for the fault hook.
enum class FaultPoint {
  detach,  // snapshot checks, parameters detached from the captured storage
  load,    // the layer's weights loaded
  pwal,    // before process_weights_after_loading
  check,   // layout and configuration checks
  copy,    // before the layer's copy into the captured storage
  before_copies,  // transactional: once per layer, after the completion gate, before any layer is copied back
  scatter, // a patch's commit: once per layer it touches, after its scatter wrote captured storage
};
std::string_view to_string(FaultPoint s) noexcept;

struct EngineHooks {
  // Full slot names (ReloadEngine::slot_names()) whose copy-back reload()
  // skips: the fields keep PWAL's new tensors, as without graphkeep, and the
  // capture manifest then reports the drift. stage() is refused while any is
  // set. Each must name a slot: an unknown one is a gk::StateError naming
  // the closest (at set_hooks() on a prepared engine, else at prepare()).
  std::vector<std::string> unprotected_slots;
  // Full slot names of declared members that prepare() leaves out of the
  // plan as if their class had declared them not graph-visible: the graphs'
  // reads of them are unknown addresses, as an undeclared tensor's would be.
  // Each must name a declared member's slot (not a parameter or buffer):
  // an unknown one is a gk::StateError at prepare() naming the closest.
  // Takes effect at the next prepare().
  std::vector<std::string> undeclared_members;
  // track() records a graph the manifest cannot vouch for (Note [Fail
  // closed at capture]) and only reports it in the manifest, instead of
  // refusing replay.
  bool report_unknown_addresses = false;
  // Called at each FaultPoint with the layer's prefix, on the reloading thread;
  // throwing from it injects a fault there.
  std::function<void(FaultPoint point, const std::string& layer)> fault;
  // Called by stage(patch) once the commit's writes are made, with the
  // values of each write in order (sectors: whole 32-byte images, as int64
  // words; else elements as integers of their size, possibly the patch's
  // own tensors: replace them with a changed copy, do not write them). A
  // test may change them as a fault in making them would: the stage's
  // target hashes read these very bytes (Note [Hashing through the writes]
  // in graphkeep/hashing/overlaid_hash.h), so the patch is then refused.
  std::function<void(at::Tensor& values, bool sectors)> patch_writes;
  // A streaming reload from a resident source takes its non-finite scan as
  // still running on the device while this many more layers are processed
  // ahead of its verdict (Note [Processing while the scan runs] in
  // reload/weight_stream.cpp): on a CPU, where the scan answers at once, a
  // test takes the path a GPU takes.
  std::size_t scan_pending_layers = 0;

  // Protections switched off, for tests that show what a protection catches
  // and benchmarks that measure what it costs (Note [Options per call,
  // protections per engine] in reload/run_options.h). No product option can.
  bool skip_manifest_verification = false;  // no capture-manifest verification after reloads
  bool skip_config_checks = false;          // a configuration value PWAL changed is accepted
  // No backup of the captured storages PWAL may write in place: a layer that
  // fails after its PWAL started leaves the model inconsistent (docs/reload.md).
  bool skip_in_place_backups = false;
  // Adopted tensors are not hashed at stage and commit: a write between the
  // two is served (Note [Adopted tensors are hashed]).
  bool skip_adopted_content_check = false;
  // No content hashes: the served content is unknown, patches are refused.
  bool skip_served_hashes = false;
  // A protection on: after a commit wrote captured storage, the served
  // tensors that land unchanged there are hashed again and compared with
  // the staged hashes (a patch is rolled back on a difference). One read of
  // the written tensors inside the pause.
  bool verify_served = false;
  // Source elements per call of a block derivation's function while a patch
  // lands (0: the engine's, millions): a test sets a few blocks' worth to
  // take the landing through several chunks.
  std::int64_t land_chunk_elements = 0;
};

// Hooks that only leave `slots` out of copy-back, or only treat `members`
// as undeclared.
inline EngineHooks unprotect(std::vector<std::string> slots) {
  EngineHooks h;
  h.unprotected_slots = std::move(slots);
  return h;
}
inline EngineHooks undeclare(std::vector<std::string> members) {
  EngineHooks h;
  h.undeclared_members = std::move(members);
  return h;
}

// Installs `hooks` on `engine` for every later call (replacing any before).
void set_hooks(ReloadEngine& engine, EngineHooks hooks);
const EngineHooks& hooks(const ReloadEngine& engine);

// Installs hooks on an engine for a scope, and removes them at its end. A
// null engine: nothing.
class ScopedHooks {
 public:
  ScopedHooks(ReloadEngine* engine, EngineHooks hooks) : engine_(engine) {
    if (engine_ != nullptr) set_hooks(*engine_, std::move(hooks));
  }
  ScopedHooks(ScopedHooks&& o) noexcept : engine_(o.engine_) { o.engine_ = nullptr; }
  ScopedHooks& operator=(ScopedHooks&&) = delete;
  ~ScopedHooks() {
    if (engine_ != nullptr) set_hooks(*engine_, {});
  }

 private:
  ReloadEngine* engine_;
};

// gk::load_weights with the protections `hooks` switch (its other fields do
// not apply to a first load).
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const LoadOptions& options,
                          const EngineHooks& hooks);

}  // namespace gk::testing
