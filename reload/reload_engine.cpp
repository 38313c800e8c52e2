// The reload engine: construction, prepare(), reload(), the engine's state
// and accessors. The pipeline's parts live beside it (engine_impl.h lists
// them); docs/reload.md describes the whole.
#include "derivations.h"
#include "engine_impl.h"
#include "reload_internal.h"
#include "trace_range.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/reload/testing.h>

#include <torch/nn/module.h>

#include <algorithm>

namespace gk {

std::string_view to_string(EngineState s) noexcept {
  switch (s) {
    case EngineState::unprepared: return "unprepared";
    case EngineState::ready: return "ready";
    case EngineState::inconsistent: return "inconsistent";
    case EngineState::needs_recapture: return "needs_recapture";
    case EngineState::drift: return "drift";
  }
  return "?";
}

bool ReloadEngine::Impl::unprotected(const PlannedSlot& s) const {
  return std::find(hooks.unprotected_slots.begin(), hooks.unprotected_slots.end(), s.name) !=
         hooks.unprotected_slots.end();
}

// undeclared_members were checked by build_slot_plan (Note [Members treated
// as undeclared] in slot_plan.cpp); they shape the plan, so only prepare()
// can apply them.
void ReloadEngine::Impl::validate_hooks() const {
  for (const std::string& name : hooks.unprotected_slots)
    GK_CHECK(StateError, plan.find_slot(name) != nullptr,
             detail::unknown_slot_message(plan, "unprotected_slots", name));
}

void ReloadEngine::Impl::mark_inconsistent(std::string why, bool weights_changed) {
  {
    std::lock_guard<std::mutex> lock(reason_mu);
    state = EngineState::inconsistent;
    reason = std::move(why);
  }
  if (weights_changed) version.fetch_add(1, std::memory_order_acq_rel);
  publish_served(nullptr);
}

ReloadEngine::Impl::Busy::Busy(Impl& impl, const char* what, bool refuse_outstanding) : impl_(impl) {
  std::lock_guard<std::mutex> lock(impl.op_mu);
  GK_CHECK(StateError, impl.busy == nullptr, what, " while ", impl.busy,
           " is running on another thread: one call at a time per engine (only graph replay may run while "
           "stage() does; Note [Online reload threading]); call it after ", impl.busy, " has returned");
  GK_CHECK(StateError, !refuse_outstanding || impl.outstanding == nullptr, what,
           " while a staged reload is outstanding (staged at weight version ",
           impl.outstanding != nullptr ? impl.outstanding->base_version : 0,
           "): commit it (ReloadEngine::commit) or abort() it first; one staged reload per engine at a time, "
           "and ", what, " would make it stale");
  impl.busy = what;
}
ReloadEngine::Impl::Busy::~Busy() {
  std::lock_guard<std::mutex> lock(impl_.op_mu);
  impl_.busy = nullptr;
}
ReloadReport ReloadEngine::Impl::new_report(const detail::RunOptions& o) const {
  ReloadReport rep;
  rep.mode = o.mode;
  rep.layers = plan.layers().size();
  rep.slots_tracked = plan.num_slots();
  rep.declared_slots = plan.num_declared_slots();
  return rep;
}
bool ReloadEngine::Impl::rollback_all(std::vector<LayerRun>& runs, const detail::RunOptions& o) {
  // Roll back every layer not yet copied back; in transactional mode also
  // undo this reload's copy-backs (the swap log).
  // Newest first: where layers share a storage (tied weights), the oldest
  // saved contents are written last (Note [Undo by storage]).
  bool restored = true;
  for (std::size_t li = runs.size(); li-- > 0;) {
    LayerRun& run = runs[li];
    const bool undoable = o.mode == ReloadMode::transactional;
    if (!run.detached) continue;
    if (run.phase != LayerRun::Phase::copied_back || undoable) restored = rollback(plan.layers()[li], run) && restored;
  }
  return restored;
}

ReloadReport ReloadEngine::Impl::run_reload(WeightSource& source, const detail::RunOptions& o, PwalGuard& guard) {
  GK_CHECK(StateError, state != EngineState::unprepared,
           "ReloadEngine::reload() before prepare(): call prepare() after the first load and PWAL, "
           "before capturing graphs");
  GK_CHECK(StateError, state != EngineState::needs_recapture, "reload refused: ", reason);
  at::NoGradGuard no_grad;
  const Stopwatch total;
  ReloadReport rep = new_report(o);
  std::vector<LayerRun> runs = new_runs();
  bool any_copied_back = false;
  try {
    run_layers(source, o, guard, runs, rep, any_copied_back);
    if (o.mode == ReloadMode::transactional)
      for (std::size_t li = 0; li < runs.size(); ++li) copy_back(plan.layers()[li], runs[li], o, rep, guard);
  } catch (...) {
    const bool restored = rollback_all(runs, o);
    if (!restored || (o.mode == ReloadMode::streaming && any_copied_back)) {
      mark_inconsistent(!restored ? "a failed reload could not restore every slot (PWAL changed the object tree, or "
                                    "wrote captured tensors with gk::testing::EngineHooks::skip_in_place_backups)"
                                  : "a streaming reload failed after some layers were copied back: the model mixes old "
                                    "and new weights",
                        /*weights_changed=*/guard.captured());
    }
    throw;
  }
  fields_unrestored = false;
  {
    detail::TraceRange r("gk.serve");
    rep.served = make_served(served_from_runs(runs, served_names, o.version_label));
    if (guard.captured()) {
      publish_served(rep.served);
      if (o.verify_served) verify_served_content(rep);
    }
  }
  return finish(rep, o, total, guard);
}

ReloadReport ReloadEngine::Impl::finish(ReloadReport& rep, const detail::RunOptions& o, const Stopwatch& total,
                                        const PwalGuard& guard) {
  rep.times.total_ms = total.elapsed_ms();
  if (guard.captured()) rep.weight_version = version.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (rep.needs_recapture) {
    state = EngineState::needs_recapture;
    reason = "the last reload accepted layout mismatches: recapture the graphs, then call prepare()";
  } else {
    state = EngineState::ready;
    reason.clear();
  }
  rep.graphs_destroyed = drop_destroyed();
  if (o.verify && guard.captured() && !graphs.empty() && !rep.needs_recapture) {
    detail::PhaseScope t(rep.times.verify_ms, "gk.verify");
    VerifyResult r = verify_all();
    rep.addresses_verified = r.checked;
    rep.drift = r.issues.size();
    if (!r.ok()) {
      state = EngineState::drift;
      reason = r.describe();
      rep.times.total_ms = total.elapsed_ms();
      GK_THROW(DriftError, "after the reload, ", r.issues.size(), " captured address(es) are not covered; "
                           "replay is refused:\n", r.describe());
    }
  }
  // After verification, which names what moved (Note [Capture verdicts last]).
  // With verify off (demonstrations of what an engine without graphkeep
  // replays) it does not throw, but replay stays refused all the same.
  if (const std::string refused = capture_refusals(); !refused.empty() && !rep.needs_recapture) {
    state = EngineState::drift;
    reason = refused;
    rep.times.total_ms = total.elapsed_ms();
    if (o.verify) GK_THROW(DriftError, "after the reload, replay stays refused: ", refused);
  }
  rep.times.total_ms = total.elapsed_ms();
  return rep;
}

// ---------------------------------------------------------------------------
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source) { return load_weights(model, source, {}); }
ReloadReport load_weights(torch::nn::Module& model, WeightSource& source, const LoadOptions& options) {
  return testing::load_weights(model, source, options, {});
}
ReloadReport testing::load_weights(torch::nn::Module& model, WeightSource& source, const LoadOptions& options,
                                   const EngineHooks& hooks) {
  const detail::RunOptions o = detail::run_options(options, hooks);
  ReloadEngine::Impl impl(model, {});
  impl.plan = build_slot_plan(model);
  impl.index_expected();
  impl.state = EngineState::ready;
  FirstLoadGuard first_load;
  return impl.run_reload(source, o, first_load);
}

