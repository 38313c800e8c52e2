// Weight patches through the engine: stage(const Patch&), which checks a
// patch against what the engine serves and stages its effect without
// writing a captured storage, and the commit of what it staged.
//
// Note [Applying a patch]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A patch (graphkeep/delta/patch.h) names checkpoint tensors, flat element
// indices and values, and the content hashes of each tensor before and
// after. stage(patch), on the staging thread while the graphs replay:
//   1. Checks, before anything else: the engine knows what it serves (its
//      content hashes, served_state.cpp); validate_patch (format, dtypes,
//      shapes, lengths, every index in range, strictly ascending hence no
//      duplicate, computed on the patch's device without a device assert);
//      every entry names a checkpoint tensor of the model with its shape and
//      dtype; every base hash equals the served hash. A failure is a
//      gk::WeightError naming the tensor and the patch (its label names the
//      file): nothing was changed or staged.
//   2. Per layer it touches, one of two paths (Note [Patch landings] in
//      layer_record.h):
//      scatter  every touched parameter is passthrough, and the layer has no
//               copy-back slot that is not a view of a passthrough
//               parameter's captured storage, bar those declared
//               from_shapes (Note [Declared derivations] in
//               graphkeep/registry/role.h: a function of shapes alone,
//               which every full reload checks), those declared
//               by_blocks() from a passthrough parameter, whose touched
//               blocks are recomputed and written in the same commit
//               (Note [Patches through block derivations] in
//               block_landing.cpp), and those declared by_layout() from a
//               passthrough parameter, each changed element written
//               wherever the layout put it (Note [Patches through layout
//               derivations] in layout_landing.cpp) (nothing else
//               derived: PWAL would produce the same tensors from the new
//               values, bar the parameters themselves; a configuration
//               PWAL changed would be a mismatch while check_configs is on,
//               so with it off the layer takes the other path). A plain
//               module always
//               qualifies. The entry's indices map into the parameter's
//               captured storage by default_load's layout; staging moves
//               the entry to the device and gathers the elements it will
//               overwrite (the commit's undo). Once the commit's writes are
//               made (sector images or elements), every touched tensor is
//               hashed through them (Note [Hashing through the writes] in
//               graphkeep/hashing/overlaid_hash.h: one launch, no copy,
//               the served hash plus the change of the words written)
//               against the target hash. O(changed) memory kept and read.
//      re-run   anything else (an FP8 weight or scale made from the
//               parameter, a Marlin repack, a derived stride array, a
//               load_weight() of the layer's own): the layer's checkpoint
//               tensors are rebuilt whole from their bases (the captured
//               storage for passthrough parameters, the kept base for the
//               others; without one the patch is refused, saying why), the
//               entries applied, and the layer goes through the pipeline a
//               reload runs (load, non-finite check, PWAL under the stage's
//               guard, layout and configuration checks). Every loaded
//               tensor's hash must equal the target (or, untouched, the
//               served) hash. The re-run also records the layer's landings
//               afresh. Passthrough parameters are then written by the
//               scatter, not copied; the layer's other staged tensors are
//               copied by the commit as a stage's are.
//      A re-run layer's copies of its passthrough parameters are freed as
//      soon as it is checked (Note [Re-run layers release their passthrough
//      copies]).
//   3. The served content after the commit (the target hashes, the new
//      bases of re-run layers, the label patch.target_version) is built
//      here, so the commit only swaps a pointer.
// commit(), between two replays: the stale checks of any staged reload,
// then the scatter (one launch per device for every tensor, whole 32-byte
// sectors by default on a GPU: PatchOptions::patch_writes; CPU: a host
// loop), the re-run layers' copies and configuration values, and, with
// gk::testing::EngineHooks::verify_served, the touched captured tensors hashed again.
// A failure after the scatter (an injected fault at Stage::scatter, a
// verification mismatch) writes the undo back before any re-run layer was
// copied: the old weights are served bit for bit and replay stays allowed.
// A patch commit that re-ran no PWAL moved no field, so it skips the
// capture-manifest verification; the pause is then the scatter alone.
//
// Note [Re-run layers release their passthrough copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A re-run loads the layer's passthrough parameters into fresh tensors for
// PWAL to read, but the commit writes them by scatter. As soon as the layer
// is checked, its fields point back at the captured storage, so the copies
// are freed layer by layer. Held to the end of the stage, a patch touching
// every MoE layer (whose experts object is derived, so each such layer
// re-runs) held a second copy of the model: more than a device holds beside
// a 30B model.
#include "block_landing.h"
#include "layout_landing.h"
#include "derivations.h"
#include "engine_impl.h"
#include "non_finite.h"
#include "patch_landing.h"
#include "reload_internal.h"
#include "sector_images.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/delta/detail/element_bits.h>
#include <graphkeep/delta/patch.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/hashing/overlaid_hash.h>
#include <graphkeep/sources/weight_source.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <unordered_set>

