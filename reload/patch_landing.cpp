// The writes of a patch's entries into captured storage.
//
// Note [One scatter per storage]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A MoE layer's checkpoint has hundreds of tensors (every expert's gate, up
// and down projections) that land in two or three captured storages (w13,
// w2: default_load lays them end to end). A 1 % patch touches nearly all of
// them: 18,000 entries for a 30B-A3B model. Handled one by one, each paid a
// gather for the undo, a clone for its hash and two host synchronizations
// for its sector images, 18,000 times. Entries whose destinations share a
// storage, without overlapping, are merged into one write in the storage's
// flat coordinates: an entry's flat index i in a contiguous destination at
// storage offset o is element o + i of the storage. The merged indices are
// one concatenation plus one offset per entry, added on the device (each
// merged index finds its entry by a binary search: no synchronization); the
// entries are taken in storage order, so the merged indices stay strictly
// ascending, as sector_images needs. (Not repeat_interleave: its CUDA
// kernel gives each entry one thread, which writes that entry's ~10^5
// offsets alone; a search per merged index runs in parallel.) The merged
// write covers the range its entries span, no more, so it overlaps no other
// write (use_sector_images keeps element writes for writes that overlap).
// Destinations that overlap (tensors sharing bytes), dense entries and
// non-contiguous destinations keep a write of their own, and end a run. The
// stage hashes each entry's destination through the writes (Note [Hashing
// through the writes] in graphkeep/hashing/overlaid_hash.h): nothing here
// makes a copy of what the patch leaves.
#include "patch_landing.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/device_upload.h>
#include <graphkeep/delta/detail/element_bits.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace gk {
namespace {

// The whole storage of `t` as a flat tensor of t's dtype.
at::Tensor whole_storage(const at::Tensor& t) {
  const std::int64_t n = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
  return at::empty({0}, t.options()).set_(t.storage(), 0, {n}, {1});
}

}  // namespace

void land_patch_entries(const std::vector<PatchLanding>& ls, StagedPatch& sp, bool verify) {
  if (verify) {
    for (const PatchLanding& l : ls) {
      sp.verify.push_back(l.bits);
      sp.verify_names.push_back(l.entry->name);
      sp.verify_hashes.push_back(l.entry->target_hash);
    }
  }
  auto alone = [&](std::size_t i) {
    const PatchLanding& l = ls[i];
    const at::Tensor& bits = l.bits;
    // (A sparse undo's values are gathered at the end of the stage, all at once: gather_items.)
    sp.undo.push_back({bits, l.indices, l.indices.defined() ? at::Tensor() : bits.clone()});
    sp.writes.push_back({bits, l.indices, l.values});
  };
  // Group the entries by destination storage, then take
  // each storage's entries in storage order: a run of consecutive sparse
  // entries that do not overlap becomes one write over the range they span.
  std::vector<std::vector<std::size_t>> groups;
  std::unordered_map<const void*, std::size_t> group_of;
  for (std::size_t i = 0; i < ls.size(); ++i) {
    const PatchLanding& l = ls[i];
    if (!l.dst.is_contiguous() || !l.dst.has_storage()) {
      alone(i);
      continue;
    }
    const auto [it, fresh] = group_of.emplace(storage_key(l.dst), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  auto merge = [&](const std::vector<std::size_t>& run) {
    const std::int64_t begin = ls[run.front()].dst.storage_offset();
    const std::int64_t end = ls[run.back()].dst.storage_offset() + ls[run.back()].dst.numel();
    const at::Tensor span = detail::flat_bits(whole_storage(ls[run.front()].dst).narrow(0, begin, end - begin));
    std::vector<at::Tensor> idx, val;
    // rows[0, k): each entry's offset in the span; rows[k, 2k): where its
    // indices end among the merged ones.
    std::vector<std::int64_t> rows(2 * run.size());
    std::int64_t total = 0;
    for (std::size_t r = 0; r < run.size(); ++r) {
      const PatchLanding& l = ls[run[r]];
      idx.push_back(l.indices);
      val.push_back(l.values);
      rows[r] = l.dst.storage_offset() - begin;
      rows[run.size() + r] = total += l.indices.numel();
    }
    const at::Tensor table = detail::upload_rows(rows, span.device()).view(at::kLong);
    const auto k = static_cast<std::int64_t>(run.size());
    // Merged index j belongs to the entry whose end is the first above j.
    const at::Tensor entry = at::searchsorted(table.narrow(0, k, k), at::arange(total, table.options()),
                                              /*out_int32=*/false, /*right=*/true);
    at::Tensor merged = at::cat(idx).to(at::kLong) + table.narrow(0, 0, k).index_select(0, entry);
    if (span.numel() <= std::numeric_limits<std::int32_t>::max()) merged = merged.to(at::kInt);
    const at::Tensor values = at::cat(val);
    sp.undo.push_back({span, merged, at::Tensor()});
    sp.writes.push_back({span, merged, values});
  };
  for (std::vector<std::size_t>& g : groups) {
    std::sort(g.begin(), g.end(),
              [&](std::size_t a, std::size_t b) { return ls[a].dst.storage_offset() < ls[b].dst.storage_offset(); });
    std::vector<std::size_t> run;
    auto flush = [&] {
      if (run.size() == 1) alone(run.front());
      if (run.size() > 1) merge(run);
      run.clear();
    };
    for (std::size_t i : g) {
      const PatchLanding& l = ls[i];
      const bool joins = l.indices.defined() && !run.empty() &&
                         l.dst.element_size() == ls[run.back()].dst.element_size() &&
                         l.indices.scalar_type() == ls[run.back()].indices.scalar_type() &&
                         ls[run.back()].dst.storage_offset() + ls[run.back()].dst.numel() <= l.dst.storage_offset();
      if (!joins) flush();
      if (l.indices.defined()) run.push_back(i);
      else alone(i);
    }
    flush();
  }
}

}  // namespace gk
