// What the engine serves, by content: gk::ServedWeights, the per-layer
// records a load makes (content hashes before and after PWAL, the landing of
// each checkpoint parameter, kept bases), and the served state built from
// them.
//
// Note [Content versions]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A weight version that counts reloads says that something changed, not
// what is served. The content version does: the content hash
// (graphkeep/hashing, over bytes) of the checkpoint tensors' names and
// content hashes, sorted by name, each as the name's bytes, a zero byte and
// the hash as 8 little-endian bytes. Equal bytes give an equal version
// whichever way they arrived (a full reload, a patch, a chain of patches),
// so reloading weights A after B is recognised as A, and its label (a
// patch's target id, ReloadOptions::version_label) is recalled from the
// engine's record of the versions it served. (The names are sorted once per
// plan, not per load: Note [Served names are the plan's] in served_names.h.)
#include "served_state.h"

#include "engine_impl.h"
#include "copied_from.h"
#include "known_hashes.h"
#include "reload_internal.h"
#include "trace_range.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/delta/detail/element_bits.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/reload/report.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>

namespace gk {

std::string_view to_string(PatchBase b) noexcept {
  switch (b) {
    case PatchBase::none: return "none";
    case PatchBase::device: return "device";
    case PatchBase::pinned_host: return "pinned_host";
  }
  return "?";
}

std::string_view to_string(PatchWrites w) noexcept {
  switch (w) {
    case PatchWrites::automatic: return "automatic";
    case PatchWrites::elements: return "elements";
    case PatchWrites::sectors: return "sectors";
  }
  return "?";
}

std::size_t ServedParam::base_bytes() const {
  std::size_t n = 0;
  for (const at::Tensor& t : base) n += t.defined() ? t.nbytes() : 0;
  return n;
}

// ---------------------------------------------------------------------------
// ServedWeights
// ---------------------------------------------------------------------------
ServedWeights::ServedWeights(std::unique_ptr<State> state) : state_(std::move(state)) {}
ServedWeights::~ServedWeights() = default;

std::optional<std::uint64_t> ServedWeights::hash(std::string_view name) const {
  const std::uint64_t* h = state_->find(name);
  return h != nullptr ? std::optional<std::uint64_t>(*h) : std::nullopt;
}
const std::vector<std::pair<std::string, std::uint64_t>>& ServedWeights::hashes() const {
  const State& s = *state_;
  std::call_once(s.listed, [&s] {
    s.list.reserve(s.values.size());
    for (std::size_t i = 0; i < s.values.size(); ++i) s.list.emplace_back(s.names->name(i), s.values[i]);
  });
  return s.list;
}
std::uint64_t ServedWeights::content_version() const noexcept { return state_->content_version; }
const std::string& ServedWeights::label() const noexcept { return state_->label; }
std::size_t ServedWeights::kept_base_tensors() const noexcept { return state_->kept_tensors; }
std::size_t ServedWeights::kept_base_bytes() const noexcept { return state_->kept_bytes; }
std::string ServedWeights::describe() const {
  const std::string hex = format_content_hash(state_->content_version);
  return state_->label.empty() ? hex : concat(state_->label, " (", hex, ")");
}

void ServedWeights::State::finish() {
  content_version = names->content_version(values);
  kept_tensors = kept_bytes = 0;
  for (const auto& [name, p] : params) {
    kept_tensors += p.base.size();
    kept_bytes += p.base_bytes();
  }
}

const std::uint64_t* ServedWeights::State::find(std::string_view name, std::size_t* cursor) const {
  const std::optional<std::size_t> i = names->find(name, cursor);
  return i ? &values[*i] : nullptr;
}
std::uint64_t* ServedWeights::State::find(std::string_view name, std::size_t* cursor) {
  return const_cast<std::uint64_t*>(std::as_const(*this).find(name, cursor));
}

// ---------------------------------------------------------------------------
// Per-layer records
// ---------------------------------------------------------------------------
void append_tensor_ranges(const CheckpointParam& cp, const at::Tensor& param, std::vector<ContentRange>& out) {
  if (cp.tensors.size() == 1) {
    out.push_back({param, 0, param.defined() ? param.nbytes() : 0});
    return;
  }
  const std::size_t row_bytes =
      param.defined() && param.dim() > 0 && param.size(0) > 0 ? param.nbytes() / static_cast<std::size_t>(param.size(0)) : 0;
  std::size_t at = 0;
  for (const CheckpointTensor& t : cp.tensors) {
    const std::size_t n = row_bytes * static_cast<std::size_t>(t.shape.empty() ? 1 : t.shape.front());
    out.push_back({param, at, n});
    at += n;
  }
}

namespace {

at::Tensor module_tensor_named(torch::nn::Module& m, const std::string& name) {
  at::Tensor t = detail::module_parameter(m, name);
  return t.defined() ? t : detail::module_buffer(m, name);
}

// The checkpoint tensors of a default-mapped parameter: ranges along dim 0
// (model/layer.h), as views of `param` (contiguous, so each view is).
std::vector<at::Tensor> tensor_views(const CheckpointParam& cp, const at::Tensor& param) {
  if (cp.tensors.size() == 1) return {param};
  std::vector<at::Tensor> out;
  std::int64_t row = 0;
  for (const CheckpointTensor& t : cp.tensors) {
    const std::int64_t rows = t.shape.empty() ? 1 : t.shape.front();
    out.push_back(param.narrow(0, row, rows));
    row += rows;
  }
  return out;
}

// Checkpoint tensor ti alone of tensor_views(cp, param), whose rows begin
// at `row`: one view, not all of them (a MoE parameter has hundreds of
// tensors, and a patch asks for each of them).
at::Tensor tensor_view(const CheckpointParam& cp, const at::Tensor& param, std::size_t ti, std::int64_t row) {
  if (cp.tensors.size() == 1) return param;
  const CheckpointTensor& t = cp.tensors[ti];
  const std::int64_t rows = t.shape.empty() ? 1 : t.shape.front();
  // (Contiguous: the rows are one range, made without dispatch: Note [Views
  // without dispatch] in graphkeep/delta/detail/element_bits.h.)
  if (param.dim() >= 1 && detail::aliasable(param)) {
    GK_INTERNAL_ASSERT(row + rows <= param.size(0), "checkpoint tensor ", t.name, " lies past its parameter's rows");
    std::vector<std::int64_t> sizes(param.sizes().begin(), param.sizes().end());
    sizes[0] = rows;
    return detail::contiguous_alias(param, param.storage_offset() + row * param.stride(0), sizes, param.scalar_type());
  }
  return param.narrow(0, row, rows);
}

// Checkpoint tensor ti of parameter pi as delivered, made whole (its shards
// concatenated along the shard dimension).
at::Tensor delivered_whole(const LayerRun& run, std::size_t pi, std::size_t ti, const CheckpointTensor& t) {
  std::vector<at::Tensor> shards(static_cast<std::size_t>(t.num_shards));
  for (const LayerRun::Pending& p : run.pending)
    if (p.param == pi && p.tensor == ti) shards[static_cast<std::size_t>(p.shard)] = p.value;
  if (shards.size() == 1) return shards.front().contiguous();
  return at::cat(shards, t.shard_dim);
}

// A kept base: `t` where the option keeps it, copied unless `own` says the
// tensor belongs to the load alone.
at::Tensor keep(const at::Tensor& t, c10::Device device, PatchBase where, bool own) {
  if (where == PatchBase::pinned_host) {
    const bool pin = at::hasCUDA();
    at::Tensor h = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(pin));
    h.copy_(t);
    return h;
  }
  if (own && t.device() == device) return t;
  return t.to(device, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

}  // namespace

void record_loaded(const LayerPlan& lp, LayerRun& run, const std::vector<at::Tensor>& targets,
                   const std::vector<char>& custom, const detail::RunOptions& o, ReloadReport& rep,
                   const detail::CopiedFrom& copied) {
  LayerRecord& r = run.record;
  r = LayerRecord{};
  if (!o.hash_served) return;
  ScopedMsTimer t(rep.times.hash_ms);
  const std::size_t n = lp.params.size();
  r.loaded.resize(n);
  r.custom = custom;
  r.delivered.resize(n);
  r.adopted.assign(n, 0);
  std::vector<ContentRange> to_hash;
  for (std::size_t pi = 0; pi < n; ++pi) {
    const CheckpointParam& cp = lp.params[pi];
    r.loaded[pi] = detail::storage_view(targets[pi]);
    for (const LayerRun::Adopted& a : run.adopted) r.adopted[pi] = r.adopted[pi] || a.param.is_same(targets[pi]);
    if (!custom[pi]) {
      append_tensor_ranges(cp, r.loaded[pi], to_hash);
    } else {
      for (std::size_t ti = 0; ti < cp.tensors.size(); ++ti) {
        r.delivered[pi].push_back(delivered_whole(run, pi, ti, cp.tensors[ti]));
        const at::Tensor& d = r.delivered[pi].back();
        to_hash.push_back({d, 0, d.defined() ? d.nbytes() : 0});
      }
    }
    r.hashes.resize(r.hashes.size() + cp.tensors.size(), 0);
  }
  // Bytes a streaming reload's scan already hashed (an adopted tensor is
  // the source's own: Note [Scanning a resident source first]) are not
  // read again.
  r.loaded_at.clear();
  if (o.known_hashes != nullptr) {
    std::vector<ContentRange> rest;
    for (std::size_t i = 0; i < to_hash.size(); ++i) {
      const ContentRange& c = to_hash[i];
      if (c.tensor.defined() && c.nbytes > 0) {
        const auto* p = static_cast<const std::byte*>(c.tensor.const_data_ptr()) + c.offset;
        std::optional<std::size_t> k = o.known_hashes->find(p, c.nbytes);
        // A verbatim copy of scanned bytes: the scan's hash of its source
        // (Note [Hashes of verbatim copies] in copied_from.h).
        if (!k && !copied.empty())
          if (const void* from = copied.source_of(p, c.nbytes)) k = o.known_hashes->find(from, c.nbytes);
        if (k) {
          r.known_at.emplace_back(i, *k);
          continue;
        }
      }
      r.loaded_at.push_back(i);
      rest.push_back(std::move(to_hash[i]));
    }
    to_hash = std::move(rest);
    rep.hashes_from_scan += r.known_at.size();
    if (!r.known_at.empty()) r.known = o.known_hashes;
  } else {
    for (std::size_t i = 0; i < to_hash.size(); ++i) r.loaded_at.push_back(i);
  }
  r.loaded_ranges = std::move(to_hash);
  r.recorded = true;
}

void launch_loaded_hashes(LayerRun& run, ReloadReport& rep) {
  LayerRecord& r = run.record;
  if (!r.recorded || r.loaded_hashes != nullptr) return;
  ScopedMsTimer t(rep.times.hash_ms);
  r.loaded_hashes = std::make_shared<PendingContentHashes>(std::move(r.loaded_ranges), HashStream::current);
  r.loaded_ranges.clear();
}

void record_loaded_hashes(LayerRun& run, ReloadReport& rep) {
  LayerRecord& r = run.record;
  launch_loaded_hashes(run, rep);
  if (r.known != nullptr) {
    for (const auto& [i, k] : r.known_at) r.hashes[i] = r.known->hash(k);
    r.known.reset();
    r.known_at.clear();
  }
  if (r.loaded_hashes == nullptr) return;
  ScopedMsTimer t(rep.times.hash_ms);
  const std::vector<std::uint64_t> h = r.loaded_hashes->get();
  r.loaded_hashes.reset();
  for (std::size_t i = 0; i < h.size(); ++i) r.hashes[r.loaded_at[i]] = h[i];
}

namespace {

// Per parameter pi, where its checkpoint tensors start in the layer's flat
// list (`offset`, as record_loaded lists their hashes) and, for those hashed
// again after PWAL, in that list (`first`).
void hash_positions(const LayerPlan& lp, const std::vector<char>& rehash, std::vector<std::size_t>& offset,
                    std::vector<std::size_t>& first) {
  const std::size_t n = lp.params.size();
  offset.assign(n, 0);
  first.assign(n, 0);
  std::size_t flat = 0, hashed = 0;
  for (std::size_t pi = 0; pi < n; ++pi) {
    offset[pi] = flat;
    flat += lp.params[pi].tensors.size();
    if (!rehash[pi]) continue;
    first[pi] = hashed;
    hashed += lp.params[pi].tensors.size();
  }
}

// The first half of record_after_pwal: which parameters may be
// passthrough, and the launch of the hashes of what PWAL left (`by_copy`:
// a passthrough candidate is left to the copy-back, which reads its bytes
// anyway: Note [Hashing while copying]).
void launch_after_pwal_hashes(const LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, bool by_copy) {
  LayerRecord& r = run.record;
  const std::size_t n = lp.params.size();
  // Per parameter: still the module's tensor, in checkpoint format, with a
  // slot whose layout check passed (a plain module has no PWAL: always).
  r.candidate.assign(n, 0);
  r.rehash.assign(n, 0);
  for (std::size_t pi = 0; pi < n; ++pi) {
    if (r.custom[pi]) continue;
    const CheckpointParam& cp = lp.params[pi];
    const at::Tensor cur = module_tensor_named(*lp.module, cp.param);
    bool ok = same_storage_and_offset(cur, r.loaded[pi]) && cur.sizes().equals(cp.shape()) &&
              cur.scalar_type() == cp.dtype() && cur.is_contiguous();
    for (std::size_t i = 0; ok && i < lp.slots.size() && i < run.mismatched.size(); ++i)
      ok = !(lp.slots[i].kind != PlannedSlot::Kind::declared && lp.slots[i].local == cp.param && run.mismatched[i]);
    r.candidate[pi] = ok;
    r.rehash[pi] = lp.layer != nullptr && (ok || o.patch_base != PatchBase::none);
  }
  r.by_copy.assign(n, 0);
  r.copied_hashes.reset();
  // The bytes PWAL left in the loaded tensors, against those it was given.
  std::vector<ContentRange> to_hash;
  for (std::size_t pi = 0; pi < n; ++pi) {
    if (!r.rehash[pi]) continue;
    if (by_copy && r.candidate[pi]) {
      r.by_copy[pi] = 1;
      continue;
    }
    append_tensor_ranges(lp.params[pi], r.loaded[pi], to_hash);
  }
  r.after_hashes = std::make_shared<PendingContentHashes>(std::move(to_hash));
}

// The hashes after PWAL of the rehashed parameters' tensors, in parameter
// order (hash_positions' `first`): from the launch, and from the copy-back
// for those it took (hashed here, from the loaded bytes, when it took none:
// a copy-back that could not take them all, or none ran).
std::vector<std::uint64_t> after_pwal_hashes(const LayerPlan& lp, LayerRecord& r) {
  const std::vector<std::uint64_t> launched = r.after_hashes->get();
  std::vector<std::uint64_t> copied;
  if (r.copied_hashes != nullptr) {
    copied = r.copied_hashes->get();
  } else if (std::any_of(r.by_copy.begin(), r.by_copy.end(), [](char b) { return b != 0; })) {
    std::vector<ContentRange> ranges;
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi)
      if (r.by_copy[pi]) append_tensor_ranges(lp.params[pi], r.loaded[pi], ranges);
    copied = content_hashes(ranges);
  }
  std::vector<std::uint64_t> after;
  std::size_t li = 0, ci = 0;
  for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
    if (!r.rehash[pi]) continue;
    const bool from_copy = r.by_copy[pi] != 0;
    for (std::size_t ti = 0; ti < lp.params[pi].tensors.size(); ++ti)
      after.push_back(from_copy ? copied.at(ci++) : launched.at(li++));
  }
  GK_INTERNAL_ASSERT(li == launched.size() && ci == copied.size(), "after-PWAL hashes: ", launched.size(), " launched and ",
                     copied.size(), " copied, ", li, " and ", ci, " used");
  return after;
}

}  // namespace