namespace gk {
namespace {

std::string_view label_of(const Patch& p) { return p.label.empty() ? std::string_view("patch") : p.label; }

// An entry's data on `device`: the indices as stored (int32 or int64), the
// values as integers of their size.
struct EntryData {
  at::Tensor indices, values;
};
// (Per entry of a MoE patch, 18,000 times: no dispatch where the tensor is
// already on the device, contiguous and flat.)
at::Tensor on(const at::Tensor& t, c10::Device device) {
  const at::Tensor d = t.device() == device ? t : t.to(device);
  return d.is_contiguous() ? d : d.contiguous();
}
EntryData on_device(const PatchEntry& pe, c10::Device device) {
  EntryData x;
  if (pe.encoding == PatchEncoding::sparse) x.indices = on(pe.indices, device);
  x.values = detail::flat_bits(on(pe.values, device));
  return x;
}

// `base` with the entry applied, as a new contiguous tensor of base's dtype.
at::Tensor patched(const at::Tensor& base, const PatchEntry& pe) {
  at::Tensor r = base.clone(at::MemoryFormat::Contiguous);
  const EntryData x = on_device(pe, r.device());
  scatter_items({{detail::flat_bits(r), x.indices, x.values}});
  return r;
}


// The slot of the module's parameter or buffer `param`, or -1.
std::ptrdiff_t param_slot(const LayerPlan& lp, const std::string& param) {
  for (std::size_t i = 0; i < lp.slots.size(); ++i)
    if (lp.slots[i].kind != PlannedSlot::Kind::declared && lp.slots[i].local == param && lp.slots[i].defined())
      return static_cast<std::ptrdiff_t>(i);
  return -1;
}

// Where a re-run keeps the bases of a layer that has kept ones: where they
// are (a re-run must not drop them because this call's options say none).
PatchBase kept_where(const ServedWeights::State& s, const LayerPlan& lp, PatchBase asked) {
  for (const CheckpointParam& cp : lp.params) {
    const auto it = s.params.find(lp.full_name(cp.param));
    if (it != s.params.end() && !it->second.base.empty())
      return it->second.base.front().device().is_cpu() ? PatchBase::pinned_host : PatchBase::device;
  }
  return asked;
}

}  // namespace

StagedReload ReloadEngine::stage(const Patch& patch) { return stage(patch, impl_->options.patch); }
StagedReload ReloadEngine::stage(const Patch& patch, const PatchOptions& options) {
  Impl& I = *impl_;
  Impl::Busy busy(I, "stage(patch)", /*refuse_outstanding=*/true);
  std::unique_ptr<detail::StagedState> st = I.begin_stage(this, detail::run_options(options, I.options.defaults, I.hooks));
  at::NoGradGuard no_grad;
  const Stopwatch total;
  I.stage_patch(patch, st->options, *st);
  st->rep.times.stage_ms = st->rep.times.total_ms = total.elapsed_ms();
  std::lock_guard<std::mutex> lock(I.op_mu);
  I.outstanding = st.get();
  return StagedReload(std::move(st));
}

// The state the steps of stage(patch) share (Note [Applying a patch]).
struct ReloadEngine::Impl::PatchStaging {
  PatchStaging(const Patch& p, const detail::RunOptions& options, ReloadReport r) : patch(p), o(options), rep(std::move(r)) {}
  const Patch& patch;
  const detail::RunOptions& o;
  ReloadReport rep;
  std::string_view label = label_of(patch);
  std::shared_ptr<const ServedWeights> served0;
  const ServedWeights::State* S = nullptr;
  std::vector<std::vector<std::size_t>> by_layer;  // per layer, its entries' indices
  std::vector<const Expected*> where;              // per entry, its checkpoint tensor
  std::vector<at::Tensor> dst;                     // per entry, its captured tensor (undefined: none)
  std::unique_ptr<StagedPatch> sp = std::make_unique<StagedPatch>();
  std::unique_ptr<ServedWeights::State> next;      // the served content after the commit
  std::vector<LayerRun> runs;                      // the re-run layers'
  std::vector<at::Tensor> targets;                 // the scatter layers' touched tensors, to hash
  std::vector<const PatchEntry*> target_entries;   // per target, its entry

