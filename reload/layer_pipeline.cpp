// The layer pipeline: per layer, detach the checkpoint-format parameters,
// load the new weights (adopting the source's tensors where nothing could
// tell), refuse non-finite values, run PWAL under the pass's guard (Note
// [PWAL guards] in pwal_guard.h), check every slot's layout against the
// captured one, copy the new values into the captured storage and point the
// fields back at it; or roll all of that back.
#include "batched_loads.h"
#include "copied_from.h"
#include "derivations.h"
#include "engine_impl.h"
#include "non_finite.h"
#include "reload_internal.h"
#include "served_state.h"
#include "trace_range.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/reload/copy_slots.h>

#include <torch/nn/module.h>

#include <algorithm>
#include <functional>

namespace gk {
namespace {

at::Tensor find_param_or_buffer(torch::nn::Module& m, const std::string& name) {
  at::Tensor t = detail::module_parameter(m, name);
  if (!t.defined()) t = detail::module_buffer(m, name);
  GK_INTERNAL_ASSERT(t.defined(), "no parameter or buffer '", name, "'");
  return t;
}

const PlannedSlot* slot_named(const LayerPlan& lp, const std::string& local) {
  for (const PlannedSlot& s : lp.slots)
    if (s.kind != PlannedSlot::Kind::declared && s.local == local) return &s;
  return nullptr;
}

// Throws gk::WeightError naming the first checkpoint tensor of the layer
// that holds a NaN or an infinity (Note [Refusing non-finite weights] in
// non_finite.cpp). Reads the checkpoint-format parameters, as loaded.
// `meanwhile` runs while the device scans (Note [Copy back one layer late] in
// weight_stream.cpp).
void refuse_non_finite(LayerPlan& lp, const WeightSource& source, const std::function<void()>& meanwhile) {
  std::vector<at::Tensor> params;
  params.reserve(lp.params.size());
  for (const CheckpointParam& cp : lp.params) params.push_back(find_param_or_buffer(*lp.module, cp.param));
  detail::FiniteScan scan(params);
  if (meanwhile) meanwhile();
  const std::vector<std::int64_t> first = scan.wait();
  for (std::size_t pi = 0; pi < params.size(); ++pi) {
    if (first[pi] < 0) continue;
    const CheckpointParam& cp = lp.params[pi];
    const at::Tensor& t = params[pi];
    // The checkpoint tensor holding that element: they are concatenated
    // along dim 0 (model/layer.h).
    const std::int64_t row = t.dim() > 0 && t.size(0) > 0 ? first[pi] / (t.numel() / t.size(0)) : 0;
    std::size_t ti = 0;
    for (std::int64_t begin = 0; ti + 1 < cp.tensors.size(); ++ti) {
      begin += cp.tensors[ti].shape.empty() ? 1 : cp.tensors[ti].shape.front();
      if (row < begin) break;
    }
    const double value = t.reshape({-1})[first[pi]].item<double>();
    const std::string name = cp.tensors.empty() ? lp.full_name(cp.param) : lp.full_name(cp.tensors[ti].name);
    GK_THROW(WeightError, "weight '", name, "' from ", source.describe(), " holds a non-finite value (", value,
             " at element ", first[pi], " of parameter '", lp.full_name(cp.param), "' ", t.sizes(),
             "): refused, the served weights are unchanged. A diverged trainer writes such checkpoints; to serve "
             "them anyway, set ReloadOptions::allow_non_finite");
  }
}


// Note [Adopting source tensors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A reload copies every byte twice: the load copies the source's tensor
// into a fresh parameter, the copy-back copies PWAL's result into the
// captured storage. Where PWAL leaves a parameter as it is (a bf16 weight
// the kernels read directly) the first copy buys nothing when the source
// already holds the bytes on the right device: a trainer on the same GPU
// handing over its tensors. With ReloadOptions::adopt_source_tensors the
// parameter *is* the source's tensor for the reload (set_data: every handle
// the layer holds follows), PWAL reads it, and the copy-back copies it into
// the captured storage once. Adopted only when nothing could tell the
// difference from a copy:
//   - the parameter arrives in one piece (one unsharded checkpoint tensor
//     that the layer's load_weight() declined, or the whole parameter
//     under its own name) with its exact shape, dtype and device;
//   - contiguous, as a fresh parameter is (kernels may assume it);
//   - not an inference tensor (it has no version counter, below);
//   - not inside a captured storage (a source handing back the engine's
//     own weights): PWAL writing it would write what the graphs read.
// The hazard is a write: PWAL that scales or permutes its parameter in
// place would write the trainer's tensor. Both version counters (the
// source tensor's, shared with its views and detach(), and the
// parameter's own, which set_data keeps) are recorded at adoption and
// compared after PWAL: a write is a gk::WeightError naming the weight
// (the values were already written; the error says so, and the reload
// stops before anything reaches the captured storage of that layer). A
// write through a raw pointer (a custom kernel, .data, from_blob) moves no
// counter and is not seen: adopt only for models whose PWAL leaves its
// inputs alone. For a stage(), the source's tensors are held until the
// commit; one whose counter moved since (the trainer stepped) makes the
// commit stale.
bool try_adopt(const SlotPlan& plan, const LayerPlan& lp, LayerRun& run, const LayerRun::Pending& p, at::Tensor& param,
               c10::Device device, ReloadReport& rep) {
  const CheckpointParam& cp = lp.params[p.param];
  const at::Tensor& v = p.value;
  if (v.device() != device || v.scalar_type() != cp.dtype() || !v.sizes().equals(cp.shape()) ||
      !v.is_contiguous() || v.is_inference() || v.nbytes() == 0)
    return false;
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data_ptr());
  if (plan.find_owner(begin) || plan.find_owner(begin + v.nbytes() - 1)) return false;
  param.set_data(v.detach());
  run.adopted.push_back({v, param, v._version(), param._version(), p.name});
  rep.tensors_adopted += 1;
  rep.bytes_adopted += v.nbytes();
  return true;
}


void check(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep, bool recovering) {
  std::vector<std::string> problems, paths;
  run.current.assign(lp.slots.size(), at::Tensor());
  run.mismatched.assign(lp.slots.size(), 0);
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    const PlannedSlot& s = lp.slots[i];
    at::Tensor cur;
    std::vector<std::string> diff;
    if (s.kind == PlannedSlot::Kind::declared) {
      at::Tensor* field = s.paths.front().resolve_tensor(lp.root.ptr);
      if (field == nullptr) {
        const std::size_t at = s.paths.front().broken_at(lp.root.ptr);
        diff.push_back(concat("path no longer resolves after PWAL (the object tree changed shape at step ", at + 1,
                           " of ", s.paths.front().depth(), ")"));
      } else {
        cur = *field;
      }
    } else {
      cur = detail::module_tensor(*lp.module, s);
      if (!cur.defined() && s.defined()) diff.push_back("was removed by PWAL");
    }
    if (diff.empty()) diff = detail::layout_differences(s, cur);
    // aliases must still share one storage region
    for (std::size_t a = s.kind == PlannedSlot::Kind::declared ? 1 : 0; diff.empty() && a < s.paths.size(); ++a) {
      at::Tensor* f = s.paths[a].resolve_tensor(lp.root.ptr);
      if (f == nullptr || (cur.defined() && !same_region(*f, cur)))
        diff.push_back(concat("alias ", lp.full_name(s.paths[a].str()), " no longer shares storage with it"));
    }
    if (!diff.empty()) {
      std::string d;
      for (const auto& x : diff) d += (d.empty() ? "" : ", ") + x;
      problems.push_back(concat(s.name, ": ", d));
      paths.push_back(s.name);
      run.mismatched[i] = 1;
      continue;
    }
    run.current[i] = detail::storage_view(cur);
  }
  if (o.check_configs) {
    for (std::size_t c = 0; c < lp.configs.size(); ++c) {
      const PlannedConfig& pc = lp.configs[c];
      void* p = pc.path.resolve(lp.root.ptr);
      if (p == nullptr) {
        problems.push_back(concat(pc.name, ": configuration path no longer resolves after PWAL"));
        paths.push_back(pc.name);
      } else if (const void* before = run.configs[c] != nullptr ? run.configs[c].get() : pc.captured.get();
                 !pc.ops->equal(p, before)) {
        problems.push_back(concat(pc.name, ": configuration value changed ", pc.ops->repr(before), " -> ",
                               pc.ops->repr(p), " (a captured kernel may have taken it by value)"));
        paths.push_back(pc.name);
      }
    }
  }
  // What the declarations predict (Note [Declared derivations]). After a
  // failure left the model inconsistent, captured storage is no reference
  // for from_shapes; block derivations compare PWAL with PWAL's own source,
  // so they are checked then too (the structure fuzzer found a lying PWAL
  // accepted by a recovering reload).
  detail::check_block_derivations(lp, run.current, "nothing was copied into captured storage for this layer",
                                  &run.mismatched);
  // Read before the copy-back (process() or copy_back(): Note [Verdicts read late]).
  if (!recovering) run.from_shapes = detail::launch_from_shapes_check(lp, run.current, run.mismatched);
  if (problems.empty()) return;
  if (o.on_mismatch == MismatchPolicy::raise) {
    std::string msg = concat("PWAL of layer '", lp.prefix, "' changed ", problems.size(),
                          " captured slot(s); the captured graphs cannot be kept (recapture, or reload with "
                          "MismatchPolicy::needs_recapture):");
    for (const auto& p : problems) msg += "\n  " + p;
    ::gk::detail::fail<MismatchError>(__func__, __FILE__, __LINE__, std::move(msg), std::move(paths));
  }
  rep.needs_recapture = true;
  rep.mismatched.insert(rep.mismatched.end(), paths.begin(), paths.end());
}


}  // namespace

