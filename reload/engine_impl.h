// reload/engine_impl.h: the ReloadEngine's state, shared by the files that
// implement it (internal to the reload layer):
//   reload_engine.cpp     construction, prepare(), reload(), state, accessors
//   weight_stream.cpp     the expected tensors, the source stream, the completion gate
//   layer_pipeline.cpp    per layer: detach, load, adopt, check, commit, rollback
//   pwal_guard.cpp        what protects captured storage during PWAL (per pass)
//   staged_reload.cpp     stage(), commit(), StagedReload
//   capture_tracking.cpp  track(), untrack(), verification, capture verdicts
//   served_state.cpp      content hashes, landings and kept bases (served())
//   patch_stage.cpp       stage(const Patch&) and its commit
//   patch_scatter.cpp     the patch's writes into captured storage
#pragma once

#include "layer_run.h"
#include "patch_stage.h"
#include "pwal_guard.h"
#include "served_state.h"

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/testing.h>

#include <atomic>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace gk {

// The expected checkpoint tensors, indexed by full name.
struct Expected {
  std::size_t layer, param, tensor;
  std::size_t flat;  // index of this tensor within its layer's completion set
  std::size_t order;  // its place in the plan's order (Impl::find_expected)
  std::vector<std::int64_t> shard_shape;
  at::ScalarType dtype;
  std::int64_t num_shards;
};
// A whole parameter delivered under its own name (weight_source.h): it counts
// as every checkpoint tensor of the parameter.
struct ExpectedParam {
  std::size_t layer, param;
  std::vector<std::size_t> flats;  // its tensors' indices in the layer's completion set
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
};

inline bool same_storage_and_offset(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset();
}

// Whether the copy-back pair dst <- src copies exactly the bytes of `of`,
// whole and contiguous, into a destination of the same size and device: a
// copy that reads every byte of `of` once, and so can hash them as it goes
// (Note [Hashing while copying] in hashing/cuda/content_hash.cu).
inline bool copies_whole(const at::Tensor& dst, const at::Tensor& src, const at::Tensor& of) {
  return src.const_data_ptr() == of.const_data_ptr() && src.nbytes() == of.nbytes() && dst.nbytes() == of.nbytes() &&
         src.is_contiguous() && of.is_contiguous() && dst.is_contiguous() && dst.device() == of.device();
}

struct LayerRun;
// Waits for the calling thread's current stream on every device the runs'
// staged tensors are on (staged_reload.cpp; Note [Online reload threading]).
void sync_staged_streams(const std::vector<LayerRun>& runs);

namespace detail {
// What a StagedReload holds (staged_reload.h).
struct StagedState {
  ReloadEngine* engine = nullptr;  // null once the engine is destroyed
  std::vector<LayerRun> runs;      // per layer: the staged (post-PWAL) tensors and configuration values
  ReloadReport rep;
  RunOptions options;
  std::uint64_t base_version = 0, plan_generation = 0, graphs_generation = 0;
  std::string dropped;  // why the engine dropped it (prepare(), the engine destroyed); empty otherwise
  std::size_t bytes = 0;
  bool done = false;  // committed or aborted
  // What the engine serves once committed (null: unknown, hashing off).
  std::shared_ptr<const ServedWeights> served_after;
  // A patch: the scatter and the layers whose PWAL ran again (null: a full stage).
  std::unique_ptr<StagedPatch> patch;
};
}  // namespace detail