  // How parameter pi of lp lands in what is served now.
  const ServedParam& landing(const LayerPlan& lp, std::size_t pi) const {
    const auto it = S->params.find(lp.full_name(lp.params[pi].param));
    GK_INTERNAL_ASSERT(it != S->params.end(), "no landing for parameter '", lp.full_name(lp.params[pi].param), "'");
    return it->second;
  }
  static PatchLanding landing_of(const at::Tensor& dst, const PatchEntry& pe) {
    const EntryData x = on_device(pe, dst.device());
    return PatchLanding{dst, detail::flat_bits(dst), &pe, x.indices, x.values};
  }
};

void ReloadEngine::Impl::stage_patch(const Patch& patch, const detail::RunOptions& o, detail::StagedState& st) {
  ReloadReport rep = new_report(o);
  rep.staged = true;
  rep.patch.applied = true;
  PatchStaging ps(patch, o, std::move(rep));
  ps.served0 = served_now();
  GK_CHECK(StateError, ps.served0 != nullptr, "stage(patch) refused for ", ps.label,
           ": the engine does not know the content it serves (no prepare(first_load) with the report of "
           "gk::load_weights, or the last reload ran with gk::testing::EngineHooks::skip_served_hashes, or a failure left the model "
           "inconsistent); reload the weights in full first");
  ps.S = &ps.served0->state();
  check_patch_against_served(ps);  // 1. every check before anything is staged
  choose_patch_landings(ps);       // 2. scatter or re-run, per touched layer
  ps.next = std::make_unique<ServedWeights::State>();
  ps.next->names = ps.S->names;
  ps.next->values = ps.S->values;
  ps.next->params = ps.S->params;
  ps.next->label = patch.target_version;
  stage_scatter_layers(ps);        // 3. map the entries into captured storage ...
  stage_rerun_layers(ps, st);      //    ... or recompute the layer
  choose_patch_writes(ps);         // 4. elements or sectors; the undo, gathered at once
  check_scatter_targets(ps);       // 5. the target hashes, through those writes
  // 6. The served state, built here so that the commit only swaps a pointer.
  StagedPatch& sp = *ps.sp;
  ps.next->finish();
  st.served_after = make_served(std::move(ps.next));
  ps.rep.served = st.served_after;
  for (const ScatterItem& w : sp.writes) st.bytes += w.values.nbytes() + (w.indices.defined() ? w.indices.nbytes() : 0);
  for (const ScatterItem& u : sp.undo) st.bytes += u.values.nbytes();
  // The staged tensors are complete before another thread's commit reads them.
  wait_for(sp.undo);
  sync_staged_streams(ps.runs);
  st.rep = std::move(ps.rep);
  st.runs = std::move(ps.runs);
  st.patch = std::move(ps.sp);
}

void ReloadEngine::Impl::check_patch_against_served(PatchStaging& ps) {
  const Patch& patch = ps.patch;
  const std::string_view label = ps.label;
  ReloadReport& rep = ps.rep;
  {
    ScopedMsTimer t(rep.times.check_ms);
    validate_patch(patch);
  }
  ps.by_layer.assign(plan.layers().size(), {});
  ps.where.assign(patch.entries.size(), nullptr);
  ps.dst.assign(patch.entries.size(), at::Tensor());
  // Entries come in name order (validate_patch): each is looked up next to
  // the one before (ServedNames::find's cursor).
  std::size_t at_name = 0, at_served = 0;
  for (std::size_t k = 0; k < patch.entries.size(); ++k) {
    const PatchEntry& pe = patch.entries[k];
    const std::optional<std::size_t> pos = served_names->find(pe.name, &at_name);
    GK_CHECK(WeightError, pos.has_value(), label, ": tensor '", pe.name, "' is not a checkpoint tensor of the "
             "model (an unknown name; the model expects ", expected.size(), " tensors); nothing was changed");
    const Expected& e = *expected_sorted[*pos];
    const CheckpointTensor& ct = plan.layers()[e.layer].params[e.param].tensors[e.tensor];
    GK_CHECK(WeightError, pe.shape == ct.shape && pe.dtype == ct.dtype, label, ": tensor '", pe.name, "' is ",
             pe.dtype, " ", at::IntArrayRef(pe.shape), " in the patch but ", ct.dtype, " ", at::IntArrayRef(ct.shape),
             " in the model; nothing was changed");
    const std::uint64_t* h = ps.S->find(pe.name, &at_served);
    GK_INTERNAL_ASSERT(h != nullptr, "no served hash for '", pe.name, "'");
    GK_CHECK(WeightError, *h == pe.base_hash, label, ": tensor '", pe.name, "': the patch's base hash is ",
             format_content_hash(pe.base_hash), " but the engine serves ", format_content_hash(*h), " (version ",
             ps.served0->describe(), "): the patch was made from other weights than those served (its base is '",
             patch.base_version, "'); nothing was changed");
    ps.where[k] = &e;
    ps.dst[k] = captured_tensor(e);
    ps.by_layer[e.layer].push_back(k);
    rep.patch.elements += static_cast<std::size_t>(pe.count());
  }
  rep.patch.tensors = patch.entries.size();
  rep.patch.payload_bytes = patch.payload_bytes();
  // Non-finite values (Note [Refusing non-finite weights]): the values a
  // patch writes are checked, O(changed); what it leaves was checked when it
  // was loaded. (Re-run layers are checked again whole by the pipeline.)
  if (!ps.o.allow_non_finite) {
    ScopedMsTimer t(rep.times.finite_ms);
    std::vector<at::Tensor> values;
    values.reserve(patch.entries.size());
    for (const PatchEntry& pe : patch.entries) values.push_back(pe.values);
    const std::vector<std::int64_t> first = detail::first_non_finite(values);
    for (std::size_t k = 0; k < first.size(); ++k) {
      if (first[k] < 0) continue;
      const PatchEntry& pe = patch.entries[k];
      const std::int64_t element = pe.encoding == PatchEncoding::dense
                                       ? first[k]
                                       : pe.indices.reshape({-1})[first[k]].item<std::int64_t>();
      GK_THROW(WeightError, label, ": tensor '", pe.name, "': the patch writes a non-finite value (",
               pe.values.reshape({-1})[first[k]].item<double>(), " at element ", element, " of ",
               at::IntArrayRef(pe.shape), "): refused, nothing was changed. A diverged trainer writes such "
               "updates; to serve them anyway, set PatchOptions::allow_non_finite");
    }
  }
}

void ReloadEngine::Impl::choose_patch_landings(PatchStaging& ps) {
  const std::size_t L = plan.layers().size();
  StagedPatch& sp = *ps.sp;
  sp.touched.assign(L, 0);
  sp.rerun.assign(L, 0);
  // Why layer li must re-run PWAL; empty: the scatter alone lands it.
  auto rerun_why = [&](std::size_t li) -> std::string {
    const LayerPlan& lp = plan.layers()[li];
    for (std::size_t k : ps.by_layer[li]) {
      const CheckpointParam& cp = lp.params[ps.where[k]->param];
      if (!ps.landing(lp, ps.where[k]->param).passthrough || !ps.dst[k].defined())
        return concat("parameter '", cp.param, "' does not land unchanged in captured storage (PWAL transforms it, "
                      "or a load_weight() of the layer placed it)");
    }
    if (lp.layer == nullptr) return {};
    if (!ps.o.check_configs && !lp.configs.empty()) return "configuration checks are off";
    std::unordered_set<const void*> passthrough;
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi)
      if (const std::ptrdiff_t i = param_slot(lp, lp.params[pi].param); i >= 0 && ps.landing(lp, pi).passthrough)
        passthrough.insert(storage_key(lp.slots[static_cast<std::size_t>(i)].captured));
    for (std::size_t i = 0; i < lp.slots.size(); ++i) {
      const PlannedSlot& s = lp.slots[i];
      if (!s.defined() || s.role.effective_init() != Init::copy_new || detail::patch_leaves_unchanged(s) ||
          passthrough.count(storage_key(s.captured)))
        continue;
      // By blocks, from a parameter that lands unchanged: the touched blocks
      // are recomputed (Note [Patches through block derivations]).
      if (const PlannedDerivation* d = detail::derivation_of(lp, i)) {
        if (passthrough.count(storage_key(lp.slots[d->source].captured))) continue;
        return concat(s.name, " (", to_string(s.role.role), " of ", s.owner, ") derives by blocks from '",
                      lp.slots[d->source].local, "', which does not land unchanged in captured storage");
      }
      // By layout, the same (Note [Patches through layout derivations]).
      if (const PlannedLayout* l = detail::layout_of(lp, i)) {
        if (passthrough.count(storage_key(lp.slots[l->source].captured))) continue;
        return concat(s.name, " (", to_string(s.role.role), " of ", s.owner, ") is a layout of '",
                      lp.slots[l->source].local, "', which does not land unchanged in captured storage");
      }
      return concat(s.name, " (", to_string(s.role.role), s.owner.empty() ? "" : " of ", s.owner,
                    ") is derived without a declared derivation");
    }
    return {};
  };
  for (std::size_t li = 0; li < L; ++li) {
    if (ps.by_layer[li].empty()) continue;
    sp.touched[li] = 1;
    std::string why = rerun_why(li);
    ps.rep.patch.landings.push_back({plan.layers()[li].prefix, !why.empty(), 0, 0, why});
    if (why.empty()) {
      ps.rep.patch.layers_scattered += 1;
      continue;
    }
    sp.rerun[li] = 1;
    ps.rep.patch.layers_rerun += 1;
    ps.rep.patch.rerun_why.push_back(concat(plan.layers()[li].prefix, ": ", why));
    const LayerPlan& lp = plan.layers()[li];
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
      const ServedParam& p = ps.landing(lp, pi);
      GK_CHECK(WeightError, p.passthrough || !p.base.empty(), ps.label, ": tensor '",
               ps.patch.entries[ps.by_layer[li].front()].name, "' cannot be patched: its layer '", lp.prefix,
               "' must run PWAL again, and ", p.no_base, "; nothing was changed");
    }
  }
}

