// The weight stream: which checkpoint tensors the model expects, the
// source read one tensor at a time, each layer processed as soon as its
// weights are complete, and the completion gate at the end.
//
// Note [The completion gate]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A source yields checkpoint tensors (or shards of one) by name, in any
// order. Each is checked against what the model expects (name, shard,
// shape, dtype; a whole parameter under its own name counts as all of its
// tensors) and delivered exactly once; a layer is processed the moment its
// set is complete, so that peak memory stays near one layer above the
// model. When the source ends, every expected tensor and shard must have
// arrived: a missing one fails the reload, naming it (partial shards
// included), before anything of a transactional reload is committed.
#include "engine_impl.h"
#include "known_hashes.h"
#include "non_finite.h"
#include "reload_internal.h"
#include "served_state.h"
#include "trace_range.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace gk {
namespace {

// For a message about checkpoint tensor e: the name of its parameter
// delivered whole, which may be how it came before.
std::string whole_note(const SlotPlan& plan, const std::unordered_map<std::string, ExpectedParam>& expected_params,
                       const Expected& e) {
  const LayerPlan& lp = plan.layers()[e.layer];
  const std::string full = lp.full_name(lp.params[e.param].param);
  return expected_params.count(full) ? concat(" (or as part of parameter '", full, "', delivered whole)")
                                     : std::string();
}
// Note [Scanning a resident source first]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A streaming reload copies layer by layer back into captured storage, so
// a non-finite value found in layer L (Note [Refusing non-finite weights])
// used to leave layers before L copied back: the model mixed two weight
// sets and replay stayed refused until a recovery reload. A diverged
// trainer makes exactly such checkpoints. When the source is resident (WeightSource::resident(): a
// trainer's tensors handed over in memory) on the device, the reload scans
// all of it first, in one batched read, and refuses before it copies
// anything: the old weights stay served, as in the staged and
// transactional modes. The per-layer scans are then skipped, so the bytes
// are read once either way. A source resident on the host for a model on a
// GPU, and a source read as it goes (a safetensors file), keep the
// per-layer scan: scanning them first would read host memory on the CPU
// (or the file twice), far slower than the reload; stage() or a
// transactional reload refuses them with nothing changed (docs/reload.md).
//
// The scan also hashes (Note [Scanning while summing] in
// hashing/cuda/content_hash.cu): the reload hashes each checkpoint tensor it
// loads (Note [Patch landings]), and an adopted tensor's bytes are the
// source's, so the scan reads the source as those ranges (a whole parameter
// by its checkpoint tensors: a MoE's stacked experts, a fused q/k/v) and
// keeps their hashes in `known`; the layers' loads hash only the bytes the
// scan did not read.
//
//
// Note [Processing while the scan runs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The scan is one read of the whole source on the device (a third of a
// reload's device time, and more of its wall time: the host used to wait
// for it before it touched the first layer). Nothing before the first
// copy-back writes captured storage, so the reload does not wait: it
// launches the scan (SourceScan), then loads, runs PWAL on and checks the
// first layers while the device reads, and waits for the scan's verdict
// only before the first copy into captured storage. A non-finite value
// then fails the reload with every processed layer rolled back and nothing
// copied, as before. Layers processed ahead hold what they loaded: only
// layers whose tensors were all adopted (no copy of their own) go ahead,
// at most kAheadOfScan of them, so the memory a streaming reload holds
// stays a few layers' derived tensors. The loads' hashes that the scan
// took (KnownHashes) are filled in when the records are finished, after
// the verdict.
constexpr std::size_t kAheadOfScan = 4;
// The most copied-back layers whose records hold no copy of their own may
// wait unfinished for their hashes (Note [Copy back one layer late]).
constexpr std::size_t kRecordsBehind = 16;
// The same for a layer that loaded copies of its own: at most one waits
// (it then holds what its copy-back could not hash as it copied).
constexpr std::size_t kCopiesBehind = 1;

// The scan of a resident source: launched by the constructor, answered by
// verdict() (waits; throws gk::WeightError naming the first non-finite
// tensor) or, for the hashes alone, by hashes().
class SourceScan {
 public:
  // scanned() is false where the source cannot be scanned first (not
  // resident, a tensor undefined, or on the host for a model on a GPU).
  SourceScan(const WeightSource& source, bool model_on_cuda, const SlotPlan& plan,
             const std::unordered_map<std::string, ExpectedParam>& expected_params);
  bool scanned() const noexcept { return scanned_; }
  // Whether verdict() would not wait.
  bool ready() const { return !pending_.has_value() || pending_->ready(); }
  // Whether verdict() ran (and passed). (hashes() alone answers, not judges.)
  bool judged() const noexcept { return judged_; }
  void verdict();
  const std::vector<std::uint64_t>& hashes();
  // The hashes the scan takes, for the loads (its values come from hashes():
  // it must not outlive this scan).
  std::shared_ptr<detail::KnownHashes> known;