namespace detail {
void repoint(LayerPlan& lp, const PlannedSlot& s) {
  const at::Tensor& C = s.captured;
  std::size_t first_path_location = 0;
  if (s.kind != PlannedSlot::Kind::declared) {
    at::Tensor P = detail::module_tensor(*lp.module, s);
    if (P.defined() && C.defined() && !same_region(P, C)) P.set_data(C);
    const at::Tensor& orig = s.originals.front();
    if (orig.defined() && C.defined() && !orig.is_same(P) && !same_region(orig, C)) orig.set_data(C);
    first_path_location = 1;
  }
  for (std::size_t a = 0; a < s.paths.size(); ++a) {
    at::Tensor* field = s.paths[a].resolve_tensor(lp.root.ptr);
    if (field == nullptr) continue;  // reported by check()
    const at::Tensor& orig = s.originals[first_path_location + a];
    if (orig.defined() && C.defined() && !same_region(orig, C)) orig.set_data(C);
    *field = orig;
  }
}
}  // namespace detail

void ReloadEngine::Impl::snapshot_and_detach(LayerPlan& lp, LayerRun& run, const PwalGuard& guard) {
  detail::TraceRange r("gk.detach");
  fault(testing::FaultPoint::detach, lp.prefix);
  // The slots must still point at their captured storage: anything else is
  // drift that happened outside a reload.
  // After a failed reload left the model inconsistent, a path may not
  // resolve (PWAL changed the object tree): this reload's PWAL rebuilds it,
  // and check() reports it if it still does not resolve.
  const bool recovering = state == EngineState::inconsistent || fields_unrestored;
  for (const PlannedSlot& s : lp.slots) {
    if (!guard.captured() || !s.defined()) continue;
    at::Tensor cur;
    if (s.kind == PlannedSlot::Kind::declared) {
      const at::Tensor* field = s.paths.front().resolve_tensor(lp.root.ptr);
      if (field == nullptr) {
        GK_CHECK(DriftError, recovering, s.name,
                 " no longer resolves before the reload started (the object tree changed shape at step ",
                 s.paths.front().broken_at(lp.root.ptr) + 1, " of ", s.paths.front().depth(),
                 " outside a reload); the captured graphs read stale memory: recapture and prepare() again");
        continue;
      }
      cur = *field;
    } else {
      cur = detail::module_tensor(*lp.module, s);
    }
    GK_CHECK(DriftError, same_storage_and_offset(cur, s.captured), s.name,
             " no longer points at its captured storage before the reload started (something re-pointed it "
             "outside a reload); the captured graphs read stale memory: recapture and prepare() again");
  }
  run.configs.clear();
  for (const PlannedConfig& c : lp.configs) {
    void* p = c.path.resolve(lp.root.ptr);
    GK_CHECK(DriftError, p != nullptr || recovering, "configuration value ", c.name,
             " no longer resolves before the reload started (the object tree changed outside a reload): "
             "recapture and prepare() again");
    run.configs.push_back(p != nullptr ? c.ops->copy(p) : nullptr);
  }
  // Detach the checkpoint-format parameters from the captured storage (the
  // C++ counterpart of vLLM's move to the meta device: libtorch's set_data
  // cannot change a dense tensor's device, so an empty placeholder on the
  // same device holds no memory and fails loudly if anything reads it).
  for (const CheckpointParam& cp : lp.params) {
    at::Tensor t = find_param_or_buffer(*lp.module, cp.param);
    t.set_data(detail::placeholder_like(t));
  }
  run.detached = true;
}