std::vector<ContentRange> copy_hash_ranges(const LayerPlan& lp, LayerRun& run, const std::vector<at::Tensor>& dst,
                                           const std::vector<at::Tensor>& src, std::vector<char>& taken,
                                           std::vector<std::byte*>& to) {
  LayerRecord& r = run.record;
  std::vector<ContentRange> ranges;
  to.clear();
  taken.assign(src.size(), 0);
  if (!r.recorded || std::none_of(r.by_copy.begin(), r.by_copy.end(), [](char b) { return b != 0; })) return ranges;
  // Not every by-copy parameter copied whole here: finish_record_after_pwal
  // hashes them all from the loaded bytes, and the copy-back copies plainly.
  const auto none = [&] {
    taken.assign(src.size(), 0);
    to.clear();
    return std::vector<ContentRange>{};
  };
  for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
    if (!r.by_copy[pi]) continue;
    const at::Tensor& L = r.loaded[pi];
    std::size_t k = 0;
    while (k < src.size() && (taken[k] || !copies_whole(dst[k], src[k], L))) ++k;
    if (k == src.size()) return none();
    const std::size_t begin = ranges.size();
    append_tensor_ranges(lp.params[pi], L, ranges);
    std::size_t covered = 0;
    for (std::size_t i = begin; i < ranges.size(); ++i) covered += ranges[i].nbytes;
    if (covered != L.nbytes()) return none();  // ranges with gaps: the copy would read bytes they skip
    taken[k] = 1;
    for (std::size_t i = begin; i < ranges.size(); ++i)
      to.push_back(static_cast<std::byte*>(dst[k].mutable_data_ptr()) + ranges[i].offset);
  }
  return ranges;
}