// Scatter layers: the entries and their undo (Note [One scatter per
// storage] in patch_landing.cpp); what each touched tensor will hash is
// checked by check_scatter_targets, through the commit's own writes.
// Every scatter layer's entries are merged in one call, and so in one
// launch per device (Note [Merging entries in one launch]); the derived
// blocks and layouts are landed layer by layer.
void ReloadEngine::Impl::stage_scatter_layers(PatchStaging& ps) {
  ReloadReport& rep = ps.rep;
  ScopedMsTimer t(rep.times.load_ms);
  std::vector<PatchLanding> all;
  for (std::size_t li = 0; li < plan.layers().size(); ++li) {
    if (!ps.sp->touched[li] || ps.sp->rerun[li]) continue;
    const LayerPlan& lp = plan.layers()[li];
    fault(testing::FaultPoint::load, lp.prefix);
    std::vector<PatchLanding> ls;
    ls.reserve(ps.by_layer[li].size());
    for (std::size_t k : ps.by_layer[li]) {
      ls.push_back(PatchStaging::landing_of(ps.dst[k], ps.patch.entries[k]));
      ps.targets.push_back(ls.back().bits);
      ps.target_entries.push_back(&ps.patch.entries[k]);
    }
    ReloadReport::PatchStats::Landing& landing = *std::find_if(
        rep.patch.landings.begin(), rep.patch.landings.end(), [&](const auto& l) { return l.layer == lp.prefix; });
    landing.blocks_recomputed = land_derived_blocks(lp, ls, *ps.sp, hooks.land_chunk_elements);
    landing.layout_elements = land_layout_elements(lp, ls, *ps.sp);
    rep.patch.blocks_recomputed += landing.blocks_recomputed;
    rep.patch.layout_elements += landing.layout_elements;
    fault(testing::FaultPoint::check, lp.prefix);
    all.insert(all.end(), std::make_move_iterator(ls.begin()), std::make_move_iterator(ls.end()));
  }
  land_patch_entries(all, *ps.sp, ps.o.verify_served);
}