void ReloadEngine::Impl::process(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep,
                                 const WeightSource& source, PwalGuard& guard,
                                 const std::function<void()>& meanwhile) {
  const std::size_t n = lp.params.size();
  std::vector<at::Tensor> targets(n);
  std::vector<char> custom(n, 0);  // a load_weight() took some tensor of the parameter
  detail::CopiedFrom copied;       // the loads' verbatim copies of the source's bytes
  {
    detail::PhaseScope t(rep.times.load_ms, "gk.load");
    fault(testing::FaultPoint::load, lp.prefix);
    // Materialize fresh checkpoint-format parameters (each right before
    // its first load, so an adopted one holds no new storage) and replay
    // the loads, adopting what can be adopted (Note [Adopting source tensors]).
    std::vector<char> materialized(n, 0);
    auto handle = [&](std::size_t pi) -> at::Tensor& {
      if (!targets[pi].defined()) targets[pi] = find_param_or_buffer(*lp.module, lp.params[pi].param);
      return targets[pi];
    };
    auto device_of = [&](std::size_t pi) {
      const PlannedSlot* s = slot_named(lp, lp.params[pi].param);
      return s != nullptr && s->defined() ? s->device : handle(pi).device();
    };
    auto materialize = [&](std::size_t pi) -> at::Tensor& {
      at::Tensor& t = handle(pi);
      if (!materialized[pi]) {
        const CheckpointParam& cp = lp.params[pi];
        t.set_data(at::empty(cp.shape(), at::TensorOptions().dtype(cp.dtype()).device(device_of(pi))));
        materialized[pi] = 1;
      }
      return t;
    };
    const bool adopt = guard.captured() && o.adopt_source_tensors;
    // default_load's copies go in a few launches (Note [Default loads in one
    // launch] in batched_loads.h); whatever else writes a parameter with
    // copies queued for it launches them first, so each byte is written in
    // the order of the loads.
    detail::BatchedLoads batched;
    // Verbatim copies of scanned source bytes, whose hashes the scan took
    // (Note [Hashes of verbatim copies] in copied_from.h).
    detail::CopiedFrom* const note_copies = o.known_hashes != nullptr ? &copied : nullptr;
    const bool own_loader = lp.layer != nullptr && detail::overrides_load_weight(*lp.layer);
    for (LayerRun::Pending& p : run.pending) {
      const CheckpointParam& cp = lp.params[p.param];
      if (p.tensor == kWholeParam) {  // the parameter as its loaders would fill it
        if (batched.queued_into(handle(p.param))) batched.flush();
        if (!(adopt && try_adopt(plan, lp, run, p, handle(p.param), device_of(p.param), rep))) {
          at::Tensor& target = materialize(p.param);
          target.copy_(p.value);
          if (note_copies != nullptr && detail::copy_moves_bytes(target, p.value) && p.value.is_contiguous() &&
              target.is_contiguous())
            note_copies->add(target.const_data_ptr(), p.value.const_data_ptr(), target.nbytes());
        }
        materialized[p.param] = 1;
        continue;
      }
      // The layer's own loader first (it needs its target materialized); a
      // plain module has none, so its parameter is adopted before allocating.
      if (lp.layer != nullptr) {
        at::Tensor& target = materialize(p.param);
        if (own_loader && batched.queued_into(target)) batched.flush();
        if (lp.layer->load_weight({cp, p.tensor, p.shard, p.value, target})) {
          custom[p.param] = 1;
          continue;
        }
      }
      const bool whole = cp.tensors.size() == 1 && cp.tensors.front().num_shards == 1;
      if (adopt && whole && try_adopt(plan, lp, run, p, handle(p.param), device_of(p.param), rep)) {
        materialized[p.param] = 1;
        continue;
      }
      const LoadRequest load{cp, p.tensor, p.shard, p.value, materialize(p.param)};
      if (batched.add(load, note_copies)) {
        ++rep.tensors_batched;
      } else {
        batched.flush();
        default_load(load);
      }
    }
    for (std::size_t pi = 0; pi < n; ++pi) materialize(pi);
    batched.flush();
  }
  // The content hashes of what was loaded (Note [Patch landings] in layer_record.h).
  {
    detail::TraceRange r("gk.record_loaded");
    record_loaded(lp, run, targets, custom, o, rep, copied);
  }
  run.pending.clear();
  guard.after_load(run, o, rep);
  // The loaded bytes' hashes go on the current stream after the scan's
  // launch (which waits for what the stream holds: the loads, not the
  // hashes), so that PWAL, which may write the loaded tensors in place, runs
  // after them in stream order; they are read with the hashes after PWAL.
  // `meanwhile` (the previous layer's copy-back) runs while this layer's
  // scan runs on the device; with no scan here, after this layer's checks
  // are launched (below).
  const bool scan_here = !o.allow_non_finite && !o.source_scanned;
  const std::function<void()> then = [&] {
    launch_loaded_hashes(run, rep);
    if (scan_here && meanwhile) meanwhile();
  };
  if (scan_here) {
    detail::PhaseScope t(rep.times.finite_ms, "gk.finite");
    refuse_non_finite(lp, source, then);
  } else {
    then();
  }
  // PWAL may write into the captured tensors it can reach (declared
  // members, buffers it does not load, views of a parameter's storage):
  // Note [Undo by storage], Note [PWAL guards].
  {
    detail::TraceRange r("gk.before_pwal");
    guard.before_pwal(lp, run, o);
  }
  {
    detail::PhaseScope t(rep.times.pwal_ms, "gk.pwal");
    fault(testing::FaultPoint::pwal, lp.prefix);
    if (lp.layer != nullptr) lp.layer->process_weights_after_loading();
    for (const LayerRun::Adopted& a : run.adopted)
      GK_CHECK(WeightError, a.value._version() == a.value_version && a.param._version() == a.param_version,
               "PWAL of layer '", lp.prefix, "' wrote weight '", a.name,
               "' in place, but the reload had adopted that tensor from the source instead of copying it "
               "(ReloadOptions::adopt_source_tensors): the source's tensor now holds PWAL's output, not the "
               "checkpoint's values. The reload stops here; reload this model with adopt_source_tensors off, "
               "from a source that still holds the checkpoint's values");
  }
  if (guard.captured()) {
    detail::PhaseScope t(rep.times.check_ms, "gk.check");
    fault(testing::FaultPoint::check, lp.prefix);
    check(lp, run, o, rep, state == EngineState::inconsistent || fields_unrestored);
    guard.after_check(lp, run);
  }
  // With `meanwhile` (a streaming reload) the caller finishes the record a
  // layer late (Note [Copy back one layer late]).
  {
    detail::TraceRange r("gk.record_after_pwal");
    record_after_pwal(lp, run, o, rep, /*defer=*/static_cast<bool>(meanwhile));
  }
  if (!scan_here && meanwhile) meanwhile();
  // A streaming reload reads the check's verdicts at the copy-back, a layer
  // later; the others before they return (a stage() refuses at stage time).
  if (!meanwhile) detail::finish_from_shapes_check(lp, run.from_shapes);
  run.phase = LayerRun::Phase::processed;
  if (guard.captured() && o.after_layer) o.after_layer(lp.prefix);
}