ReloadEngine::ReloadEngine(torch::nn::Module& model, EngineOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(options))) {}
ReloadEngine::~ReloadEngine() {
  // A staged reload outliving its engine holds nothing afterwards, and its
  // commit() is refused.
  std::lock_guard<std::mutex> lock(impl_->op_mu);
  impl_->drop_outstanding("its ReloadEngine was destroyed", /*engine_gone=*/true);
}

void ReloadEngine::prepare() {
  Impl::Busy busy(*impl_, "prepare()");
  {
    std::lock_guard<std::mutex> lock(impl_->op_mu);
    impl_->drop_outstanding("prepare() ran again since staging (the slot plan it was checked against is gone; its "
                            "staged tensors were released)",
                            /*engine_gone=*/false);
  }
  // Block derivations are bound and checked before anything changes: a
  // declaration the model contradicts leaves the engine as it was.
  SlotPlan plan = build_slot_plan(impl_->model, impl_->hooks.undeclared_members);
  for (LayerPlan& lp : plan.layers()) {
    detail::bind_block_derivations(lp, plan.undeclared());
    detail::check_block_derivations(lp, {}, "prepare() refused");
  }
  impl_->graphs.clear();
  impl_->graphs_generation += 1;
  impl_->plan_generation += 1;
  impl_->plan = std::move(plan);
  impl_->index_expected();
  impl_->validate_hooks();
  impl_->fields_unrestored = false;
  impl_->state = EngineState::ready;
  impl_->reason.clear();
}