void record_after_pwal(const LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep, bool defer) {
  if (!run.record.recorded) return;
  GK_INTERNAL_ASSERT(run.record.loaded_ranges.empty(),
                     "record_after_pwal before launch_loaded_hashes: PWAL ran before the loaded bytes were hashed");
  {
    ScopedMsTimer timer(rep.times.hash_ms);
    launch_after_pwal_hashes(lp, run, o, /*by_copy=*/defer);
  }
  if (!defer) finish_record_after_pwal(lp, run, o, rep);
}

void release_copied_loads(LayerRun& run) {
  LayerRecord& r = run.record;
  if (r.copied_hashes == nullptr) return;
  for (std::size_t pi = 0; pi < r.by_copy.size() && pi < r.loaded.size(); ++pi)
    if (r.by_copy[pi] && r.loaded[pi].defined() && r.loaded[pi].numel() > 0)
      r.loaded[pi] = at::empty({0}, r.loaded[pi].options());  // (finish reads its device alone)
}

bool record_ready(const LayerRun& run) {
  const LayerRecord& r = run.record;
  if (r.recorded && r.loaded_hashes == nullptr && !r.loaded_ranges.empty()) return false;  // not even launched
  return (r.loaded_hashes == nullptr || r.loaded_hashes->ready()) &&
         (r.after_hashes == nullptr || r.after_hashes->ready()) &&
         (r.copied_hashes == nullptr || r.copied_hashes->ready());
}