void ReloadEngine::Impl::copy_back(LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep,
                                const PwalGuard& guard, bool staged) {
  if (!guard.captured()) {
    run.phase = LayerRun::Phase::copied_back;
    return;
  }
  detail::PhaseScope t(rep.times.copy_ms, "gk.copy_back");
  {
    detail::TraceRange v("gk.verdicts");
    detail::finish_from_shapes_check(lp, run.from_shapes);  // nothing written yet
  }
  if (!staged) fault(testing::FaultPoint::copy, lp.prefix);
  // Transactional: every captured storage this copy-back writes is saved
  // first, so a later failure can undo it (Note [Undo by storage]).
  const bool undoable = !staged && o.mode == ReloadMode::transactional;
  CopyPairs pairs = copy_pairs(lp, run);
  std::vector<at::Tensor>& dst = pairs.dst;
  std::vector<at::Tensor>& src = pairs.src;
  const std::vector<at::Tensor>& zero = pairs.zero;
  for (const at::Tensor& C : dst) rep.bytes_copied += C.nbytes();
  rep.slots_zeroed += zero.size();
  if (undoable) {
    std::vector<at::Tensor> written = dst;
    written.insert(written.end(), zero.begin(), zero.end());
    run.backups.take_all(written);
  }
  // Zero first, then copy: where a zeroed slot overlaps a copied one, the
  // copied value wins, as it did when each slot was written on its own.
  for (const at::Tensor& C : zero) C.zero_();
  // The parameters whose hashes after PWAL the record waits for are hashed
  // as they are copied (Note [Hashing while copying]); the rest in one launch.
  // So are the adopted tensors a staged commit copies, whose bytes must
  // still be those stage() hashed (Note [Adopted tensors are hashed]).
  std::vector<char> taken;
  std::vector<std::byte*> to;
  std::vector<ContentRange> hashed;
  if (!staged) {
    hashed = copy_hash_ranges(lp, run, dst, src, taken, to);
    if (!hashed.empty()) run.record.copied_hashes = std::make_shared<detail::CopiedHashes>(std::move(hashed), to);
  } else if (o.check_adopted_content) {
    taken.assign(dst.size(), 0);
    run.adopted_copied.clear();
    const std::vector<std::ptrdiff_t> at = detail::adopted_pairs(run, dst, src);
    for (std::size_t j = 0; j < at.size(); ++j) {
      if (at[j] < 0) continue;
      const auto k = static_cast<std::size_t>(at[j]);
      const at::Tensor& v = run.adopted[j].value;
      hashed.push_back({v, 0, v.nbytes()});
      to.push_back(static_cast<std::byte*>(dst[k].mutable_data_ptr()));
      taken[k] = 1;
      run.adopted_copied.push_back(j);
    }
    if (!hashed.empty()) run.adopted_hashes = std::make_shared<detail::CopiedHashes>(std::move(hashed), to);
  }
  if (std::find(taken.begin(), taken.end(), 1) != taken.end()) {
    std::vector<at::Tensor> d, s;
    for (std::size_t k = 0; k < dst.size(); ++k)
      if (!taken[k]) d.push_back(dst[k]), s.push_back(src[k]);
    dst = std::move(d);
    src = std::move(s);
  }
  if (!dst.empty()) {
    detail::TraceRange r("gk.copy_slots");
    copy_slots(dst, src);  // one launch for the CUDA slots
  }
  detail::TraceRange repointing("gk.repoint");
  for (const PlannedSlot& s : lp.slots) {
    const std::size_t i = static_cast<std::size_t>(&s - lp.slots.data());
    if (run.mismatched[i] || unprotected(s)) continue;
    detail::repoint(lp, s);
  }
  run.current.clear();
  if (!undoable) run.backups.release();
  run.phase = LayerRun::Phase::copied_back;
}