// The target hash of every tensor the scatter layers touch, over the bytes
// the commit will leave: the served hash plus the change of the words the
// commit's writes cover, as choose_patch_writes made them (sector images
// included), in one launch and one wait for the whole patch (Note [Hashing
// through the writes] in graphkeep/hashing/overlaid_hash.h). Nothing is
// copied, only the covered words are read, and a write that would leave a
// wrong byte fails here, before the commit.
void ReloadEngine::Impl::check_scatter_targets(PatchStaging& ps) {
  if (hooks.patch_writes)
    for (ScatterItem& w : ps.sp->writes) hooks.patch_writes(w.values, w.sectors);
  if (ps.targets.empty()) return;
  ScopedMsTimer t(ps.rep.times.hash_ms);
  // A tensor a dense write covers whole will hold that write's values (its
  // whole hash); the others, their served bytes through the sparse writes
  // (the served hash, which check_patch_against_served found equal to the
  // entry's base hash, plus the change).
  std::vector<HashOverlay> overlays;
  std::map<std::pair<const void*, std::size_t>, at::Tensor> dense;
  const std::vector<char> shares_words = destinations_meeting(ps.sp->writes, 8);
  for (std::size_t i = 0; i < ps.sp->writes.size(); ++i) {
    const ScatterItem& w = ps.sp->writes[i];
    if (w.indices.defined())
      // Note [Exclusive writes]: a sector image shares no byte with another
      // write (use_sector_images converts only writes that share none, and
      // the elements outside its whole sectors lie in other words); an
      // element write whose destination shares no word with another's.
      overlays.push_back({w.dst, w.indices, w.values, w.sectors ? 32 : static_cast<int>(w.dst.element_size()),
                          /*exclusive=*/w.sectors || shares_words[i] == 0});
    else
      dense[{w.dst.const_data_ptr(), w.dst.nbytes()}] = w.values;
  }
  std::vector<at::Tensor> sparse, whole;
  std::vector<std::uint64_t> before;
  std::vector<std::size_t> sparse_of, whole_of;
  for (std::size_t j = 0; j < ps.targets.size(); ++j) {
    const at::Tensor& t = ps.targets[j];
    if (const auto it = dense.find({t.const_data_ptr(), t.nbytes()}); it != dense.end()) {
      whole.push_back(it->second);
      whole_of.push_back(j);
    } else {
      sparse.push_back(t);
      before.push_back(ps.target_entries[j]->base_hash);
      sparse_of.push_back(j);
    }
  }
  std::vector<std::uint64_t> got(ps.targets.size());
  PendingContentHashes pending(std::move(whole), HashStream::current);
  const std::vector<std::uint64_t> through = overlaid_content_hashes(sparse, before, overlays);
  const std::vector<std::uint64_t> of_whole = pending.get();
  for (std::size_t i = 0; i < sparse_of.size(); ++i) got[sparse_of[i]] = through[i];
  for (std::size_t i = 0; i < whole_of.size(); ++i) got[whole_of[i]] = of_whole[i];
  std::size_t at_next = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const PatchEntry& pe = *ps.target_entries[j];
    GK_CHECK(WeightError, got[j] == pe.target_hash, ps.label, ": tensor '", pe.name, "': after the patch its "
             "content hash is ", format_content_hash(got[j]), " but the patch's target hash is ",
             format_content_hash(pe.target_hash), " (the patch's values do not produce its target version '",
             ps.patch.target_version, "'); nothing was changed");
    *ps.next->find(pe.name, &at_next) = pe.target_hash;
  }
}

