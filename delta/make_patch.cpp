// gk::make_patch: a bitwise comparison per tensor, where the tensors are
// (Note [Changed means different bits] in graphkeep/delta/make_patch.h),
// with one synchronization per chunk of tensors (Note [Counting changes in
// batches], below).
#include <graphkeep/core/check.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/detail/element_bits.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/sources/safetensors_source.h>

#include "changed_elements.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>


namespace gk {

namespace {

// name -> tensor of a set; each name once, shard 0.
std::map<std::string, const at::Tensor*> by_name(const std::vector<NamedTensor>& set, const char* which) {
  std::map<std::string, const at::Tensor*> out;
  for (const NamedTensor& t : set) {
    GK_CHECK(WeightError, t.shard == 0, "gk::make_patch: ", which, " tensor '", t.name, "' is shard ", t.shard,
             "; a patch is made from whole checkpoint tensors");
    GK_CHECK(WeightError, out.emplace(t.name, &t.value).second, "gk::make_patch: ", which, " tensor '", t.name,
             "' is given twice");
  }
  return out;
}

// How make_patch makes one entry.
struct EntryPlan {
  bool keep = false, dense = false;
  at::ScalarType index_dtype = at::kLong;
  std::int64_t indices_at = 0, values_at = 0;  // byte offsets in the chunk's allocation (sparse, on a device)
};

// Note [One allocation per chunk]: pieces of one byte buffer on a device.
class ArenaCut {
 public:
  // Reserves `bytes`; returns their offset.
  std::int64_t take(std::int64_t bytes) {
    taken_ = true;
    const std::int64_t at = bytes_;
    bytes_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  void allocate(c10::Device device) {
    if (taken_) buffer_ = at::empty({std::max<std::int64_t>(bytes_, 1)}, at::TensorOptions(at::kByte).device(device));
  }
  // `n` elements of `dtype` from byte `at`.
  at::Tensor piece(std::int64_t at, std::int64_t n, at::ScalarType dtype) const {
    return buffer_.narrow(0, at, n * static_cast<std::int64_t>(c10::elementSize(dtype))).view(dtype);
  }

 private:
  static constexpr std::int64_t kAlign = 512;  // the CUDA caching allocator's block alignment
  bool taken_ = false;
  std::int64_t bytes_ = 0;
  at::Tensor buffer_;
};

}  // namespace

Patch make_patch(const std::vector<NamedTensor>& base, const std::vector<NamedTensor>& target,
                 const MakePatchOptions& options) {
  const auto bases = by_name(base, "base");
  const auto targets = by_name(target, "target");
  for (const auto& [name, t] : targets)
    GK_CHECK(WeightError, bases.count(name) == 1, "gk::make_patch: tensor '", name,
             "' is in the target but not in the base; a patch changes values, not the set of tensors");

  Patch patch;
  patch.base_version = options.base_version;
  patch.target_version = options.target_version;
  patch.label = detail::concat("in-memory patch '", options.base_version, "' -> '", options.target_version, "'");
  // The checked pairs, in name order, contiguous.
  struct Pair {
    const std::string* name;
    const at::Tensor* target;
    at::Tensor b, t;
  };
  std::vector<Pair> pairs;
  pairs.reserve(bases.size());
  for (const auto& [name, b_ptr] : bases) {
    const auto it = targets.find(name);
    GK_CHECK(WeightError, it != targets.end(), "gk::make_patch: tensor '", name,
             "' is in the base but not in the target; a patch changes values, not the set of tensors");
    const at::Tensor& b = *b_ptr;
    const at::Tensor& t = *it->second;
    GK_CHECK(WeightError, b.defined() && t.defined(), "gk::make_patch: tensor '", name, "' is undefined in the ",
             b.defined() ? "target" : "base");
    GK_CHECK(WeightError, b.sizes() == t.sizes() && b.scalar_type() == t.scalar_type(), "gk::make_patch: tensor '",
             name, "' is ", b.scalar_type(), " ", b.sizes(), " in the base but ", t.scalar_type(), " ", t.sizes(),
             " in the target");
    GK_CHECK(WeightError, b.device() == t.device(), "gk::make_patch: tensor '", name, "' is on ", b.device(),
             " in the base but on ", t.device(), " in the target");
    GK_CHECK(WeightError, to_safetensors_dtype(b.scalar_type()).has_value(), "gk::make_patch: tensor '", name,
             "' has dtype ", b.scalar_type(), ", which the patch format (safetensors) does not have");
    GK_CHECK(WeightError, b.layout() == at::kStrided && t.layout() == at::kStrided, "gk::make_patch: tensor '",
             name, "' is not a strided tensor");
    pairs.push_back({&name, &t, b.contiguous(), t.contiguous()});
  }

  // Note [Counting changes in batches]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // at::nonzero synchronizes to learn its output's size: once per tensor,
  // 18,000 times for a MoE. Instead, one synchronization per chunk of
  // tensors (at most kChunk elements, or one tensor) and device: on the
  // host, each tensor's changed elements are counted with tensor
  // operations, the chunk's counts copied at once, and each tensor's
  // indices taken by nonzero_static with its known count; on a CUDA
  // device, two kernels do it for the whole chunk (Note [Changed elements
  // on the device] in delta/changed_elements.cpp).
  constexpr std::int64_t kChunk = std::int64_t{1} << 30;
  // The entries' hashes: from the device's count where it read the bytes
  // (Note [Changed elements on the device]), else hashed at the end.
  std::vector<at::Tensor> base_bytes, target_bytes;  // contiguous, for the hashes left
  std::vector<std::size_t> hash_later;               // their entries
  for (std::size_t i = 0; i < pairs.size();) {
    const std::size_t first = i;
    std::int64_t elements = 0;
    for (; i < pairs.size() && (i == first || elements + pairs[i].b.numel() <= kChunk); ++i) elements += pairs[i].b.numel();
    std::vector<std::int64_t> counts(i - first, 0);
    // On the host (and any device without a kernel): change masks, counted.
    std::vector<at::Tensor> masks(i - first), host_counts;
    std::vector<std::size_t> on_host;
#if defined(GRAPHKEEP_WITH_CUDA)
    std::vector<c10::Device> devices;
    std::vector<detail::ChangedElements> on_devices;
    std::vector<std::pair<int, std::size_t>> device_of(i - first, {-1, 0});  // (which diff, its pair number)
    {
      std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> groups;
      std::vector<std::vector<std::size_t>> members;
      for (std::size_t k = first; k < i; ++k) {
        if (!pairs[k].b.is_cuda()) continue;
        auto d = std::find(devices.begin(), devices.end(), pairs[k].b.device());
        if (d == devices.end()) devices.push_back(pairs[k].b.device()), groups.emplace_back(), members.emplace_back(), d = devices.end() - 1;
        const auto g = static_cast<std::size_t>(d - devices.begin());
        device_of[k - first] = {static_cast<int>(g), groups[g].size()};
        groups[g].emplace_back(pairs[k].b, pairs[k].t);
        members[g].push_back(k);
      }
      for (std::size_t g = 0; g < devices.size(); ++g) {
        on_devices.emplace_back(devices[g], groups[g]);  // one synchronization per device
        for (std::size_t m = 0; m < members[g].size(); ++m) counts[members[g][m] - first] = on_devices[g].count(m);
      }
    }
#endif
    for (std::size_t k = first; k < i; ++k) {
#if defined(GRAPHKEEP_WITH_CUDA)
      if (device_of[k - first].first >= 0) continue;
#endif
      masks[k - first] = at::ne(detail::flat_bits(pairs[k].b), detail::flat_bits(pairs[k].t));
      host_counts.push_back(masks[k - first].sum().to(at::kLong).reshape({1}));
      on_host.push_back(k);
    }
    if (!on_host.empty()) {
      const at::Tensor c = at::cat(host_counts).cpu();  // the host tensors' one synchronization
      for (std::size_t m = 0; m < on_host.size(); ++m) counts[on_host[m] - first] = c.const_data_ptr<std::int64_t>()[m];
    }
    // Each pair's entry, decided from its count.
    std::vector<EntryPlan> plans(i - first);
    for (std::size_t k = first; k < i; ++k) {
      EntryPlan& e = plans[k - first];
      const std::int64_t count = counts[k - first], numel = pairs[k].b.numel();
      e.keep = count != 0 || options.record_unchanged;
      e.index_dtype = patch_index_dtype(numel);
      const auto itemsize = static_cast<std::int64_t>(pairs[k].b.element_size());
      const std::int64_t sparse_bytes = count * (static_cast<std::int64_t>(c10::elementSize(e.index_dtype)) + itemsize);
      e.dense = options.encoding == MakePatchOptions::Encoding::dense ||
                (options.encoding == MakePatchOptions::Encoding::automatic && sparse_bytes > numel * itemsize);
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    // Note [One allocation per chunk]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // The sparse entries a device collects take their indices and values
    // from one allocation per chunk and device, each piece aligned as the
    // caching allocator aligns its blocks. Two allocations per tensor were
    // 36,000 calls into the allocator for a MoE's 18,000 expert tensors,
    // and, with its pool cold, as many small blocks carved out of new
    // segments. An entry is a view of that allocation, which lives while
    // any of the patch's entries does.
    std::vector<ArenaCut> cuts(devices.size());
    for (std::size_t k = first; k < i; ++k) {
      EntryPlan& e = plans[k - first];
      if (device_of[k - first].first < 0 || !e.keep || e.dense) continue;
      ArenaCut& cut = cuts[static_cast<std::size_t>(device_of[k - first].first)];
      e.indices_at = cut.take(counts[k - first] * static_cast<std::int64_t>(c10::elementSize(e.index_dtype)));
      e.values_at = cut.take(counts[k - first] * static_cast<std::int64_t>(pairs[k].b.element_size()));
    }
    for (std::size_t g = 0; g < devices.size(); ++g) cuts[g].allocate(devices[g]);
#endif
    for (std::size_t k = first; k < i; ++k) {
      const Pair& pr = pairs[k];
      const EntryPlan& plan = plans[k - first];
      const std::int64_t count = counts[k - first];
      if (!plan.keep) continue;
      PatchEntry e;
      e.name = *pr.name;
      e.shape = pr.b.sizes().vec();
      e.dtype = pr.b.scalar_type();
      if (plan.dense) {
        e.encoding = PatchEncoding::dense;
        // pr.t is a fresh copy when the target is not contiguous; otherwise it is the target itself.
        e.values = (options.share_dense || !pr.t.is_same(*pr.target)) ? pr.t : pr.t.clone();
      } else {
        e.encoding = PatchEncoding::sparse;
        const at::Tensor& mask = masks[k - first];
        if (mask.defined()) {
          const at::Tensor changed = at::nonzero_static(mask, count).view(-1);  // int64, no synchronization
          e.indices = changed.to(plan.index_dtype);
          e.values = detail::flat_bits(pr.t).index_select(0, changed).view(e.dtype);
        } else {
#if defined(GRAPHKEEP_WITH_CUDA)
          const ArenaCut& cut = cuts[static_cast<std::size_t>(device_of[k - first].first)];
          e.indices = cut.piece(plan.indices_at, count, plan.index_dtype);
          e.values = cut.piece(plan.values_at, count, e.dtype);
          on_devices[static_cast<std::size_t>(device_of[k - first].first)].collect(device_of[k - first].second,
                                                                                   e.indices, e.values);
#endif
        }
      }
#if defined(GRAPHKEEP_WITH_CUDA)
      if (device_of[k - first].first >= 0) {
        const auto [hb, ht] =
            on_devices[static_cast<std::size_t>(device_of[k - first].first)].hashes(device_of[k - first].second);
        e.base_hash = hb;
        e.target_hash = ht;
        patch.entries.push_back(std::move(e));
        continue;
      }
#endif
      hash_later.push_back(patch.entries.size());
      patch.entries.push_back(std::move(e));
      base_bytes.push_back(pr.b);
      target_bytes.push_back(pr.t);
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    for (detail::ChangedElements& d : on_devices) d.run();
#endif
  }
  // Both sides' hashes in one call: one launch and one wait per device.
  const std::size_t n = base_bytes.size();
  base_bytes.insert(base_bytes.end(), std::make_move_iterator(target_bytes.begin()),
                    std::make_move_iterator(target_bytes.end()));
  const std::vector<std::uint64_t> hashes = content_hashes(base_bytes);
  for (std::size_t i = 0; i < hash_later.size(); ++i) {
    patch.entries[hash_later[i]].base_hash = hashes[i];
    patch.entries[hash_later[i]].target_hash = hashes[n + i];
  }
  return patch;
}

}  // namespace gk