void finish_record_after_pwal(const LayerPlan& lp, LayerRun& run, const detail::RunOptions& o, ReloadReport& rep) {
  LayerRecord& r = run.record;
  {
    detail::TraceRange t("gk.loaded_hashes");  // (each wait inside its own range: the trace tells them apart)
    record_loaded_hashes(run, rep);
  }
  if (r.after_hashes == nullptr) return;
  ScopedMsTimer timer(rep.times.hash_ms);
  const std::size_t n = lp.params.size();
  std::vector<std::uint64_t> after;
  {
    detail::TraceRange t("gk.after_pwal_hashes");
    after = after_pwal_hashes(lp, r);
  }
  r.after_hashes.reset();
  r.copied_hashes.reset();
  const std::vector<char>& candidate = r.candidate;
  const std::vector<char>& rehash = r.rehash;
  std::vector<std::size_t> offset, first;
  hash_positions(lp, rehash, offset, first);
  for (std::size_t pi = 0; pi < n; ++pi) {
    const CheckpointParam& cp = lp.params[pi];
    const std::string full = lp.full_name(cp.param);
    bool intact = !r.custom[pi];
    for (std::size_t ti = 0; intact && rehash[pi] && ti < cp.tensors.size(); ++ti)
      intact = after[first[pi] + ti] == r.hashes[offset[pi] + ti];
    ServedParam sp;
    const c10::Device device = r.loaded[pi].device();
    if (candidate[pi] && intact) {
      sp.passthrough = true;
    } else if (o.patch_base == PatchBase::none) {
      sp.no_base = concat("parameter '", full, "' of layer '", lp.prefix, "' does not land unchanged in captured "
                          "storage (",
                          r.custom[pi] ? "the layer's load_weight() places it"
                          : !intact    ? "PWAL writes it in place"
                                       : "PWAL transforms it",
                          ") and no checkpoint-format base is kept: load with LoadOptions/ReloadOptions::patch_base = device or "
                          "pinned_host to patch it");
    } else if (r.custom[pi]) {
      for (const at::Tensor& d : r.delivered[pi]) sp.base.push_back(keep(d, device, o.patch_base, /*own=*/false));
    } else if (rehash[pi] && intact) {
      for (const at::Tensor& v : tensor_views(cp, r.loaded[pi]))
        sp.base.push_back(keep(v, device, o.patch_base, /*own=*/!r.adopted[pi]));
    } else {
      sp.no_base = concat("PWAL of layer '", lp.prefix, "' wrote parameter '", full,
                          "' in place (its bytes after PWAL differ from those loaded), so its checkpoint-format values "
                          "are gone and no base is left to patch: reload it in full");
    }
    r.params.emplace_back(full, std::move(sp));
  }
  r.loaded.clear();
  r.delivered.clear();
}