 private:
  void answer();
  bool scanned_ = false, answered_ = false, judged_ = false;
  std::string description_;
  std::vector<at::Tensor> values_;
  std::string names_;                // every name, end to end (the source's are moved out as it yields them)
  std::vector<std::size_t> name_at_;  // tensor i's name: [name_at_[i], name_at_[i + 1])
  std::vector<std::int64_t> shard_;
  std::vector<std::int64_t> first_;  // per tensor: its first non-finite element, or -1
  std::vector<std::size_t> range_of_;       // per range: its tensor
  std::vector<std::int64_t> range_first_;  // per range: the element of its tensor where it starts
  std::optional<detail::PendingHashScan> pending_;
  detail::HashScan r_;
};

SourceScan::SourceScan(const WeightSource& source, bool model_on_cuda, const SlotPlan& plan,
                       const std::unordered_map<std::string, ExpectedParam>& expected_params) {
  const std::span<const NamedTensor> all = source.resident();
  if (all.empty()) return;
  values_.reserve(all.size());
  for (const NamedTensor& nt : all) {
    if (!nt.value.defined()) return;  // refused by name when it arrives
    if (model_on_cuda && !nt.value.is_cuda()) return;
    values_.push_back(nt.value);
  }
  scanned_ = true;
  description_ = source.describe();
  name_at_.reserve(all.size() + 1);
  shard_.reserve(all.size());
  for (const NamedTensor& nt : all) {
    name_at_.push_back(names_.size());
    names_ += nt.name;
    shard_.push_back(nt.shard);
  }
  name_at_.push_back(names_.size());
  // CUDA tensors with an exponent test (or none to make: not floating), as
  // ranges read once for both; the rest (on the host, or of a dtype torch
  // tests) by first_non_finite, at once.
  first_.assign(values_.size(), -1);
  std::vector<ContentRange> ranges;
  std::vector<detail::ExponentTest> tests;
  ranges.reserve(values_.size());
  tests.reserve(values_.size());
  range_of_.reserve(values_.size());
  range_first_.reserve(values_.size());
  std::vector<at::Tensor> other;
  std::vector<std::size_t> other_at;
  for (std::size_t i = 0; i < values_.size(); ++i) {
    const at::Tensor& t = values_[i];
    const bool floating = at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
    const detail::ExponentTest e = detail::exponent_test(t.scalar_type());  // none for integers
    if (!(t.is_cuda() && t.is_contiguous() && t.layout() == at::kStrided && (e.bytes != 0 || !floating))) {
      other.push_back(t);
      other_at.push_back(i);
      continue;
    }
    const std::size_t before = ranges.size();
    const auto whole = expected_params.find(all[i].name);
    if (whole != expected_params.end() && all[i].shard == 0 && t.sizes().equals(whole->second.shape))
      append_tensor_ranges(plan.layers()[whole->second.layer].params[whole->second.param], t, ranges);
    else
      ranges.push_back({t, 0, t.nbytes()});
    for (std::size_t k = before; k < ranges.size(); ++k) {
      tests.push_back(e);
      range_of_.push_back(i);
      range_first_.push_back(static_cast<std::int64_t>(ranges[k].offset / t.element_size()));
    }
  }
  if (!ranges.empty()) {
    known = std::make_shared<detail::KnownHashes>(
        [this]() -> const std::vector<std::uint64_t>& { return hashes(); });
    known->reserve(ranges.size());
    for (std::size_t k = 0; k < ranges.size(); ++k) known->add(ranges[k].tensor, ranges[k].offset, ranges[k].nbytes, k);
    pending_.emplace(std::move(ranges), std::move(tests));
  }
  if (!other.empty()) {
    const std::vector<std::int64_t> f = detail::first_non_finite(other);
    for (std::size_t k = 0; k < other.size(); ++k) first_[other_at[k]] = f[k];
  }
}

void SourceScan::answer() {
  if (answered_) return;
  if (pending_) {
    r_ = pending_->get();
    pending_.reset();
    for (std::size_t k = 0; k < range_of_.size(); ++k) {
      const std::size_t i = range_of_[k];
      if (r_.first_bad[k] >= 0 && first_[i] < 0)  // ranges ascend: the first hit is the lowest
        first_[i] = range_first_[k] + r_.first_bad[k];
    }
  }
  answered_ = true;
}

const std::vector<std::uint64_t>& SourceScan::hashes() {
  answer();
  return r_.hashes;
}

void SourceScan::verdict() {
  answer();
  for (std::size_t i = 0; i < values_.size(); ++i) {
    if (first_[i] < 0) continue;
    const at::Tensor& t = values_[i];
    const double value = t.reshape({-1})[first_[i]].item<double>();
    const std::string_view name(names_.data() + name_at_[i], name_at_[i + 1] - name_at_[i]);
    GK_THROW(WeightError, "weight '", name, "'", shard_[i] != 0 ? concat(" shard ", shard_[i]) : std::string(),
             " from ", description_, " holds a non-finite value (", value, " at element ", first_[i], " of ",
             t.sizes(),
             "): refused before any layer was copied: the model's weights are unchanged. A diverged trainer writes "
             "such checkpoints; to serve them anyway, set ReloadOptions::allow_non_finite");
  }
  values_.clear();  // the source's tensors: no longer held here
  judged_ = true;
}

bool any_cuda_slot(const SlotPlan& plan) {
  for (const LayerPlan& lp : plan.layers())
    for (const PlannedSlot& s : lp.slots)
      if (s.defined() && s.device.is_cuda()) return true;
  return false;
}
// Counts checkpoint tensor `flat` of `run` as loaded once its last shard
// has arrived: O(its shards) per arrival, not O(the layer's tensors) (a
// MoE layer has about 390).
void count_if_complete(LayerRun& run, std::size_t flat) {
  if (run.shards.complete(flat)) run.loaded += 1;
}
// A whole parameter arrived under its name: it fills every shard of every
// checkpoint tensor of the parameter, none of which may arrive as well.
void deliver_whole(const SlotPlan& plan, const ExpectedParam& ep, NamedTensor&& nt, WeightSource& source,
                   std::vector<LayerRun>& runs, ReloadReport& rep) {
  LayerRun& run = runs[ep.layer];
  const CheckpointParam& cp = plan.layers()[ep.layer].params[ep.param];
  GK_CHECK(WeightError, nt.shard == 0, "parameter '", nt.name, "' arrived as shard ", nt.shard,
           ": a whole parameter arrives in one piece (shard 0); deliver its checkpoint tensors to send shards");
  bool any = false;
  for (std::size_t f : ep.flats) any = any || run.shards.any(f);
  GK_CHECK(WeightError, run.phase == LayerRun::Phase::waiting && !any, "parameter '", nt.name,
           "' was delivered whole by ", source.describe(),
           ", but some of its checkpoint tensors were delivered too (or it came twice); a parameter loads "
           "exactly once, whole or as its checkpoint tensors (", cp.tensors.size(), ")");
  GK_CHECK(WeightError, nt.value.defined(), "parameter '", nt.name, "' is an undefined tensor");
  GK_CHECK(WeightError, nt.value.sizes().equals(ep.shape), "parameter '", nt.name, "' (delivered whole) has shape ",
           nt.value.sizes(), " but the model expects ", at::IntArrayRef(ep.shape),
           " (the checkpoint-format parameter: its checkpoint tensors concatenated along dim 0)");
  GK_CHECK(WeightError, nt.value.scalar_type() == ep.dtype, "parameter '", nt.name, "' has dtype ",
           nt.value.scalar_type(), " but the model expects ", ep.dtype);
  for (std::size_t f : ep.flats) run.shards.mark_all(f);
  run.loaded += ep.flats.size();  // none of them had a shard (checked above)
  rep.tensors_loaded += 1;
  rep.bytes_loaded += nt.value.nbytes();
  run.pending.push_back({ep.param, kWholeParam, 0, std::move(nt.value), std::move(nt.name)});
}
}  // namespace