ReloadEngine::Impl::CopyPairs ReloadEngine::Impl::copy_pairs(const LayerPlan& lp, const LayerRun& run) const {
  CopyPairs p;
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    const PlannedSlot& s = lp.slots[i];
    if (run.mismatched[i] || unprotected(s)) continue;
    const at::Tensor& C = s.captured;
    const at::Tensor& N = run.current[i];
    if (!C.defined()) continue;
    const Init init = s.role.effective_init();
    const bool in_place = same_storage_and_offset(N, C);
    if (init == Init::copy_new && !in_place) {
      p.dst.push_back(C);
      p.src.push_back(N);
    } else if (init == Init::zero) {
      p.zero.push_back(C);
    }
  }
  return p;
}

namespace detail {
std::vector<std::ptrdiff_t> adopted_pairs(const LayerRun& run, const std::vector<at::Tensor>& dst,
                                          const std::vector<at::Tensor>& src) {
  std::vector<std::ptrdiff_t> at(run.adopted.size(), -1);
  for (std::size_t j = 0; j < run.adopted.size(); ++j) {
    const at::Tensor& v = run.adopted[j].value;
    for (std::size_t k = 0; k < src.size(); ++k) {
      const at::Tensor& N = src[k];
      if (!N.defined() || !N.has_storage() || !v.has_storage() || !N.storage().is_alias_of(v.storage())) continue;
      if (copies_whole(dst[k], N, v) && at[j] == -1) {
        at[j] = static_cast<std::ptrdiff_t>(k);
      } else {
        at[j] = -2;  // read otherwise: checked before anything is written
        break;
      }
    }
  }
  return at;
}
}  // namespace detail

bool ReloadEngine::Impl::rollback(LayerPlan& lp, LayerRun& run) {
  bool ok = !run.pwal_unguarded;
  run.backups.restore();
  for (const PlannedSlot& s : lp.slots) {
    for (const SlotPath& p : s.paths) ok = ok && p.resolve_tensor(lp.root.ptr) != nullptr;
    detail::repoint(lp, s);
  }
  for (std::size_t c = 0; c < lp.configs.size(); ++c) {
    void* p = lp.configs[c].path.resolve(lp.root.ptr);
    if (p == nullptr) {
      ok = false;
      continue;
    }
    const bool snapped = c < run.configs.size() && run.configs[c] != nullptr;
    lp.configs[c].ops->assign(p, snapped ? run.configs[c].get() : lp.configs[c].captured.get());
  }
  run.pending.clear();
  run.current.clear();
  return ok;
}

}  // namespace gk