struct ReloadEngine::Impl {
  torch::nn::Module& model;
  EngineOptions options;
  testing::EngineHooks hooks;
  SlotPlan plan;
  // Atomic: the serving thread reads it (replay_allowed) while stage() runs
  // (Note [Online reload threading] in staged_reload.cpp).
  std::atomic<EngineState> state{EngineState::unprepared};
  // Written by the serving thread's calls, and by a stage() only under
  // reason_mu (which check_replay_allowed() takes).
  std::string reason;
  mutable std::mutex reason_mu;
  std::atomic<std::uint64_t> version{0};  // weight_version()
  // Bumped by prepare() and by track()/untrack(): a staged reload checked
  // against an older plan or set of graphs is stale.
  std::uint64_t plan_generation = 0, graphs_generation = 0;
  // The call that holds the engine now (nullptr: none), and the staged
  // reload that is outstanding; both under op_mu.
  std::mutex op_mu;
  const char* busy = nullptr;
  detail::StagedState* outstanding = nullptr;
  // A failed stage() could not point every field back at its captured tensor
  // (PWAL changed the object tree): the graphs still read untouched storage,
  // but the next reload() must run as a recovery.
  bool fields_unrestored = false;
  std::unordered_map<std::string, Expected> expected;
  // The same entries in the plan's order (Note [Names arrive in plan order]).
  std::vector<const std::pair<const std::string, Expected>*> expected_order;
  // The same entries by their place in served_names' sorted order: a
  // patch's entries come in name order (ServedNames::find's cursor).
  std::vector<const Expected*> expected_sorted;
  // Per layer and parameter: the captured checkpoint-format parameter where
  // its checkpoint tensors can be viewed in it (a contiguous slot of the
  // parameter's shape and dtype; else undefined), and the row where each of
  // them begins. Made once per plan: captured_tensor() is O(1) for each of a
  // MoE patch's 18,000 entries (a parameter's shape() and dtype() walk its
  // hundreds of tensors).
  struct CapturedParam {
    at::Tensor whole;
    std::vector<std::int64_t> first_row;
  };
  std::vector<std::vector<CapturedParam>> captured_params;
  std::unordered_map<std::string, ExpectedParam> expected_params;
  std::vector<std::size_t> expected_per_layer;
  // Every checkpoint tensor's full name, sorted (what a load serves: Note
  // [Served names are the plan's] in served_names.h).
  std::shared_ptr<const detail::ServedNames> served_names;
  // Per layer: where each checkpoint tensor's shards start in its completion
  // set (CompletionSet), one entry past the last.
  std::vector<std::shared_ptr<const std::vector<std::size_t>>> shard_starts;
  struct Tracked {
    ReplayBackend* graph;  // valid only while `alive` has not expired
    std::weak_ptr<const void> alive;
    CaptureManifest manifest;
    // Why track() refused this graph (empty: it did not). The verdict lasts
    // as long as the graph is tracked (Note [Capture verdicts last]).
    std::string refused;
  };
  std::vector<Tracked> graphs;
  std::vector<StaticBuffer> io;
  std::vector<AddressRange> allowed;  // allow_address_range()
  // What the engine serves (served()), replaced whole under served_mu; and
  // the label of every content version it served (Note [Content versions]).
  std::shared_ptr<const ServedWeights> served;
  mutable std::mutex served_mu;
  std::map<std::uint64_t, std::string> labels;

  Impl(torch::nn::Module& m, EngineOptions o) : model(m), options(std::move(o)) {}

  // --- reload_engine.cpp ------------------------------------------------------
  // Calls the testing hook (testing.h) at `point`, if any.
  void fault(testing::FaultPoint point, const std::string& layer) const {
    if (hooks.fault) hooks.fault(point, layer);
  }
  // The testing hook: slot s is left out of copy-back.
  bool unprotected(const PlannedSlot& s) const;
  // Hooks that name slots must name real ones (a misspelt name would
  // silently protect nothing less, or nothing more, than the caller meant).
  void validate_hooks() const;
  ReloadReport new_report(const detail::RunOptions& o) const;
  ReloadReport run_reload(WeightSource& source, const detail::RunOptions& o, PwalGuard& guard);
  // Rolls back every layer a failed reload (or stage) touched; false when
  // something could not be restored.
  bool rollback_all(std::vector<LayerRun>& runs, const detail::RunOptions& o);
  // After the weights were written: the new state, the weight version, the
  // verification of the tracked graphs and their capture verdicts.
  ReloadReport finish(ReloadReport& rep, const detail::RunOptions& o, const Stopwatch& total, const PwalGuard& guard);
  // A failure after captured storage was written: the model mixes old and
  // new weights. Replay is refused until a reload succeeds (`why`, set
  // under reason_mu: a stage() may call this while the serving thread reads
  // the reason), the served content is unknown, and, when the weights the
  // graphs read changed, weight_version() moves. The one way into that
  // state, for reload(), stage() (PWAL reached captured storage) and
  // commit() alike.
  void mark_inconsistent(std::string why, bool weights_changed);