// Re-run layers: rebuild, patch, and run them through the pipeline.
void ReloadEngine::Impl::stage_rerun_layers(PatchStaging& ps, detail::StagedState& st) {
  ps.runs = new_runs();
  if (!ps.sp->any_rerun()) return;
  const InMemorySource described({}, std::string(ps.label));
  StageGuard guard(plan, [this](std::string why) { mark_inconsistent(std::move(why), /*weights_changed=*/true); });
  try {
    for (std::size_t li = 0; li < plan.layers().size(); ++li)
      if (ps.sp->rerun[li]) rerun_patched_layer(ps, li, described, guard);
    settle_staged(ps.runs, guard.copies(), st, ps.sp->rerun);
  } catch (...) {
    if (!rollback_all(ps.runs, st.options)) fields_unrestored = true;
    throw;
  }
}

void ReloadEngine::Impl::rerun_patched_layer(PatchStaging& ps, std::size_t li, const WeightSource& described,
                                             PwalGuard& guard) {
  const Patch& patch = ps.patch;
  LayerPlan& lp = plan.layers()[li];
  LayerRun& run = ps.runs[li];
  std::map<std::string, const PatchEntry*> touched;
  for (std::size_t k : ps.by_layer[li]) touched.emplace(patch.entries[k].name, &patch.entries[k]);
  {
    ScopedMsTimer t(ps.rep.times.load_ms);
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
      const CheckpointParam& cp = lp.params[pi];
      const ServedParam& p = ps.landing(lp, pi);
      for (std::size_t ti = 0; ti < cp.tensors.size(); ++ti) {
        const CheckpointTensor& ct = cp.tensors[ti];
        const std::string name = lp.full_name(ct.name);
        const at::Tensor base = p.passthrough ? captured_tensor(expected.at(name)) : p.base[ti];
        GK_INTERNAL_ASSERT(base.defined(), "no base for '", name, "'");
        const auto hit = touched.find(name);
        const at::Tensor whole = hit != touched.end() ? patched(base, *hit->second) : base.clone();
        const std::int64_t piece = ct.num_shards > 1 ? ct.shape[static_cast<std::size_t>(ct.shard_dim)] / ct.num_shards : 0;
        for (std::int64_t s = 0; s < ct.num_shards; ++s)
          run.pending.push_back({pi, ti, s,
                                 ct.num_shards == 1 ? whole : whole.narrow(ct.shard_dim, s * piece, piece).contiguous(),
                                 name});
        run.shards.mark_all(expected.at(name).flat);
      }
    }
    run.loaded = run.expected;
  }
  snapshot_and_detach(lp, run, guard);
  detail::RunOptions ro = ps.o;
  ro.hash_served = true;
  ro.patch_base = kept_where(*ps.S, lp, ps.o.patch_base);
  process(lp, run, ro, ps.rep, described, guard);
  // Every loaded tensor is the target (touched) or what is served.
  GK_INTERNAL_ASSERT(run.record.recorded, "a re-run layer was not recorded");
  // (The layer's names from the plan's: what is served may carry another
  // plan's, from prepare(first_load), so it is looked up by name.)
  const detail::ServedNames& names = *served_names;
  GK_INTERNAL_ASSERT(names.layer_size(li) == run.record.hashes.size(), "a re-run layer recorded ",
                     run.record.hashes.size(), " hashes for ", names.layer_size(li), " checkpoint tensors");
  for (std::size_t k = 0; k < run.record.hashes.size(); ++k) {
    const std::string& name = names.name(names.position(li, k));
    const std::uint64_t h = run.record.hashes[k];
    const auto hit = touched.find(name);
    const std::uint64_t want = hit != touched.end() ? hit->second->target_hash : *ps.S->find(name);
    GK_CHECK(WeightError, h == want, ps.label, ": tensor '", name, "': ",
             hit != touched.end()
                 ? concat("after the patch its content hash is ", format_content_hash(h),
                          " but the patch's target hash is ", format_content_hash(want),
                          " (the patch's values do not produce its target version '", patch.target_version, "')")
                 : concat("rebuilt from its base it hashes ", format_content_hash(h), " but the engine serves ",
                          format_content_hash(want), " (its base no longer holds the served values)"),
             "; nothing was changed");
    *ps.next->find(name) = h;
  }
  land_rerun_passthrough(ps, lp, run, touched);
  for (auto& [name, p] : run.record.params) ps.next->params.insert_or_assign(name, std::move(p));
  run.record = LayerRecord{};
}