void ReloadEngine::Impl::index_expected() {
  expected.clear();
  expected_per_layer.assign(plan.layers().size(), 0);
  shard_starts.assign(plan.layers().size(), nullptr);
  for (std::size_t li = 0; li < plan.layers().size(); ++li) {
    const LayerPlan& lp = plan.layers()[li];
    auto starts = std::make_shared<std::vector<std::size_t>>(1, 0);
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi)
      for (std::size_t ti = 0; ti < lp.params[pi].tensors.size(); ++ti) {
        const CheckpointTensor& t = lp.params[pi].tensors[ti];
        std::string full = lp.full_name(t.name);
        GK_CHECK(DeclarationError, !expected.count(full), "checkpoint tensor '", full,
                 "' is expected by two parameters; each checkpoint tensor loads into one place");
        const std::size_t order = expected.size();
        expected.emplace(full, Expected{li, pi, ti, expected_per_layer[li], order, t.shard_shape(), t.dtype,
                                        t.num_shards});
        expected_per_layer[li] += 1;
        starts->push_back(starts->back() + static_cast<std::size_t>(t.num_shards));
      }
    shard_starts[li] = std::move(starts);
  }
  expected_order.assign(expected.size(), nullptr);
  for (const auto& entry : expected) expected_order[entry.second.order] = &entry;
  // Whole parameters, by their full names, where no checkpoint tensor has
  // that name (a plain module's "norm.weight" is both: it stays a tensor).
  expected_params.clear();
  for (std::size_t li = 0; li < plan.layers().size(); ++li) {
    const LayerPlan& lp = plan.layers()[li];
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
      std::string full = lp.full_name(lp.params[pi].param);
      if (expected.count(full)) continue;
      ExpectedParam ep{li, pi, {}, lp.params[pi].shape(), lp.params[pi].dtype()};
      for (const CheckpointTensor& t : lp.params[pi].tensors) ep.flats.push_back(expected.at(lp.full_name(t.name)).flat);
      expected_params.emplace(std::move(full), std::move(ep));
    }
  }
  served_names = std::make_shared<const detail::ServedNames>(plan);
  GK_INTERNAL_ASSERT(served_names->size() == expected.size(), "the plan serves ", served_names->size(),
                     " names for ", expected.size(), " expected checkpoint tensors");
  expected_sorted.assign(expected.size(), nullptr);
  for (const auto* entry : expected_order)
    expected_sorted[served_names->position(entry->second.layer, entry->second.flat)] = &entry->second;
  index_captured_params();
}