  // --- weight_stream.cpp ------------------------------------------------------
  void index_expected();
  // Fills captured_params (called by index_expected()).
  void index_captured_params();
  // The expected checkpoint tensor named `name`, or nullptr; `cursor` is
  // where the previous one was found (Note [Names arrive in plan order]).
  const std::pair<const std::string, Expected>* find_expected(const std::string& name, std::size_t& cursor) const;
  std::vector<LayerRun> new_runs() const;
  // Everything before the commit: detach, then per layer load, PWAL, check
  // (and in streaming mode its copy-back), the completion gate, and in
  // transactional mode the "before_copies" faults and before_commit: the
  // stage/commit boundary.
  void run_layers(WeightSource& source, const detail::RunOptions& o, PwalGuard& guard, std::vector<LayerRun>& runs,
                  ReloadReport& rep, bool& any_copied_back);

  // --- layer_pipeline.cpp -----------------------------------------------------
  void snapshot_and_detach(LayerPlan& lp, LayerRun& run, const PwalGuard& guard);
  // `meanwhile`, when given, runs once after the layer's weights are loaded
  // and their scans (non-finite values, content hashes) launched, before
  // their answers are awaited; the caller then owes the layer a
  // finish_record_after_pwal() (served_state.h).
  void process(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep, const WeightSource& source,
               PwalGuard& guard, const std::function<void()>& meanwhile = {});
  // One layer's copy of its new values into the captured storage (a
  // reload's or a staged commit's; "commit" is the whole of commit()).
  // `staged`: the commit of a StagedReload, whose caller ran the "copy"
  // faults first and keeps no undo (Note [Online reload threading]).
  void copy_back(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep, const PwalGuard& guard,
                 bool staged = false);
  // What copy_back writes: dst[k] <- src[k] (the slots whose new value is
  // copied in), and the slots it zeroes. Reads run.current and run.mismatched.
  struct CopyPairs {
    std::vector<at::Tensor> dst, src, zero;
  };
  CopyPairs copy_pairs(const LayerPlan& lp, const LayerRun& run) const;
  // Points the layer's fields back at their captured storage and restores
  // its values and configuration. Returns false when something could not be
  // restored (the model is then inconsistent).
  bool rollback(LayerPlan& lp, LayerRun& run);

  // --- staged_reload.cpp ------------------------------------------------------
  // Drops the outstanding staged reload, releasing its tensors; its commit()
  // is then refused with `why`. The caller holds op_mu.
  void drop_outstanding(std::string why, bool engine_gone);
  // The checks every stage() runs first, and a new staged state for it.
  std::unique_ptr<detail::StagedState> begin_stage(ReloadEngine* self, const detail::RunOptions& options);
  // After the staged layers (mask: those, empty: all) passed their checks:
  // copies PWAL left alone commit in place, every field points at its
  // captured tensor again, the configuration values PWAL left are kept, and
  // st.bytes counts what the staged tensors hold.
  void settle_staged(std::vector<LayerRun>& runs, StagingCopies& copies, detail::StagedState& st,
                     const std::vector<char>& mask);
  // Why `st` can no longer be committed, one reason each (none: it can):
  // dropped, the weights, the plan or the tracked graphs changed since
  // staging, an adopted tensor written since (version counter or content
  // hash), the engine not ready. Writes nothing.
  std::vector<std::string> why_stale(detail::StagedState& st);
  // The staged writes, in the pause: the patch's scatter (if any), then the
  // staged tensors and configuration values of every layer whose PWAL ran.
  // `copied` turns true before the first layer is copied (until then a
  // failed patch has been written back).
  // The adopted tensors it copies are hashed as they are copied, and a
  // change since staging fails it after the copy (Note [Adopted tensors are
  // hashed]).
  void write_staged(detail::StagedState& st, ReloadReport& rep, const PwalGuard& committing, bool& copied);
  void write_staged_layers(detail::StagedState& st, ReloadReport& rep, const PwalGuard& committing, bool& copied);