// A re-run layer's passthrough parameters go by scatter: their slots (and
// views of the same bytes) commit in place, the touched tensors' entries
// are written into captured storage.
void ReloadEngine::Impl::land_rerun_passthrough(PatchStaging& ps, LayerPlan& lp, LayerRun& run,
                                                const std::map<std::string, const PatchEntry*>& touched) {
  std::vector<PatchLanding> landings;
  for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
    const CheckpointParam& cp = lp.params[pi];
    const std::string full = lp.full_name(cp.param);
    const auto rec = std::find_if(run.record.params.begin(), run.record.params.end(),
                                  [&](const auto& x) { return x.first == full; });
    const std::ptrdiff_t i = param_slot(lp, cp.param);
    if (rec == run.record.params.end() || !rec->second.passthrough || i < 0 ||
        !run.current[static_cast<std::size_t>(i)].defined())
      continue;
    const PlannedSlot& slot = lp.slots[static_cast<std::size_t>(i)];
    const void* staged_key = storage_key(run.current[static_cast<std::size_t>(i)]);
    // Note [Re-run layers release their passthrough copies]: the layer's
    // fields stop pointing at the staged copy now, not at the end of the
    // stage, so a patch touching every layer of a MoE holds one layer's
    // copy at a time, not a second model.
    for (std::size_t j = 0; j < lp.slots.size(); ++j)
      if (run.current[j].defined() && run.current[j].has_storage() && storage_key(run.current[j]) == staged_key &&
          lp.slots[j].defined() && storage_key(lp.slots[j].captured) == storage_key(slot.captured)) {
        run.current[j] = lp.slots[j].captured;
        detail::repoint(lp, lp.slots[j]);
      }
    for (std::size_t ti = 0; ti < cp.tensors.size(); ++ti) {
      const auto hit = touched.find(lp.full_name(cp.tensors[ti].name));
      if (hit == touched.end()) continue;
      const at::Tensor& dst = ps.dst[static_cast<std::size_t>(hit->second - ps.patch.entries.data())];
      GK_INTERNAL_ASSERT(dst.defined(), "a passthrough parameter without a captured tensor");
      landings.push_back(PatchStaging::landing_of(dst, *hit->second));
      ps.targets.push_back(landings.back().bits);
      ps.target_entries.push_back(hit->second);
    }
  }
  land_patch_entries(landings, *ps.sp, ps.o.verify_served);
}

