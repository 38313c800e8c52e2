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
// storage offset o is element o + i of the storage. Every merge of a call
// is made at once, after the runs are known: on a CUDA device in one launch
// (Note [Merging entries in one launch] in cuda/merge_entries.h), on the
// CPU entry by entry; the entries are taken in storage order, so the merged
// indices stay strictly ascending, as sector_images needs. The merged
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

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/merge_entries.h"
#endif

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

// The write a run covers: its span of the storage, as integers of the
// element size.
at::Tensor span_of(const std::vector<PatchLanding>& ls, const std::vector<std::size_t>& run) {
  const std::int64_t begin = ls[run.front()].dst.storage_offset();
  const std::int64_t end = ls[run.back()].dst.storage_offset() + ls[run.back()].dst.numel();
  return detail::flat_bits(whole_storage(ls[run.front()].dst).narrow(0, begin, end - begin));
}

// Every run's merged write and undo (Note [One scatter per storage]): the
// runs of each CUDA device in one launch into two buffers (the merged
// indices, int32 where every span of the device allows, and the values,
// each run's at a 16-byte boundary), the CPU's entry by entry.
void merge_runs(const std::vector<PatchLanding>& ls, const std::vector<std::vector<std::size_t>>& runs,
                StagedPatch& sp) {
  std::vector<at::Tensor> spans;
  for (const std::vector<std::size_t>& run : runs) spans.push_back(span_of(ls, run));
  std::vector<c10::Device> devices;
  for (const at::Tensor& s : spans)
    if (std::find(devices.begin(), devices.end(), s.device()) == devices.end()) devices.push_back(s.device());
  for (const c10::Device device : devices) {
    std::vector<std::size_t> mine;
    bool narrow_ok = true;
    std::int64_t total = 0, value_bytes = 0;
    for (std::size_t r = 0; r < runs.size(); ++r) {
      if (spans[r].device() != device) continue;
      mine.push_back(r);
      narrow_ok = narrow_ok && spans[r].numel() <= std::numeric_limits<std::int32_t>::max();
      for (std::size_t i : runs[r]) {
        total += ls[i].indices.numel();
        value_bytes += ls[i].values.numel() * static_cast<std::int64_t>(ls[i].values.element_size());
      }
      value_bytes = (value_bytes + 15) / 16 * 16;
    }
    const auto long_options = at::TensorOptions(at::kLong).device(device);
    const at::Tensor indices = at::empty({total}, long_options.dtype(narrow_ok ? at::kInt : at::kLong));
    const at::Tensor values = at::empty({value_bytes}, long_options.dtype(at::kByte));
#if defined(GRAPHKEEP_WITH_CUDA)
    std::vector<cuda::MergeEntry> entries;
    std::vector<cuda::MergeBlock> blocks;
#endif
    std::int64_t at_index = 0, at_byte = 0;
    for (std::size_t r : mine) {
      const std::int64_t begin = ls[runs[r].front()].dst.storage_offset();
      const std::int64_t first_index = at_index, first_byte = at_byte;
      for (std::size_t i : runs[r]) {
        const PatchLanding& l = ls[i];
        const std::int64_t n = l.indices.numel(), vb = static_cast<std::int64_t>(l.values.element_size());
        const std::int64_t add = l.dst.storage_offset() - begin;
        if (device.is_cuda()) {
#if defined(GRAPHKEEP_WITH_CUDA)
          // (Addresses, not views: a MoE patch merges 18,000 entries here.)
          cuda::MergeEntry& e = entries.emplace_back();
          e.indices = l.indices.const_data_ptr();
          e.values = l.values.const_data_ptr();
          e.out_indices = static_cast<char*>(indices.mutable_data_ptr()) + at_index * indices.element_size();
          e.out_values = static_cast<char*>(values.mutable_data_ptr()) + at_byte;
          e.count = n, e.add = add;
          e.value_bytes = static_cast<std::uint32_t>(vb);
          e.index_bytes = static_cast<std::uint16_t>(l.indices.element_size());
          e.out_index_bytes = static_cast<std::uint16_t>(indices.element_size());
          for (std::int64_t f = 0; f < n; f += cuda::kMergeChunk)
            blocks.push_back({f, static_cast<std::int64_t>(entries.size() - 1)});
#endif
        } else {
          indices.narrow(0, at_index, n).copy_(l.indices.to(at::kLong) + add);
          values.narrow(0, at_byte, n * vb).view(l.values.scalar_type()).copy_(l.values);
        }
        at_index += n, at_byte += n * vb;
      }
      at_byte = (at_byte + 15) / 16 * 16;
      const at::Tensor merged = indices.narrow(0, first_index, at_index - first_index);
      const at::Tensor vals = values.narrow(0, first_byte, (at_index - first_index) * spans[r].element_size())
                                  .view(spans[r].scalar_type());
      sp.undo.push_back({spans[r], merged, at::Tensor()});
      sp.writes.push_back({spans[r], merged, vals});
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    if (device.is_cuda() && !blocks.empty()) {
      const c10::cuda::CUDAGuard guard(device);
      const at::Tensor e = detail::upload_rows(entries, device), b = detail::upload_rows(blocks, device);
      const int err = cuda::launch_merge_entries(reinterpret_cast<const cuda::MergeEntry*>(e.const_data_ptr()),
                                                 reinterpret_cast<const cuda::MergeBlock*>(b.const_data_ptr()),
                                                 static_cast<std::int64_t>(blocks.size()),
                                                 c10::cuda::getCurrentCUDAStream(device.index()).stream());
      GK_CHECK(StateError, err == 0, "a patch's merged writes failed to launch on ", device, " (cudaError ", err, ")");
      // (The uploads are freed when this returns: the caching allocator
      // hands their blocks out again only to work ordered after this launch
      // on the same stream.)
    }
#endif
  }
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
  std::vector<std::vector<std::size_t>> runs;
  for (std::vector<std::size_t>& g : groups) {
    std::sort(g.begin(), g.end(),
              [&](std::size_t a, std::size_t b) { return ls[a].dst.storage_offset() < ls[b].dst.storage_offset(); });
    std::vector<std::size_t> run;
    auto flush = [&] {
      if (run.size() == 1) alone(run.front());
      if (run.size() > 1) runs.push_back(std::move(run));
      run.clear();
    };
    for (std::size_t i : g) {
      const PatchLanding& l = ls[i];
      const bool joins = l.indices.defined() && !run.empty() &&
                         l.dst.element_size() == ls[run.back()].dst.element_size() &&
                         ls[run.back()].dst.storage_offset() + ls[run.back()].dst.numel() <= l.dst.storage_offset();
      if (!joins) flush();
      if (l.indices.defined()) run.push_back(i);
      else alone(i);
    }
    flush();
  }
  merge_runs(ls, runs, sp);
}

}  // namespace gk