  // --- served_state.cpp -------------------------------------------------------
  // The served weights for `st` (null: unknown), its label recalled from
  // `labels` when it has none. Does not publish.
  std::shared_ptr<const ServedWeights> make_served(std::unique_ptr<ServedWeights::State> st) const;
  // Serves `s` (null: unknown), recording its label.
  void publish_served(std::shared_ptr<const ServedWeights> s);
  std::shared_ptr<const ServedWeights> served_now() const;
  // gk::testing::EngineHooks::verify_served after a full reload: hashes the captured
  // storage of every passthrough checkpoint tensor against rep.served; a
  // difference leaves the model inconsistent and throws gk::WeightError.
  void verify_served_content(ReloadReport& rep);
  // The captured tensor holding checkpoint tensor `name` of a passthrough
  // parameter (a contiguous view of its parameter slot), or undefined.
  at::Tensor captured_tensor(const Expected& e) const;

  // --- patch_stage.cpp --------------------------------------------------------
  // Everything stage(const Patch&) does between begin_stage and the return,
  // in named steps over the state they share (Note [Applying a patch]).
  void stage_patch(const Patch& patch, const detail::RunOptions& o, detail::StagedState& st);
  struct PatchStaging;
  void check_patch_against_served(PatchStaging& ps);
  void choose_patch_landings(PatchStaging& ps);
  void stage_scatter_layers(PatchStaging& ps);
  void stage_rerun_layers(PatchStaging& ps, detail::StagedState& st);
  void rerun_patched_layer(PatchStaging& ps, std::size_t li, const WeightSource& described, PwalGuard& guard);
  void land_rerun_passthrough(PatchStaging& ps, LayerPlan& lp, LayerRun& run,
                              const std::map<std::string, const PatchEntry*>& touched);
  void choose_patch_writes(PatchStaging& ps);
  void check_scatter_targets(PatchStaging& ps);
  // Commits what stage_patch staged (after commit()'s stale checks).
  void commit_patch(detail::StagedState& st, ReloadReport& rep);

  // --- capture_tracking.cpp ---------------------------------------------------
  // Drops the tracked graphs that were destroyed; returns their names.
  std::vector<std::string> drop_destroyed();
  // The verdicts of the tracked graphs track() refused, one per line.
  std::string capture_refusals() const;
  VerifyResult verify_all() const;
  void untrack(const ReplayBackend& graph);

  // Holds the engine for one call: refuses it while another call holds it
  // (a stage() running on the staging thread) and, with refuse_outstanding,
  // while a staged reload is outstanding. Note [Online reload threading].
  class Busy {
   public:
    Busy(Impl& impl, const char* what, bool refuse_outstanding = false);
    ~Busy();
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    Impl& impl_;
  };
};

namespace detail {
// Per adopted tensor of `run` (Note [Adopted tensors are hashed]): the pair
// k of a copy-back (dst[k] <- src[k]) that copies exactly its bytes, whole
// and contiguous, into a destination of the same size and device; -1 where
// no pair reads its storage; -2 where a pair reads it otherwise (a view of
// part of it), so that it must be checked before anything is written.
std::vector<std::ptrdiff_t> adopted_pairs(const LayerRun& run, const std::vector<at::Tensor>& dst,
                                          const std::vector<at::Tensor>& src);
}  // namespace detail

}  // namespace gk