// Note [Names arrive in plan order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each tensor a source yields is looked up by its full name: 18,000 times a
// reload of the 30B-A3B MoE. In a hash map of that many entries a lookup
// hashes a name of some 50 bytes and misses the cache two or three times
// (the bucket, the node, its key); perf on the build machine found it the
// largest cost of graphkeep's own in a reload that copies the checkpoint's
// tensors (docs/performance.md, "Figures behind the code"). Sources yield
// in the checkpoint's order almost always (a safetensors index, a trainer's
// state dict), and the plan lists the tensors in that order too. So the
// lookup first compares the name with the entry found last (the next shard
// of the same tensor) and the one after it, which lie side by side in
// expected_order, and only then asks the map: the same answer in any order
// (the reload tests deliver last to first, the structure fuzzer shuffles),
// one string comparison in the usual one.
const std::pair<const std::string, Expected>* ReloadEngine::Impl::find_expected(const std::string& name,
                                                                                std::size_t& cursor) const {
  for (std::size_t k = cursor; k < cursor + 2 && k < expected_order.size(); ++k)
    if (expected_order[k]->first == name) {
      cursor = k;
      return expected_order[k];
    }
  const auto it = expected.find(name);
  if (it == expected.end()) return nullptr;
  cursor = it->second.order;
  return &*it;
}