// ---------------------------------------------------------------------------
// The engine's served content
// ---------------------------------------------------------------------------
std::shared_ptr<const ServedWeights> ReloadEngine::Impl::make_served(std::unique_ptr<ServedWeights::State> st) const {
  if (st == nullptr) return nullptr;
  if (st->label.empty())
    if (const auto it = labels.find(st->content_version); it != labels.end()) st->label = it->second;
  return std::make_shared<const ServedWeights>(std::move(st));
}

void ReloadEngine::Impl::publish_served(std::shared_ptr<const ServedWeights> s) {
  if (s != nullptr && !s->label().empty()) labels[s->content_version()] = s->label();
  std::lock_guard<std::mutex> lock(served_mu);
  served = std::move(s);
}

std::shared_ptr<const ServedWeights> ReloadEngine::Impl::served_now() const {
  std::lock_guard<std::mutex> lock(served_mu);
  return served;
}

void ReloadEngine::Impl::index_captured_params() {
  captured_params.assign(plan.layers().size(), {});
  for (std::size_t li = 0; li < plan.layers().size(); ++li) {
    const LayerPlan& lp = plan.layers()[li];
    captured_params[li].resize(lp.params.size());
    for (std::size_t pi = 0; pi < lp.params.size(); ++pi) {
      const CheckpointParam& cp = lp.params[pi];
      CapturedParam& c = captured_params[li][pi];
      for (const PlannedSlot& s : lp.slots) {
        if (s.kind == PlannedSlot::Kind::declared || s.local != cp.param || !s.defined()) continue;
        if (s.captured.is_contiguous() && s.captured.sizes().equals(cp.shape()) && s.captured.scalar_type() == cp.dtype())
          c.whole = s.captured;
        break;
      }
      c.first_row = cp.first_rows();
    }
  }
}