void ReloadEngine::prepare(const ReloadReport& first_load) {
  GK_CHECK(StateError, first_load.served != nullptr, "ReloadEngine::prepare(first_load): the report holds no served "
           "content (the load ran with gk::testing::EngineHooks::skip_served_hashes); load with hashing, or call prepare() and "
           "reload before the first patch");
  prepare();
  const ServedWeights& s = *first_load.served;
  std::vector<std::string> problems;
  for (const auto& [name, e] : impl_->expected)
    if (!s.hash(name)) problems.push_back(concat("'", name, "' has no hash"));
  if (s.hashes().size() != impl_->expected.size())
    for (const auto& [name, h] : s.hashes())
      if (!impl_->expected.count(name)) problems.push_back(concat("'", name, "' is no checkpoint tensor of the model"));
  if (!problems.empty()) {
    std::sort(problems.begin(), problems.end());
    GK_THROW(StateError, "ReloadEngine::prepare(first_load): the report's served content is not this model's: ",
             problems.size(), " problem(s), first: ", problems.front(),
             " (pass the report of gk::load_weights on this model)");
  }
  impl_->publish_served(first_load.served);
}

std::shared_ptr<const ServedWeights> ReloadEngine::served() const { return impl_->served_now(); }

ReloadReport ReloadEngine::reload(const Patch& patch) { return reload(patch, impl_->options.patch); }
ReloadReport ReloadEngine::reload(const Patch& patch, const PatchOptions& options) {
  StagedReload staged = stage(patch, options);
  ReloadReport rep = commit(std::move(staged));
  rep.staged = false;
  return rep;
}

ReloadReport ReloadEngine::reload(WeightSource& source) { return reload(source, impl_->options.defaults); }
ReloadReport ReloadEngine::reload(WeightSource& source, const ReloadOptions& options) {
  Impl::Busy busy(*impl_, "reload()", /*refuse_outstanding=*/true);
  ReloadGuard guard;
  return impl_->run_reload(source, detail::run_options(options, impl_->hooks), guard);
}

std::uint64_t ReloadEngine::weight_version() const noexcept {
  return impl_->version.load(std::memory_order_acquire);
}

EngineState ReloadEngine::state() const noexcept { return impl_->state; }

void ReloadEngine::check_replay_allowed() const {
  switch (impl_->state.load()) {
    case EngineState::ready: return;
    case EngineState::drift: GK_THROW(DriftError, "replay refused: ", impl_->reason);
    case EngineState::unprepared:
      GK_THROW(StateError, "replay refused: prepare() has not run, so no address is protected");
    default: {
      std::lock_guard<std::mutex> lock(impl_->reason_mu);
      GK_THROW(StateError, "replay refused (", to_string(impl_->state.load()), "): ", impl_->reason);
    }
  }
}

const SlotPlan& ReloadEngine::plan() const { return impl_->plan; }
const EngineOptions& ReloadEngine::options() const noexcept { return impl_->options; }
torch::nn::Module& ReloadEngine::model() noexcept { return impl_->model; }


namespace testing {

std::string_view to_string(FaultPoint s) noexcept {
  switch (s) {
    case FaultPoint::detach: return "detach";
    case FaultPoint::load: return "load";
    case FaultPoint::pwal: return "pwal";
    case FaultPoint::check: return "check";
    case FaultPoint::copy: return "copy";
    case FaultPoint::before_copies: return "before_copies";
    case FaultPoint::scatter: return "scatter";
  }
  return "?";
}

void set_hooks(ReloadEngine& engine, EngineHooks h) {
  ReloadEngine::Impl& I = *engine.impl_;
  ReloadEngine::Impl::Busy busy(I, "gk::testing::set_hooks()");
  std::swap(I.hooks, h);
  if (I.state != EngineState::unprepared) {
    try {
      I.validate_hooks();
    } catch (...) {
      std::swap(I.hooks, h);  // refused: the engine keeps the hooks it had
      throw;
    }
  }
}

const EngineHooks& hooks(const ReloadEngine& engine) { return engine.impl_->hooks; }

}  // namespace testing
}  // namespace gk
