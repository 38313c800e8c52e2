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

#include <graphkeep/reload/errors.h>
#include <graphkeep/reload/report.h>
#include <graphkeep/reload/slot_plan.h>
#include <graphkeep/reload/staged_reload.h>
#include <graphkeep/sources/weight_source.h>

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

class ReplayBackend;
class CaptureManifest;
struct VerifyResult;

enum class UnknownAddressPolicy { refuse, report };

struct ReloadOptions {
  ReloadMode mode = ReloadMode::streaming;
  MismatchPolicy on_mismatch = MismatchPolicy::raise;
  // Verify the capture manifests of tracked graphs after each reload.
  bool verify = true;
  // Treat a configuration value changed by PWAL as a mismatch.
  bool check_configs = true;
  // PWAL may write into captured tensors in place (a declared member it is
  // handed, a buffer it does not load, a view of a parameter's storage).
  // true: before each layer's PWAL, copy those captured storages, and write
  // them back if the layer fails (memory: one layer's such storages in
  // streaming mode, all of them in transactional mode). false: no copy; a
  // layer that fails after its PWAL started marks the model inconsistent
  // (replay refused until a reload succeeds). docs/reload.md, "Modes".
  bool restore_in_place_writes = true;
  // Adopt the source's tensors instead of copying them (Note [Adopting
  // source tensors] in reload_engine.cpp). A checkpoint parameter that
  // arrives as one tensor of exactly its shape, dtype and device, contiguous
  // (one unsharded checkpoint tensor the layer does not load itself, or the
  // whole parameter delivered under the parameter's name: weight_source.h)
  // becomes that tensor for the reload: no load copy, no new storage. The
  // commit then copies it straight into the captured storage, so a reload
  // copies each byte once, as a plain load does. The source's tensors must
  // not be written until reload() returns, or until the commit() of a
  // stage(); one written since staging (its version counter moved) makes
  // the commit stale. PWAL that writes a parameter in place would write the
  // source's tensor: the reload throws gk::WeightError naming the weight
  // (it caught the write through the version counter; a write through a raw
  // pointer is not seen). Tensors not adoptable (another device or dtype,
  // strided, an inference tensor, a view of a captured storage) are copied.
  bool adopt_source_tensors = false;
  // With adopt_source_tensors, a stage() hashes every adopted tensor when it
  // adopts it, and commit() hashes it again before writing anything: a
  // tensor written since (through .data, a raw pointer or a kernel, which
  // move no version counter) makes the commit stale, refused with nothing
  // changed. The commit's pause grows by one read of the adopted bytes
  // (docs/performance.md). false: no hashing; for trainers that guarantee
  // they write no adopted tensor until the commit returns (a write then is
  // served as a silent mix of new parameters and stale derived tensors).
  // Note [Adopted tensors are hashed] in reload_engine.cpp.
  bool check_adopted_content = true;
  // Serve floating-point checkpoint tensors holding NaN or infinity. By
  // default a reload, a stage and the first load refuse them with a
  // gk::WeightError naming the tensor, before PWAL runs (one device read of
  // the layer's bytes; Note [Refusing non-finite weights] in
  // reload/non_finite.cpp).
  bool allow_non_finite = false;
  // Full slot names whose copy-back is disabled: the fields keep PWAL's new
  // tensors, as without graphkeep. For demonstrations and negative tests.
  // Each must be a slot name (ReloadEngine::slot_names(); Note [Slot names]
  // in slot_plan.h): an unknown one is a gk::StateError naming the closest.
  std::vector<std::string> unprotected_slots;
  // Full slot names of declared members to treat as if their class had
  // declared them not graph-visible: prepare() leaves them out of the plan,
  // so the graphs' reads of them are unknown addresses, as an undeclared
  // tensor's would be (the collector and the capture manifest name them, with
  // the role not_graph_visible). For negative tests and demonstrations only.
  // Each must name a declared member's slot (not a parameter or buffer): an
  // unknown one is a gk::StateError at prepare() naming the closest. Read by
  // prepare() from the engine's options; a reload()'s own options must leave
  // it empty or repeat it.
  std::vector<std::string> undeclared_members;
  // What track() does with a graph the manifest cannot vouch for (Note [Fail
  // closed at capture] in reload_engine.cpp): refuse replay (default), or
  // only report it in the manifest, for demonstrations and negative tests.
  UnknownAddressPolicy on_unknown_address = UnknownAddressPolicy::refuse;
  // Called at each stage with (stage, layer prefix); throwing from it injects
  // a fault there. Stages: "detach", "load", "pwal", "check", "copy", "commit".
  std::function<void(std::string_view stage, const std::string& layer)> fault_hook;
  // Called on the reloading thread after each layer's PWAL and checks, with
  // the layer's prefix, in reload() and stage(). An engine paces a stage()
  // here: waiting in it leaves the device to the serving graphs for a while
  // (the example engine's LlmEngineOptions::stage_device_share). Throwing
  // from it fails the reload or the stage as a fault would.
  std::function<void(const std::string& layer)> after_layer;
  // Transactional mode only: called once after every layer is loaded, PWAL'd
  // and checked and the completion gate passed, right before the first
  // commit. Throwing from it aborts the reload with a full rollback (every
  // layer keeps its old weights), like a fault at the "commit" stage; the
  // exception propagates out of reload(). The distributed reload votes here
  // (include/graphkeep/distributed/distributed.h). Not called in streaming mode.
  // stage() calls it last, on the staging thread, once everything is staged
  // and checked: throwing from it aborts the stage (nothing changed).
  std::function<void()> before_commit;
};

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
// Of `options`, only allow_non_finite applies.
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source);
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const ReloadOptions& options);