at::Tensor ReloadEngine::Impl::captured_tensor(const Expected& e) const {
  const CapturedParam& c = captured_params[e.layer][e.param];
  if (!c.whole.defined()) return {};
  return tensor_view(plan.layers()[e.layer].params[e.param], c.whole, e.tensor, c.first_row[e.tensor]);
}

void ReloadEngine::Impl::verify_served_content(ReloadReport& rep) {
  if (rep.served == nullptr) return;
  ScopedMsTimer t(rep.times.hash_ms);
  const ServedWeights::State& s = rep.served->state();
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
  for (const auto& [name, e] : expected) {
    const LayerPlan& lp = plan.layers()[e.layer];
    const auto p = s.params.find(lp.full_name(lp.params[e.param].param));
    if (p == s.params.end() || !p->second.passthrough) continue;
    at::Tensor c = captured_tensor(e);
    if (!c.defined()) continue;
    tensors.push_back(std::move(c));
    names.push_back(name);
  }
  const std::vector<std::uint64_t> got = content_hashes(tensors);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::uint64_t want = *s.find(names[i]);
    if (got[i] == want) continue;
    mark_inconsistent(concat("gk::testing::EngineHooks::verify_served found checkpoint tensor '", names[i],
                             "' differing from what the reload loaded; reload() to recover"),
                      /*weights_changed=*/true);  // (the throw skips finish(), which counts the reload's write)
    GK_THROW(WeightError, "gk::testing::EngineHooks::verify_served: checkpoint tensor '", names[i], "' in captured storage hashes ",
             format_content_hash(got[i]), " but the reload loaded ", format_content_hash(want),
             " (something wrote the captured storage while the reload ran, or a slot failed to copy back); replay "
             "refused until a reload succeeds");
  }
}

std::unique_ptr<ServedWeights::State> served_from_runs(std::vector<LayerRun>& runs,
                                                       std::shared_ptr<const detail::ServedNames> names,
                                                       std::string label) {
  GK_INTERNAL_ASSERT(names != nullptr, "served_from_runs without the plan's names");
  auto st = std::make_unique<ServedWeights::State>();
  st->values.assign(names->size(), 0);
  for (std::size_t li = 0; li < runs.size(); ++li) {
    LayerRun& run = runs[li];
    if (!run.record.recorded) return nullptr;
    GK_INTERNAL_ASSERT(run.record.hashes.size() == names->layer_size(li), "layer ", li, " recorded ",
                       run.record.hashes.size(), " hashes for ", names->layer_size(li), " checkpoint tensors");
    for (std::size_t k = 0; k < run.record.hashes.size(); ++k) st->values[names->position(li, k)] = run.record.hashes[k];
    for (auto& [name, p] : run.record.params) st->params.insert_or_assign(name, std::move(p));
    run.record = LayerRecord{};
  }
  st->names = std::move(names);
  st->label = std::move(label);
  st->finish();
  return st;
}

}  // namespace gk
