// Online reload: stage() on a staging thread while the graphs keep
// replaying, commit() on the serving thread between two replays, and the
// StagedReload that carries what was staged from one to the other.
#include "engine_impl.h"
#include "reload_internal.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/hashing/content_hash.h>

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <unordered_set>

namespace gk {

// Note [Online reload threading]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An online reload has two threads: the *serving* thread, which replays the
// captured graphs, and the *staging* thread, which calls stage().
//   - While stage() runs, the module objects belong to the staging thread:
//     it detaches parameters, runs PWAL (which may rebuild kernel objects)
//     and re-points fields at copies (Note [Staging copies]). The serving
//     thread may only replay captured graphs, which read the captured
//     storage through the addresses burnt in at capture and never touch a
//     module; no eager forward, and no other call on the engine (reload(),
//     prepare(), track(), untrack(), commit() are refused with a
//     gk::StateError while stage() runs: Impl::Busy).
//   - stage() never writes a captured storage. It reads the captured values
//     of copy_new slots (which the graphs only read) and nothing the graphs
//     write (zero/preserve storages are copied as zeros). When it returns,
//     successful or not, every field points at its captured tensor again and
//     the model computes with the old weights, eagerly or by replay.
//   - commit() and abort() run on the serving thread between two replays:
//     the serving thread holds its own lock (or is simply not replaying)
//     around each replay and around commit(). commit() writes the captured
//     storage; the pause is commit() alone (times.commit_ms).
//   - Streams (CUDA): stage() enqueues on the staging thread's current
//     stream and waits for it before returning; commit() copies on the
//     serving thread's current stream, so the next replay on that stream is
//     ordered after the copy, and waits for it before releasing the staged
//     tensors (sync_staged_streams), so the pause includes the copy.
//   - Atomic, readable from any thread at any time: state(),
//     replay_allowed() and weight_version(). check_replay_allowed() reads the
//     reason string too, so call it on the serving thread.
//   - One staged reload per engine: a second stage() or a reload() while one
//     is outstanding is refused; prepare() drops it (its commit() is then
//     refused); track()/untrack() make it stale.
// Failure guarantees: a stage() that throws changed nothing (the graphs go
// on replaying the old weights; replay stays allowed). A commit() refused
// before writing (empty, another engine's, stale, a field re-pointed since
// staging, a fault at "copy") changed nothing. A commit() that fails while
// writing (which only an allocation failure can cause) leaves the model
// inconsistent, like a streaming reload: replay refused until a reload()
// succeeds. There is no undo copy: it would double the pause and the memory.
// Note [Adopted tensors are hashed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An adopted tensor is the trainer's own storage: the commit copies what
// it holds *now*, while PWAL derived its tensors (scales, repacks) from
// what it held at staging. A write in between that moves no version
// counter (through .data, a raw pointer, a CUDA kernel, an optimizer's
// foreach kernels on the same storage) would be served as a mix that
// matches neither weight set. So stage() hashes each adopted tensor right
// after adopting it, before PWAL reads it, and the commit checks that it
// still hashes so. Only what the commit reads can matter: an adopted tensor
// no copy reads (PWAL made an FP8 weight from it and let it go; a kept base
// is a copy made at staging) is served as it was at staging whatever the
// trainer does now, and is not read again.
//   - A tensor the commit copies whole into captured storage (a bf16
//     weight PWAL left as it was) is hashed by that copy, in the same read
//     (Note [Hashing while copying] in hashing/cuda/content_hash.cu): the
//     pause reads each byte once. A difference is found after the copy
//     wrote it, so the commit fails with the model inconsistent: replay is
//     refused, naming the weight, until a reload() succeeds (as after any
//     commit that fails while writing). Until 2026-12-06 the commit hashed
//     them before writing and refused a stale one with nothing changed; that
//     read was a second pass over the adopted bytes inside the pause
//     (docs/performance.md, "Figures behind the code").
//   - A tensor a copy reads otherwise (a view of part of it) is hashed
//     before anything is written: a difference makes the staged reload
//     stale, refused with nothing changed.
// The version counters are compared before anything is written, for every
// adopted tensor. No product option turns the check off
// (gk::testing::EngineHooks::skip_adopted_content_check does, for the test
// and the benchmark).

// Waits for the calling thread's current stream on every non-CPU device the
// staged tensors live on. stage() and commit() may run on different threads,
// hence streams: the staged values must be complete before another stream's
// commit reads them, and the commit's copy must be done before the staged
// tensors go back to the caching allocator of the stream that made them
// (Note [Online reload threading]).
void sync_staged_streams(const std::vector<LayerRun>& runs) {
  std::vector<c10::Device> devices;
  for (const LayerRun& run : runs)
    for (const at::Tensor& t : run.current)
      if (t.defined() && !t.device().is_cpu() &&
          std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
  for (const c10::Device& d : devices) c10::impl::VirtualGuardImpl(d.type()).getStream(d).synchronize();
}

namespace {

// Fails closed before a staged commit writes anything: every slot must
// still point at its captured storage.
void check_fields_captured(LayerPlan& lp) {
  for (const PlannedSlot& s : lp.slots) {
    if (!s.defined()) continue;
    at::Tensor cur;
    if (s.kind == PlannedSlot::Kind::declared) {
      if (const at::Tensor* f = s.paths.front().resolve_tensor(lp.root.ptr)) cur = *f;
    } else {
      cur = detail::module_tensor(*lp.module, s);
    }
    GK_CHECK(StateError, same_storage_and_offset(cur, s.captured), "commit refused, nothing was changed: ", s.name,
             " no longer points at its captured storage (something re-pointed it, or rebuilt its object, between "
             "stage() and commit()): abort() the staged reload; if the graphs may read stale memory, recapture "
             "and prepare() again");
  }
}

}  // namespace

void ReloadEngine::Impl::drop_outstanding(std::string why, bool engine_gone) {
  if (outstanding == nullptr) return;
  outstanding->dropped = std::move(why);
  outstanding->runs.clear();
  outstanding->bytes = 0;
  if (engine_gone) outstanding->engine = nullptr;
  outstanding = nullptr;
}

std::unique_ptr<detail::StagedState> ReloadEngine::Impl::begin_stage(ReloadEngine* self, const detail::RunOptions& options) {
  GK_CHECK(StateError, state == EngineState::ready, "stage() refused: the engine is ", to_string(state.load()),
           reason.empty() ? std::string() : concat(" (", reason, ")"),
           "; a staged reload can only be committed to a ready engine: use reload() (after prepare() if the "
           "engine is unprepared or needs recapture)");
  GK_CHECK(StateError, !fields_unrestored, "stage() refused: a failed stage() could not point every field back at "
           "its captured tensor (PWAL changed the object tree); reload() to recover first");
  GK_CHECK(StateError, options.on_mismatch == MismatchPolicy::raise, "stage() refused: "
           "MismatchPolicy::needs_recapture cannot be staged (the graphs would have to be recaptured anyway): use "
           "reload()");
  GK_CHECK(StateError, hooks.unprotected_slots.empty(), "stage() refused: gk::testing::EngineHooks::"
           "unprotected_slots is set, a demonstration of reload() without copy-back; a staged reload always copies "
           "back");
  auto st = std::make_unique<detail::StagedState>();
  st->engine = self;
  st->options = options;
  st->options.mode = ReloadMode::transactional;
  st->base_version = version.load(std::memory_order_acquire);
  st->plan_generation = plan_generation;
  st->graphs_generation = graphs_generation;
  return st;
}

void ReloadEngine::Impl::settle_staged(std::vector<LayerRun>& runs, StagingCopies& copies, detail::StagedState& st,
                                       const std::vector<char>& mask) {
  auto staged = [&](std::size_t li) { return mask.empty() || mask[li]; };
  // A copy PWAL did not write commits in place (Note [Staging copies]).
  for (std::size_t li = 0; li < runs.size(); ++li) {
    if (!staged(li)) continue;
    const LayerPlan& lp = plan.layers()[li];
    for (std::size_t i = 0; i < lp.slots.size() && i < runs[li].current.size(); ++i)
      if (copies.untouched(runs[li].current[i])) runs[li].current[i] = lp.slots[i].captured;
  }
  // Point every field back at its captured tensor; keep the staged
  // tensors and the configuration values PWAL left.
  for (std::size_t li = 0; li < runs.size(); ++li) {
    if (!staged(li)) continue;
    LayerPlan& lp = plan.layers()[li];
    LayerRun& run = runs[li];
    run.configs_after.clear();
    for (const PlannedConfig& c : lp.configs) {
      void* p = c.path.resolve(lp.root.ptr);
      run.configs_after.push_back(p != nullptr ? c.ops->copy(p) : nullptr);
    }
    std::vector<at::Tensor> kept = std::move(run.current);
    const bool ok = rollback(lp, run);
    run.current = std::move(kept);
    GK_INTERNAL_ASSERT(ok, "layer '", lp.prefix, "' passed its checks but a path does not resolve");
  }
  // What the staged tensors hold beyond the captured storage.
  std::unordered_set<const void*> seen;
  for (const LayerRun& run : runs)
    for (const at::Tensor& t : run.current)
      if (t.defined() && t.has_storage() && !copies.captured(t) && seen.insert(t.storage().unsafeGetStorageImpl()).second)
        st.bytes += t.storage().nbytes();
}

StagedReload ReloadEngine::stage(WeightSource& source) { return stage(source, impl_->options.defaults.stage()); }
StagedReload ReloadEngine::stage(WeightSource& source, const StageOptions& options) {
  Impl& I = *impl_;
  Impl::Busy busy(I, "stage()", /*refuse_outstanding=*/true);
  std::unique_ptr<detail::StagedState> st = I.begin_stage(this, detail::run_options(options, I.hooks));
  at::NoGradGuard no_grad;
  const Stopwatch total;
  ReloadReport rep = I.new_report(st->options);
  rep.staged = true;
  std::vector<LayerRun> runs = I.new_runs();
  bool any_copied_back = false;
  {
    StageGuard guard(I.plan, [&I](std::string why) { I.mark_inconsistent(std::move(why), /*weights_changed=*/true); });
    try {
      I.run_layers(source, st->options, guard, runs, rep, any_copied_back);
      GK_INTERNAL_ASSERT(!any_copied_back, "a stage copied a layer back");
      I.settle_staged(runs, guard.copies(), *st, {});
    } catch (...) {
      if (!I.rollback_all(runs, st->options)) I.fields_unrestored = true;
      throw;
    }
  }  // the copies no staged tensor views are freed here
  st->served_after = I.make_served(served_from_runs(runs, I.served_names, st->options.version_label));
  rep.served = st->served_after;
  sync_staged_streams(runs);
  rep.times.stage_ms = rep.times.total_ms = total.elapsed_ms();
  st->rep = std::move(rep);
  st->runs = std::move(runs);
  std::lock_guard<std::mutex> lock(I.op_mu);
  I.outstanding = st.get();
  return StagedReload(std::move(st));
}

namespace {
// Why an adopted tensor no longer holds what stage() hashed.
std::string adopted_changed(const LayerRun::Adopted& a, std::uint64_t now) {
  return concat("weight '", a.name, "' was adopted from the source (ReloadOptions::adopt_source_tensors) and its bytes "
                "changed since staging (content hash ", format_content_hash(a.hash), " -> ", format_content_hash(now),
                "; a write through .data, a raw pointer or a kernel moves no version counter): what PWAL derived at "
                "staging no longer matches it");
}
}  // namespace

std::vector<std::string> ReloadEngine::Impl::why_stale(detail::StagedState& st) {
  std::vector<std::string> stale;
  if (!st.dropped.empty()) stale.push_back(st.dropped);
  if (const std::uint64_t now = version.load(std::memory_order_acquire); now != st.base_version)
    stale.push_back(concat("the weights changed since staging (weight version ", st.base_version, " when staged, ",
                           now, " now: a reload() or another commit ran in between)"));
  if (plan_generation != st.plan_generation && st.dropped.empty())
    stale.push_back("prepare() ran again since staging (the slot plan it was checked against is gone)");
  if (graphs_generation != st.graphs_generation)
    stale.push_back("the tracked graphs changed since staging (track() or untrack() ran)");
  for (const LayerRun& run : st.runs)
    for (const LayerRun::Adopted& a : run.adopted)
      if (a.value._version() != a.value_version)
        stale.push_back(concat("weight '", a.name, "' was adopted from the source (ReloadOptions::adopt_source_tensors) "
                               "and has been written since staging (its version counter moved): what the commit "
                               "would copy is not what stage() checked"));
  // Note [Adopted tensors are hashed]: here, those the copy does not read whole.
  if (st.options.check_adopted_content) {
    ScopedMsTimer t(st.rep.times.hash_ms);
    std::vector<const LayerRun::Adopted*> adopted;
    std::vector<at::Tensor> values;
    const StagedPatch* patch = st.patch.get();
    for (std::size_t li = 0; li < st.runs.size(); ++li) {
      const LayerRun& run = st.runs[li];
      if (run.adopted.empty() || (patch != nullptr && !patch->rerun[li])) continue;
      const CopyPairs pairs = copy_pairs(plan.layers()[li], run);
      const std::vector<std::ptrdiff_t> at = detail::adopted_pairs(run, pairs.dst, pairs.src);
      for (std::size_t j = 0; j < run.adopted.size(); ++j)
        if (at[j] == -2) {
          adopted.push_back(&run.adopted[j]);
          values.push_back(run.adopted[j].value);
        }
    }
    const std::vector<std::uint64_t> now = content_hashes(values);
    for (std::size_t i = 0; i < now.size(); ++i)
      if (now[i] != adopted[i]->hash) stale.push_back(adopted_changed(*adopted[i], now[i]));
  }
  if (state != EngineState::ready)
    stale.push_back(concat("the engine is not ready (", to_string(state.load()),
                           reason.empty() ? std::string() : concat(": ", reason), ")"));
  return stale;
}

void ReloadEngine::Impl::write_staged(detail::StagedState& st, ReloadReport& rep, const PwalGuard& committing,
                                      bool& copied) {
  write_staged_layers(st, rep, committing, copied);
  // Note [Adopted tensors are hashed]: the bytes the copies read.
  std::string changed;
  for (LayerRun& run : st.runs) {
    if (run.adopted_hashes == nullptr) continue;
    ScopedMsTimer t(rep.times.hash_ms);
    const std::vector<std::uint64_t> now = run.adopted_hashes->get();
    run.adopted_hashes.reset();
    for (std::size_t i = 0; i < now.size(); ++i) {
      const LayerRun::Adopted& a = run.adopted[run.adopted_copied[i]];
      if (now[i] != a.hash) changed += (changed.empty() ? "" : "; ") + adopted_changed(a, now[i]);
    }
  }
  GK_CHECK(StateError, changed.empty(), "commit failed: ", changed, ". The commit copied those bytes into the "
           "captured storage, so the model now mixes two weight sets: replay is refused until a reload() succeeds "
           "(write an adopted tensor only after commit() returns, or stage without adopt_source_tensors)");
}

void ReloadEngine::Impl::write_staged_layers(detail::StagedState& st, ReloadReport& rep, const PwalGuard& committing,
                                             bool& copied) {
  StagedPatch* patch = st.patch.get();
  if (patch != nullptr) commit_patch(st, rep);
  for (std::size_t li = 0; li < st.runs.size(); ++li) {
    if (patch != nullptr && !patch->rerun[li]) continue;  // a patch copies only the layers whose PWAL ran again
    LayerPlan& lp = plan.layers()[li];
    LayerRun& run = st.runs[li];
    copied = true;
    copy_back(lp, run, st.options, rep, committing, /*staged=*/true);
    for (std::size_t c = 0; c < lp.configs.size() && c < run.configs_after.size(); ++c) {
      void* p = lp.configs[c].path.resolve(lp.root.ptr);
      if (p != nullptr && run.configs_after[c] != nullptr && !lp.configs[c].ops->equal(p, run.configs_after[c].get()))
        lp.configs[c].ops->assign(p, run.configs_after[c].get());
    }
  }
}

ReloadReport ReloadEngine::commit(StagedReload&& staged) {
  Impl& I = *impl_;
  GK_CHECK(StateError, staged.state_ != nullptr && !staged.state_->done,
           "commit() of an empty StagedReload (already committed, aborted, or moved from): nothing to commit; "
           "stage() again");
  detail::StagedState& st = *staged.state_;
  GK_CHECK(StateError, st.engine == this, "commit refused, nothing was changed: the StagedReload ",
           st.engine == nullptr ? concat("was dropped: ", st.dropped)
                                : std::string("belongs to another ReloadEngine (it was staged against that "
                                              "engine's slot plan and captured storage)"),
           "; commit it through the engine whose stage() made it, or stage() again on this one");
  Impl::Busy busy(I, "commit()");
  const Stopwatch total;  // the pause: from here to the return
  if (const std::vector<std::string> stale = I.why_stale(st); !stale.empty()) {
    std::string why;
    for (const std::string& s : stale) why += (why.empty() ? "" : "; ") + s;
    GK_THROW(StateError, "commit refused, nothing was changed: the staged reload is stale: ", why,
             ". abort() it and stage() again from the current weights");
  }
  at::NoGradGuard no_grad;
  StagedPatch* patch = st.patch.get();
  // Fail closed before anything is written: a patch writes only the layers it touched.
  for (std::size_t li = 0; li < st.runs.size(); ++li) check_fields_captured(I.plan.layers()[li]);
  for (std::size_t li = 0; li < st.runs.size(); ++li)
    if (patch == nullptr || patch->touched[li]) I.fault(testing::FaultPoint::copy, I.plan.layers()[li].prefix);
  ReloadReport rep = std::move(st.rep);
  const ReloadGuard committing;  // a commit writes captured storage, as a reload does
  const double stage_total = rep.times.total_ms;
  bool copied = false;  // a layer's staged tensors were copied (a patch's scatter alone can be undone)
  try {
    I.write_staged(st, rep, committing, copied);
  } catch (...) {
    const bool unchanged = patch != nullptr && patch->undone && !copied;  // the scatter was written back
    if (!unchanged) {
      I.mark_inconsistent("a staged commit failed while writing the captured storage: the model mixes old and new "
                          "weights; reload() to recover",
                          /*weights_changed=*/true);
    }
    try {
      sync_staged_streams(st.runs);
    } catch (...) {  // the first error is the one to report
    }
    staged.abort();
    throw;
  }
  sync_staged_streams(st.runs);  // the copy is done before the staged tensors are released
  I.publish_served(st.served_after);
  rep.served = st.served_after;
  // A patch that ran no PWAL re-pointed nothing: no captured address can
  // have moved, so the manifests need no verification inside the pause.
  detail::RunOptions fo = st.options;
  if (patch != nullptr && !patch->any_rerun()) fo.verify = false;
  staged.abort();  // done: releases the staged tensors and the engine's record of them
  try {
    I.finish(rep, fo, total, committing);
  } catch (...) {
    rep.times.commit_ms = total.elapsed_ms();
    throw;
  }
  rep.times.commit_ms = rep.times.total_ms;
  rep.times.total_ms += stage_total;
  return rep;
}

// ---------------------------------------------------------------------------
// StagedReload
// ---------------------------------------------------------------------------
StagedReload::StagedReload() noexcept = default;
StagedReload::StagedReload(std::unique_ptr<detail::StagedState> state) noexcept : state_(std::move(state)) {}
StagedReload::StagedReload(StagedReload&& other) noexcept = default;
StagedReload& StagedReload::operator=(StagedReload&& other) noexcept {
  if (this != &other) {
    abort();
    state_ = std::move(other.state_);
  }
  return *this;
}
StagedReload::~StagedReload() { abort(); }

bool StagedReload::pending() const noexcept { return state_ != nullptr && !state_->done; }

ReloadReport StagedReload::commit() {
  GK_CHECK(StateError, pending(), "StagedReload::commit() of an empty StagedReload (already committed, aborted, or "
           "moved from): nothing to commit; stage() again");
  GK_CHECK(StateError, state_->engine != nullptr, "commit refused, nothing was changed: the StagedReload was "
           "dropped: ", state_->dropped, "; stage() again");
  return state_->engine->commit(std::move(*this));
}

void StagedReload::abort() noexcept {
  if (state_ == nullptr || state_->done) return;
  state_->done = true;
  if (state_->engine != nullptr) {
    ReloadEngine::Impl& impl = *state_->engine->impl_;
    std::lock_guard<std::mutex> lock(impl.op_mu);
    if (impl.outstanding == state_.get()) impl.outstanding = nullptr;
  }
  state_->runs.clear();
  state_->bytes = 0;
}

std::uint64_t StagedReload::base_version() const noexcept { return state_ != nullptr ? state_->base_version : 0; }
std::size_t StagedReload::staged_bytes() const noexcept { return state_ != nullptr ? state_->bytes : 0; }
const ReloadReport& StagedReload::report() const {
  GK_CHECK(StateError, state_ != nullptr, "StagedReload::report() of an empty StagedReload (moved from)");
  return state_->rep;
}

}  // namespace gk