class ReloadEngine {
 public:
  explicit ReloadEngine(torch::nn::Module& model, ReloadOptions options = {});
  ~ReloadEngine();
  ReloadEngine(const ReloadEngine&) = delete;
  ReloadEngine& operator=(const ReloadEngine&) = delete;

  // Builds the slot plan. Call after the first load and PWAL, before any
  // capture; call again after a recapture.
  void prepare();

  ReloadReport reload(WeightSource& source);
  ReloadReport reload(WeightSource& source, const ReloadOptions& options);

  // Online reload (staged_reload.h; Note [Online reload threading] in
  // reload_engine.cpp). stage() loads `source`, runs PWAL and every check
  // reload() runs (completion gate, layouts, configurations) into new
  // storage and returns the staged tensors; it never writes a captured
  // storage, so another thread may keep replaying the captured graphs
  // meanwhile (and only that: no eager forward while stage() runs). On
  // return the model's fields point at the captured tensors again, holding
  // the old values. Throws, changing nothing, on any error, and
  // gk::StateError while another staged reload of this engine is
  // outstanding or the engine is not ready. `options.mode` is ignored (a
  // stage is transactional by nature); MismatchPolicy::needs_recapture and
  // unprotected_slots are refused (use reload()).
  StagedReload stage(WeightSource& source);
  StagedReload stage(WeightSource& source, const ReloadOptions& options);
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
  // model inconsistent, counts too). Atomic: readable from any thread.
  std::uint64_t weight_version() const noexcept;

  // Records `graph`'s capture manifest (classifying every address it uses)
  // and verifies it after each reload. The graph must outlive the engine or
  // be untracked first. Fails closed: a graph that recorded nothing, reads
  // none of the model's slots, or reads an address nothing owns (an
  // undeclared tensor, a raw allocation) stays tracked, the engine refuses
  // replay, and track() throws gk::DriftError naming each address's owner.
  void track(ReplayBackend& graph);
  // The same, given the forward `graph` was captured from: when the graph
  // reads raw addresses that nothing owns, track() captures `forward` once
  // more (graph.recapture(forward), same pool) and refuses only the raw
  // addresses the second capture reads again in the same kernel parameter
  // byte; the others were stale bytes (AddressClass::unstable). Note
  // [Confirming raw addresses] in reload_engine.cpp. Prefer this overload on
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
  const ReloadOptions& options() const noexcept;
  torch::nn::Module& model() noexcept;

 private:
  friend ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const ReloadOptions& options);
  friend class StagedReload;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gk
