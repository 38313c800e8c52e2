// graphkeep/reload/reload_engine.h
//
// The reload engine: reloads a libtorch model's weights so that every tensor
// a captured graph may read keeps its address and holds the new values.
//
//   gk::ReloadEngine engine(model);        // model: a torch::nn::Module tree
//   engine.prepare();                       // after the first load + PWAL, before capture
//   graph.capture([&] { out = model.forward(in); });
//   engine.track(graph);                    // its capture manifest is verified after reloads
//   ...
//   gk::InMemorySource src(new_weights);
//   gk::ReloadReport r = engine.reload(src);  // throws on any failure; see below
//   engine.check_replay_allowed();          // throws if replay must not resume
//   graph.replay();
//
// Online reload (staged_reload.h): stage on another thread while the graphs
// keep replaying, then commit between two replays; the pause is the commit.
//
//   gk::StagedReload staged = engine.stage(src);   // staging thread
//   engine.commit(std::move(staged));              // serving thread
//
// Weight patches (graphkeep/delta, docs/delta.md): only what changed, checked
// against the content the engine serves, applied exactly through the
// tensors PWAL derives; the stage and the pause scale with the change.
//
//   gk::ReloadReport first = gk::load_weights(model, source);
//   engine.prepare(first);                             // the served content, by hash
//   engine.reload(gk::read_patch("step-42.safetensors"));   // or stage(patch) + commit
//   engine.served()->label();                          // "step-42"
//
// Per layer, a reload snapshots the captured tensors, detaches the
// checkpoint-format parameters from their storage, buffers the incoming
// weights and, once the layer's weights are complete, materializes, loads and
// runs PWAL, checks every slot's layout against the captured one, copies the
// new values into the captured storage, points the fields back at the
// captured tensors, applies init policies, and releases the new storage.
//
// Failure guarantees (see docs/reload.md):
//   transactional  any error: every layer keeps its old weights, the model
//                  stays usable and replay stays allowed.
//   streaming      an error before a layer's copy-back leaves that layer on its
//                  old weights; layers already committed hold new weights, so
//                  the engine marks the model inconsistent and refuses replay
//                  until a reload succeeds. Captured storage is never freed.
//   both           a mismatch (PWAL changed a slot's layout) throws
//                  gk::MismatchError, or with MismatchPolicy::needs_recapture
//                  finishes and reports the paths; replay is then refused until
//                  prepare() runs again after recapture.
#pragma once

#include <graphkeep/delta/patch.h>
#include <graphkeep/reload/errors.h>
#include <graphkeep/reload/reload_options.h>
#include <graphkeep/reload/report.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/reload/slot_plan.h>
#include <graphkeep/reload/staged_reload.h>
#include <graphkeep/sources/weight_source.h>

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}

namespace gk {

class ReloadEngine;
namespace testing {
struct EngineHooks;
void set_hooks(ReloadEngine& engine, EngineHooks hooks);
const EngineHooks& hooks(const ReloadEngine& engine);
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const LoadOptions& options,
                          const EngineHooks& hooks);
}  // namespace testing

class ReplayBackend;
class CaptureManifest;
struct VerifyResult;

enum class EngineState {
  unprepared,       // prepare() has not run
  ready,            // replay allowed
  inconsistent,     // a streaming reload failed midway; reload again
  needs_recapture,  // a mismatch was accepted; recapture, then prepare()
  drift,            // manifest verification failed; replay refused
};
std::string_view to_string(EngineState s) noexcept;

// The first load, before prepare(): materializes every layer's
// checkpoint-format parameters, loads `source` through the layers' loaders
// with the same completion gate and checks as a reload, and runs PWAL.
// Nothing is captured yet, so nothing is copied back.
// The report's `served` (the content hash of every checkpoint tensor, and
// the bases kept for patches) goes to the engine through
// ReloadEngine::prepare(const ReloadReport&).
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source);
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const LoadOptions& options);

class ReloadEngine {
 public:
  explicit ReloadEngine(torch::nn::Module& model, EngineOptions options = {});
  ~ReloadEngine();
  ReloadEngine(const ReloadEngine&) = delete;
  ReloadEngine& operator=(const ReloadEngine&) = delete;

  // Builds the slot plan. Call after the first load and PWAL, before any
  // capture; call again after a recapture (the served content is kept).
  void prepare();
  // The same, and the engine serves the content `first_load` (the report of
  // gk::load_weights on this model) recorded: its content hashes and kept
  // bases, so that the first patch can be checked against them. Nothing may
  // write the weights between load_weights() and prepare(). gk::StateError
  // when the report has no served content (hash_served off) or names other
  // checkpoint tensors than the model expects.
  void prepare(const ReloadReport& first_load);

  ReloadReport reload(WeightSource& source);
  ReloadReport reload(WeightSource& source, const ReloadOptions& options);
  // Applies a weight patch: stage(patch) and commit() in one call (Note
  // [Applying a patch] in reload/patch_stage.cpp). Always transactional:
  // refused with nothing changed, or committed whole.
  ReloadReport reload(const Patch& patch);
  ReloadReport reload(const Patch& patch, const PatchOptions& options);