std::vector<LayerRun> ReloadEngine::Impl::new_runs() const {
  std::vector<LayerRun> runs(plan.layers().size());
  for (std::size_t li = 0; li < runs.size(); ++li) {
    runs[li].expected = expected_per_layer[li];
    runs[li].shards = CompletionSet(shard_starts[li]);
  }
  return runs;
}
void ReloadEngine::Impl::run_layers(WeightSource& source, const detail::RunOptions& options,
                                          PwalGuard& guard, std::vector<LayerRun>& runs, ReloadReport& rep,
                                          bool& any_copied_back) {
  // Note [Scanning a resident source first]: scanned here, not per layer,
  // and answered before the first copy-back (Note [Processing while the
  // scan runs]).
  std::optional<detail::RunOptions> scanned;
  std::optional<SourceScan> scan;
  if (options.mode == ReloadMode::streaming && !options.allow_non_finite) {
    detail::PhaseScope t(rep.times.finite_ms, "gk.source_scan");
    scan.emplace(source, any_cuda_slot(plan), plan, expected_params);
    if (scan->scanned()) {
      scanned = options;
      scanned->source_scanned = true;
      if (scan->known != nullptr && !scan->known->empty()) scanned->known_hashes = scan->known;
    } else {
      scan.reset();
    }
  }
  const detail::RunOptions& o = scanned ? *scanned : options;
  std::size_t pretend_pending = hooks.scan_pending_layers;  // testing: the scan still runs for this many layers
  // Whether layer li's record holds no copy of its own: every tensor adopted.
  auto holds_no_copy = [&](std::size_t li) {
    const std::vector<char>& adopted = runs[li].record.adopted;
    return !adopted.empty() && std::all_of(adopted.begin(), adopted.end(), [](char a) { return a != 0; });
  };
  // Whether the layers processed and not yet copied back may stay so while
  // one more is processed, for whatever reason they wait: fewer than
  // kAheadOfScan of them, every tensor adopted (they hold no loads).
  auto may_hold = [&](const std::deque<std::size_t>& late) {
    return late.size() < kAheadOfScan && std::all_of(late.begin(), late.end(), holds_no_copy);
  };
  // Whether they may wait for the scan's verdict.
  auto go_ahead = [&](const std::deque<std::size_t>& late) {
    if (!scan || scan->judged() || !may_hold(late)) return false;
    if (pretend_pending > 0) {
      --pretend_pending;
      return true;
    }
    return !scan->ready();
  };
  // Whether, the scan judged, the oldest layer processed and not yet
  // copied back may wait while one more is processed: its copy-back would
  // wait for its checks' verdicts, which are still on their way behind the
  // copies already queued (Note [Copy back one layer late]).
  auto verdicts_pending = [&](const std::deque<std::size_t>& late) {
    return !late.empty() && may_hold(late) && !runs[late.front()].from_shapes.bytes.ready();
  };
  auto scan_verdict = [&] {
    if (!scan || scan->judged()) return;
    detail::PhaseScope t(rep.times.finite_ms, "gk.source_scan_verdict");
    scan->verdict();
  };
  try {
    {
      detail::PhaseScope t(rep.times.detach_ms, "gk.detach_all");
      for (std::size_t li = 0; li < runs.size(); ++li) snapshot_and_detach(plan.layers()[li], runs[li], guard);
    }
    // Note [Copy back one layer late]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // A streaming reload copies each layer back after it is processed, but not
    // at once: layer L-1's copy-back is enqueued while layer L's non-finite
    // scan runs (process's `meanwhile`). The scan waits, through an event, for
    // what the stream held when it was launched; had L-1's copy been queued
    // first, the host would wait for that copy at every layer and could no
    // longer run ahead of the device (Note [The check on a side stream]).
    // Nothing is weaker: a layer is copied back only after it was processed and
    // checked, and a failure at layer L leaves L-1 processed, not copied back
    // (rolled back) -- a streaming reload that fails after copying back some
    // layer is inconsistent either way. Where the source was scanned whole
    // first (Note [Scanning a resident source first]), layer L has no scan to
    // overlap: L-1's copy-back is enqueued after L's PWAL and checks instead,
    // so that the verdicts of L-1's checks, which the copy-back reads first,
    // were launched before L-2's copy and reading them leaves that copy
    // queued, not drained. They were launched after the copies queued
    // before L's PWAL, though, and where the host runs ahead of the device
    // those are still running: while the verdicts of the oldest layer not
    // yet copied back are not in (asked of their events, never waited for),
    // layers whose tensors were all adopted wait, not copied back, while the
    // next is processed, at most kAheadOfScan of them (verdicts_pending).
    // The same holds for the layer's content hashes after PWAL (which decide
    // how each parameter lands, Note [Patch landings]): launched at the end of
    // layer L-1, collected after L-1's copy-back is enqueued, so neither waits
    // for that copy. Where every tensor of L-1 was adopted (the record holds
    // no copy of its own), they are collected later still: the hashes after
    // PWAL come from the copy itself (Note [Hashing while copying]), and
    // collecting L-1's at L would drain the device's queue at every layer.
    // Such a record is finished once its hashes are in (asked of their
    // events, never waited for), or when kRecordsBehind records wait. A
    // fixed lag of two layers, as before, counted the plan's layers, not
    // the device's work: in a MoE decoder layer the norms and the attention
    // come between two expert stacks, so the host waited for each stack's
    // copy as soon as it was queued and the device idled while the host
    // prepared the next (docs/performance.md, "Figures behind the code").
    // A layer with copies of its own (checkpoint tensors loaded into fresh
    // parameters) was finished at once, since deferring it held its loads:
    // the host waited for each layer's copy-back as soon as it had queued
    // it, and the device idled while the host loaded the next layer. Its
    // record now drops the loads whose hashes the copy-back takes
    // (release_copied_loads: the copy was enqueued on the current stream,
    // where the allocator reuses that memory after it) and is finished once
    // its hashes are in, or when a second such record waits
    // (kCopiesBehind), so the reload still holds about one layer of loads.
    std::deque<std::size_t> late;  // processed, their copy-backs not yet enqueued
    std::deque<std::size_t> unrecorded;  // copied back, their records not yet finished
    auto finish_records = [&](std::size_t keep) {
      while (!unrecorded.empty() && (unrecorded.size() > keep || record_ready(runs[unrecorded.front()]))) {
        const std::size_t li = unrecorded.front();
        unrecorded.pop_front();
        detail::TraceRange r("gk.finish_record");
        finish_record_after_pwal(plan.layers()[li], runs[li], o, rep);
      }
    };
    auto copy_back_late = [&](bool last) {
      if (late.empty() || (!last && go_ahead(late))) return;
      scan_verdict();  // before anything is copied
      while (!late.empty()) {
        if (!last && verdicts_pending(late)) break;
        const std::size_t li = late.front();
        late.pop_front();
        copy_back(plan.layers()[li], runs[li], o, rep, guard);
        any_copied_back = true;
        unrecorded.push_back(li);
        const bool own_copies = !holds_no_copy(li);
        if (own_copies) release_copied_loads(runs[li]);
        finish_records(own_copies ? kCopiesBehind : kRecordsBehind);  // (a record of no parameters waits for nothing either way)
      }
    };
    auto finish_layer = [&](std::size_t li) {
      process(plan.layers()[li], runs[li], o, rep, source, guard,
              o.mode == ReloadMode::streaming ? std::function<void()>([&] { copy_back_late(false); })
                                              : std::function<void()>());
      if (o.mode == ReloadMode::streaming) {
        GK_INTERNAL_ASSERT(late.size() < kAheadOfScan + 1,
                           "process() returned without running its `meanwhile`: layer '",
                           plan.layers()[late.front()].prefix, "' would never be copied back");
        late.push_back(li);
      }
    };
    // Layers without checkpoint tensors (PWAL-only) are complete at once.
    for (std::size_t li = 0; li < runs.size(); ++li)
      if (runs[li].expected == 0) finish_layer(li);

    std::size_t cursor = 0;  // where the last tensor was expected (Note [Names arrive in plan order])
    while (true) {
      std::optional<NamedTensor> nt;
      {
        ScopedMsTimer t(rep.times.load_ms);
        nt = source.next();
      }
      if (!nt) break;
      const auto* it = find_expected(nt->name, cursor);
      if (it == nullptr) {
        auto wp = expected_params.find(nt->name);
        GK_CHECK(WeightError, wp != expected_params.end(), source.describe(), " has weight '", nt->name,
                 "', which the model does not expect (no layer lists it among its checkpoint tensors, and no "
                 "parameter has that name)");
        deliver_whole(plan, wp->second, std::move(*nt), source, runs, rep);
        if (runs[wp->second.layer].loaded == runs[wp->second.layer].expected) finish_layer(wp->second.layer);
        continue;
      }
      const Expected& e = it->second;
      LayerRun& run = runs[e.layer];
      GK_CHECK(WeightError, nt->shard >= 0 && nt->shard < e.num_shards, "weight '", nt->name, "' shard ",
               nt->shard, " is out of range: the model expects ", e.num_shards, " shard(s)");
      GK_CHECK(WeightError, run.phase == LayerRun::Phase::waiting && !run.shards.has(e.flat, nt->shard),
               "weight '", nt->name, "'", e.num_shards > 1 ? concat(" shard ", nt->shard) : std::string(),
               " was delivered twice by ", source.describe(), whole_note(plan, expected_params, e),
               "; each checkpoint tensor loads exactly once");
      GK_CHECK(WeightError, nt->value.defined(), "weight '", nt->name, "' is an undefined tensor");
      GK_CHECK(WeightError, nt->value.sizes().equals(e.shard_shape), "weight '", nt->name, "'",
               e.num_shards > 1 ? concat(" shard ", nt->shard) : std::string(), " has shape ", nt->value.sizes(),
               " but the model expects ", at::IntArrayRef(e.shard_shape));
      GK_CHECK(WeightError, nt->value.scalar_type() == e.dtype, "weight '", nt->name, "' has dtype ",
               nt->value.scalar_type(), " but the model expects ", e.dtype);
      run.shards.mark(e.flat, nt->shard);
      rep.tensors_loaded += 1;
      rep.bytes_loaded += nt->value.nbytes();
      run.pending.push_back({e.param, e.tensor, nt->shard, std::move(nt->value), std::move(nt->name)});
      count_if_complete(run, e.flat);
      if (run.loaded == run.expected) finish_layer(e.layer);
    }

    copy_back_late(/*last=*/true);
    scan_verdict();  // (a source of layers without checkpoint tensors alone)
    finish_records(0);
  } catch (...) {
    // A failure while the scan ran (a PWAL that chokes on a NaN, say):
    // the non-finite value is the cause to name. Nothing was copied.
    if (!any_copied_back) scan_verdict();
    throw;
  }

  // Completion gate: every checkpoint tensor and every shard, exactly once.
  // Each layer counted its complete tensors as they arrived; the walk over
  // every expected name (18,000 at the MoE) runs only to name what is missing.
  const bool complete = std::all_of(runs.begin(), runs.end(), [](const LayerRun& r) { return r.loaded == r.expected; });
  std::vector<std::string> missing;
  for (const auto& [name, e] : expected) {
    if (complete) break;  // (nothing to name)
    const CompletionSet& s = runs[e.layer].shards;
    std::vector<std::int64_t> absent;
    for (std::int64_t k = 0; k < e.num_shards; ++k)
      if (!s.has(e.flat, k)) absent.push_back(k);
    if (absent.empty()) continue;
    if (e.num_shards == 1 || static_cast<std::int64_t>(absent.size()) == e.num_shards)
      missing.push_back(concat("'", name, "'"));
    else
      missing.push_back(
          concat("'", name, "' (partial: shards ", at::IntArrayRef(absent), " of ", e.num_shards, " missing)"));
  }
  if (!missing.empty()) {
    std::sort(missing.begin(), missing.end());
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 20; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 20) list += concat(", ... (", missing.size() - 20, " more)");
    GK_THROW(WeightError, source.describe(), " ended before the model was complete: ",
                          missing.size(), " checkpoint tensor(s) missing: ", list);
  }

  if (o.mode == ReloadMode::transactional) {
    for (std::size_t li = 0; li < runs.size(); ++li) fault(testing::FaultPoint::before_copies, plan.layers()[li].prefix);
    if (o.before_commit) o.before_commit();
  }
}

}  // namespace gk