// The commit's undo, gathered from the served storage in one launch
// (gather_items), then how the commit writes (Note [Sector images] in
// cuda/patch_scatter.h): the images are made here, from the captured
// storage the commit will write, which nothing writes before then (a
// commit after another write of the weights is refused as stale). PatchWrites::automatic writes sectors on a
// GPU only while their images (at most) fit in half of what the device has
// left: at a real AdamW step's density a 30B MoE's images come near the
// model's own size.
void ReloadEngine::Impl::choose_patch_writes(PatchStaging& ps) {
  const detail::RunOptions& o = ps.o;
  std::vector<ScatterItem>& writes = ps.sp->writes;
  const auto wants_sectors = [&](const ScatterItem& w) {
    return o.patch_writes == PatchWrites::sectors || (o.patch_writes == PatchWrites::automatic && w.dst.is_cuda());
  };
  {
    ScopedMsTimer t(ps.rep.times.load_ms);
    gather_items(ps.sp->undo);
  }
  bool sectors = o.patch_writes == PatchWrites::sectors;
  if (o.patch_writes == PatchWrites::automatic) {
    std::size_t need = 0;
    c10::Device device(c10::kCPU);
    for (const ScatterItem& w : writes)
      if (wants_sectors(w)) need += sector_image_bytes_bound(w), device = w.dst.device();
    sectors = need > 0 && need <= device_headroom(device) / 2;
    ps.rep.patch.sectors_declined = need > 0 && !sectors;
  }
  if (sectors) {
    ScopedMsTimer t(ps.rep.times.load_ms);
    use_sector_images(writes, wants_sectors);
  }
  ps.rep.patch.bytes_scattered = 0;
  for (const ScatterItem& w : writes) {
    ps.rep.patch.bytes_scattered += w.bytes();
    if (w.sectors) ps.rep.patch.sectors_written += static_cast<std::size_t>(w.indices.numel());
  }
}

void ReloadEngine::Impl::commit_patch(detail::StagedState& st, ReloadReport& rep) {
  StagedPatch& p = *st.patch;
  {
    ScopedMsTimer t(rep.times.copy_ms);
    scatter_items(p.writes);
  }
  try {
    for (std::size_t li = 0; li < p.touched.size(); ++li)
      if (p.touched[li]) fault(testing::FaultPoint::scatter, plan.layers()[li].prefix);
    if (!p.verify.empty()) {
      ScopedMsTimer t(rep.times.hash_ms);
      const std::vector<std::uint64_t> got = content_hashes(p.verify);
      for (std::size_t i = 0; i < got.size(); ++i)
        GK_CHECK(WeightError, got[i] == p.verify_hashes[i], "gk::testing::EngineHooks::verify_served: after the commit's "
                 "scatter, checkpoint tensor '", p.verify_names[i], "' in captured storage hashes ",
                 format_content_hash(got[i]), " instead of the patch's target ", format_content_hash(p.verify_hashes[i]),
                 " (something else wrote it); the patch was rolled back");
    }
    ScopedMsTimer t(rep.times.copy_ms);
    wait_for(p.writes);
  } catch (...) {
    try {
      scatter_items(p.undo);
      wait_for(p.undo);
      p.undone = true;
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
}

}  // namespace gk