  // Online reload (staged_reload.h; Note [Online reload threading] in
  // reload/staged_reload.cpp). stage() loads `source`, runs PWAL and every check
  // reload() runs (completion gate, layouts, configurations) into new
  // storage and returns the staged tensors; it never writes a captured
  // storage, so another thread may keep replaying the captured graphs
  // meanwhile (and only that: no eager forward while stage() runs). On
  // return the model's fields point at the captured tensors again, holding
  // the old values. Throws, changing nothing, on any error, and
  // gk::StateError while another staged reload of this engine is
  // outstanding or the engine is not ready. A stage is transactional by
  // nature and never accepts a mismatch, so it takes StageOptions: a
  // ReloadOptions is refused at compile time (pass options.stage()).
  StagedReload stage(WeightSource& source);
  StagedReload stage(WeightSource& source, const StageOptions& options);
  template <class Options>
    requires std::same_as<Options, ReloadOptions>
  StagedReload stage(WeightSource&, const Options&) {
    static_assert(!std::same_as<Options, ReloadOptions>,
                  "graphkeep: stage(source, options) takes gk::StageOptions. A stage is transactional and refuses "
                  "mismatches, so ReloadOptions::mode and on_mismatch would be ignored: pass options.stage()");
    return {};
  }
  // Stages a weight patch (Note [Applying a patch] in reload/patch_stage.cpp):
  // checks it (format, names, shapes, dtypes, index ranges, duplicates, and
  // each tensor's base hash against served()), computes every touched
  // tensor's result and checks it against the patch's target hash, and
  // re-runs PWAL for the layers whose tensors PWAL transforms, all without
  // writing a captured storage. The commit then scatters the changed
  // elements into captured storage and copies the re-run layers' derived
  // tensors. Refused with a gk::WeightError naming the tensor and the patch
  // (its label names the file), changing nothing; the same threading rules
  // as stage(source).
  StagedReload stage(const Patch& patch);
  StagedReload stage(const Patch& patch, const PatchOptions& options);
  // Commits a staged reload, on the serving thread between two replays:
  // copies the staged values into the captured storage (batched copy-back),
  // applies init policies, verifies the capture manifests and bumps
  // weight_version(). Refused with gk::StateError, changing nothing, when
  // `staged` is empty, belongs to another engine, or is stale (a reload()
  // or commit ran since, prepare() ran again, the tracked graphs changed, or
  // the engine is not ready). The report's times.commit_ms is the pause.
  ReloadReport commit(StagedReload&& staged);
  // Increments by one for every reload() and commit() that changed the
  // weights the graphs read (one that failed after writing, leaving the
  // model inconsistent, counts too, as does a stage() whose PWAL wrote a
  // captured storage it could not write back). Atomic: readable from any
  // thread.
  std::uint64_t weight_version() const noexcept;
  // What the engine serves, by content (served_weights.h): the content hash
  // of every checkpoint tensor, the content version and its label. Null
  // while unknown: before prepare(first_load) or a reload that hashed, and
  // after a failure left the model inconsistent. Readable from any thread.
  std::shared_ptr<const ServedWeights> served() const;

  // Records `graph`'s capture manifest (classifying every address it uses)
  // and verifies it after each reload. The graph must outlive the engine or
  // be untracked first. Fails closed: a graph that recorded nothing, reads
  // none of the model's slots, or reads an address nothing owns (an
  // undeclared tensor, a raw allocation) stays tracked, the engine refuses
  // replay, and track() throws gk::DriftError naming each address's owner.
  // The verdict lasts as long as the graph is tracked: every reload() then
  // throws gk::DriftError and replay stays refused; after untrack() (or
  // prepare() after a recapture) the next successful reload allows replay.
  // Note [Capture verdicts last] in reload/capture_tracking.cpp.
  void track(ReplayBackend& graph);
  // The same, given the forward `graph` was captured from: when the graph
  // reads raw addresses that nothing owns, track() captures `forward` once
  // more (graph.recapture(forward), same pool) and refuses only the raw
  // addresses the second capture reads again in the same kernel parameter
  // byte; the others were stale bytes (AddressClass::unstable). Note
  // [Confirming raw addresses] in reload/capture_tracking.cpp. Prefer this overload on
  // CUDA: stale host bytes in kernel parameters can look like addresses.
  void track(ReplayBackend& graph, const std::function<void()>& forward);
  // Allows graphs to read [begin, begin + bytes) although no slot owns it: a
  // library's own persistent workspace that never moves across reloads.
  // Call before track(); `reason` is shown wherever the range is reported.
  void allow_address_range(std::string name, const void* begin, std::size_t bytes, std::string reason);
  // Every slot's name (Note [Slot names] in slot_plan.h).
  std::vector<std::string> slot_names() const;
  void untrack(const ReplayBackend& graph);
  // Registers a persistent input or output buffer of the runner, so the
  // manifest classifies its addresses as static I/O.
  void add_static_io(std::string name, const at::Tensor& buffer);
  // Verifies every tracked graph's manifest now.
  VerifyResult verify() const;
  // The manifest recorded for a tracked graph (nullptr if untracked).
  const CaptureManifest* manifest(const ReplayBackend& graph) const;

  EngineState state() const noexcept;
  bool replay_allowed() const noexcept { return state() == EngineState::ready; }
  // Throws gk::StateError or gk::DriftError (with the reason) when replay
  // must not resume.
  void check_replay_allowed() const;

  const SlotPlan& plan() const;
  const EngineOptions& options() const noexcept;
  torch::nn::Module& model() noexcept;

 private:
  friend ReloadReport testing::load_weights(torch::nn::Module& model, WeightSource& source, const LoadOptions& options,
                                           const testing::EngineHooks& hooks);
  friend class StagedReload;
  friend void testing::set_hooks(ReloadEngine& engine, testing::EngineHooks hooks);
  friend const testing::EngineHooks& testing::hooks(const ReloadEngine& engine);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gk
