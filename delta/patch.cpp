// gk::Patch: sizes, device moves and validate_patch (Note [Patch format v1]
// in graphkeep/delta/patch.h).
#include <graphkeep/core/check.h>
#include <graphkeep/delta/patch.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "patch_errors.h"

namespace gk {

std::string_view patch_encoding_name(PatchEncoding encoding) {
  return encoding == PatchEncoding::dense ? "dense" : "sparse";
}

at::ScalarType patch_index_dtype(std::int64_t numel) {
  return numel < (std::int64_t{1} << 31) ? at::kInt : at::kLong;
}

std::int64_t PatchEntry::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t PatchEntry::count() const {
  return encoding == PatchEncoding::dense ? numel() : (indices.defined() ? indices.numel() : 0);
}

std::size_t PatchEntry::payload_bytes() const {
  return (indices.defined() ? indices.nbytes() : 0) + (values.defined() ? values.nbytes() : 0);
}

const PatchEntry* Patch::find(std::string_view name) const {
  const auto it = std::lower_bound(entries.begin(), entries.end(), name,
                                   [](const PatchEntry& e, std::string_view n) { return e.name < n; });
  return it != entries.end() && it->name == name ? &*it : nullptr;
}

std::size_t Patch::payload_bytes() const {
  std::size_t n = 0;
  for (const PatchEntry& e : entries) n += e.payload_bytes();
  return n;
}

Patch Patch::to(c10::Device device) const {
  Patch out = *this;
  for (PatchEntry& e : out.entries) {
    if (e.indices.defined()) e.indices = e.indices.to(device);
    if (e.values.defined()) e.values = e.values.to(device);
  }
  return out;
}

namespace {

// The entry's own consistency, on the host (no tensor data read).
void validate_entry(const Patch& patch, const PatchEntry& e) {
  const std::string_view label = detail::patch_label(patch);
  GK_CHECK(WeightError, to_safetensors_dtype(e.dtype).has_value(), label, ": tensor '", e.name, "' has dtype ",
           e.dtype, ", which the safetensors format does not have");
  std::int64_t numel = 1;
  for (const std::int64_t d : e.shape) {
    GK_CHECK(WeightError, d >= 0, label, ": tensor '", e.name, "' has a negative dimension in shape ",
             c10::IntArrayRef(e.shape));
    GK_CHECK(WeightError, d == 0 || numel <= std::numeric_limits<std::int64_t>::max() / d, label, ": tensor '",
             e.name, "' has shape ", c10::IntArrayRef(e.shape), ", more than 2^63 elements");
    numel *= d;
  }
  const std::string what = detail::concat(label, ": tensor '", e.name, "' (shape ", c10::IntArrayRef(e.shape), ", ",
                                          e.dtype, ")");
  if (e.encoding == PatchEncoding::dense) {
    GK_CHECK(WeightError, e.values.defined(), what, ": the dense entry has no values");
    GK_CHECK(WeightError, !e.indices.defined(), what, ": the dense entry has indices too");
    GK_CHECK(WeightError, e.values.layout() == at::kStrided, what, ": the values are not a strided tensor");
    GK_CHECK(WeightError, e.values.scalar_type() == e.dtype, what, ": the dense values are ",
             e.values.scalar_type());
    GK_CHECK(WeightError, e.values.sizes() == c10::IntArrayRef(e.shape), what, ": the dense values have shape ",
             e.values.sizes());
    return;
  }
  GK_CHECK(WeightError, e.indices.defined() && e.values.defined(), what, ": the sparse entry lacks ",
           e.indices.defined() ? "values" : "indices");
  GK_CHECK(WeightError, e.indices.layout() == at::kStrided && e.values.layout() == at::kStrided, what,
           ": the indices or values are not a strided tensor");
  GK_CHECK(WeightError, e.indices.dim() == 1, what, ": the indices have shape ", e.indices.sizes(),
           "; they must be 1-D");
  const at::ScalarType want = patch_index_dtype(numel);
  GK_CHECK(WeightError, e.indices.scalar_type() == want, what, ": the indices are ", e.indices.scalar_type(),
           "; a tensor of ", numel, " elements takes ", want == at::kInt ? "int32" : "int64",
           " indices (int32 below 2^31 elements)");
  GK_CHECK(WeightError, e.values.dim() == 1, what, ": the values have shape ", e.values.sizes(),
           "; they must be 1-D");
  GK_CHECK(WeightError, e.values.scalar_type() == e.dtype, what, ": the values are ", e.values.scalar_type(),
           "; they must be the tensor's dtype");
  GK_CHECK(WeightError, e.values.numel() == e.indices.numel(), what, ": ", e.indices.numel(), " indices but ",
           e.values.numel(), " values");
  GK_CHECK(WeightError, e.indices.device() == e.values.device(), what, ": the indices are on ", e.indices.device(),
           " and the values on ", e.values.device());
  GK_CHECK(WeightError, e.indices.numel() <= numel, what, ": ", e.indices.numel(), " indices for ", numel,
           " elements");
}

// Per tensor of `idx` (1-D integer tensors on one device, none empty), a
// row [min, max, repeats, descents] (descents: idx[i] > idx[i + 1]) of a
// [n, 4] int64 tensor, in a constant number of launches
// per chunk of at most 2^26 indices: a patch of a MoE has 18,000 entries,
// and five launches each were most of its validation. Segment i's min and
// max by scatter_reduce, its repeats and descents by index_add over the
// neighbours that lie in the same segment: exact integer results.
at::Tensor index_stats_batched(const std::vector<at::Tensor>& idx) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 26;
  const auto longs = idx.front().options().dtype(at::kLong);
  std::vector<at::Tensor> rows;
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    std::int64_t total = 0;
    std::vector<std::int64_t> counts;
    std::vector<at::Tensor> part;
    while (j < idx.size() && (j == i || total + idx[j].numel() <= kChunk)) {
      total += idx[j].numel();
      counts.push_back(idx[j].numel());
      part.push_back(idx[j].to(at::kLong));  // no copy for int64 indices
      ++j;
    }
    const std::int64_t n = static_cast<std::int64_t>(part.size());
    const at::Tensor ids = at::cat(part);
    const at::Tensor seg =
        at::repeat_interleave(at::arange(n, longs), at::tensor(counts, at::kLong).to(longs.device()), 0, total);
    const at::Tensor lo = at::full({n}, std::numeric_limits<std::int64_t>::max(), longs).scatter_reduce_(0, seg, ids, "amin");
    const at::Tensor hi = at::full({n}, std::numeric_limits<std::int64_t>::min(), longs).scatter_reduce_(0, seg, ids, "amax");
    at::Tensor repeats = at::zeros({n}, longs), descents = at::zeros({n}, longs);
    if (total > 1) {
      const at::Tensor a = ids.narrow(0, 0, total - 1), b = ids.narrow(0, 1, total - 1);
      const at::Tensor next_seg = seg.narrow(0, 1, total - 1);
      const at::Tensor same = at::eq(seg.narrow(0, 0, total - 1), next_seg);
      repeats.index_add_(0, next_seg, at::logical_and(at::eq(a, b), same).to(at::kLong));
      descents.index_add_(0, next_seg, at::logical_and(at::gt(a, b), same).to(at::kLong));
    }
    rows.push_back(at::stack({lo, hi, repeats, descents}, 1));
    i = j;
  }
  return at::cat(rows);
}

// The first position i > 0 where idx[i] <= idx[i - 1] (the error path only).
std::int64_t first_not_ascending(const at::Tensor& idx) {
  const std::int64_t n = idx.numel();
  const at::Tensor bad = at::le(idx.narrow(0, 1, n - 1), idx.narrow(0, 0, n - 1)).nonzero();
  return bad.numel() > 0 ? bad[0][0].item<std::int64_t>() + 1 : -1;
}

}  // namespace

void validate_patch(const Patch& patch) {
  const std::string_view label = detail::patch_label(patch);
  GK_CHECK(WeightError, patch.version == kPatchFormatVersion, label, ": format version ", patch.version,
           "; this graphkeep reads version ", kPatchFormatVersion);
  for (std::size_t i = 0; i < patch.entries.size(); ++i) {
    const PatchEntry& e = patch.entries[i];
    GK_CHECK(WeightError, !e.name.empty(), label, ": entry ", i, " has an empty name");
    GK_CHECK(WeightError, e.name.find("::") == std::string::npos, label, ": tensor '", e.name,
             "': a patched tensor's name may not contain \"::\"");
    if (i > 0) {
      const std::string& prev = patch.entries[i - 1].name;
      GK_CHECK(WeightError, prev != e.name, label, ": tensor '", e.name, "' has two entries");
      GK_CHECK(WeightError, prev < e.name, label, ": tensor '", e.name, "' comes after '", prev,
               "'; entries are sorted by name");
    }
    validate_entry(patch, e);
  }

  // The indices' range and order, computed where they are; one copy to the
  // host per device.
  std::vector<std::pair<c10::Device, std::vector<std::size_t>>> by_device;
  for (std::size_t i = 0; i < patch.entries.size(); ++i) {
    const PatchEntry& e = patch.entries[i];
    if (e.encoding != PatchEncoding::sparse || e.indices.numel() == 0) continue;
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& d) { return d.first == e.indices.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {e.indices.device(), {}});
    it->second.push_back(i);
  }
  for (const auto& [device, which] : by_device) {
    std::vector<at::Tensor> indices;
    indices.reserve(which.size());
    for (const std::size_t i : which) indices.push_back(patch.entries[i].indices.reshape({-1}));
    const at::Tensor host = index_stats_batched(indices).cpu();
    const auto* s = host.const_data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < which.size(); ++k, s += 4) {
      const PatchEntry& e = patch.entries[which[k]];
      const std::int64_t numel = e.numel();
      if (s[0] >= 0 && s[1] < numel && s[2] == 0 && s[3] == 0) continue;  // the message only on failure
      const std::string what = detail::concat(label, ": tensor '", e.name, "' (shape ", c10::IntArrayRef(e.shape),
                                              ", ", numel, " elements)");
      GK_CHECK(WeightError, s[0] >= 0, what, ": index ", s[0], " is out of range [0, ", numel, ")");
      GK_CHECK(WeightError, s[1] < numel, what, ": index ", s[1], " is out of range [0, ", numel, ")");
      if (s[2] > 0 || s[3] > 0) {
        const std::int64_t at_pos = first_not_ascending(e.indices);
        const at::Tensor idx = e.indices.to(at::kCPU, at::kLong);
        const std::int64_t here = idx[at_pos].item<std::int64_t>(), before = idx[at_pos - 1].item<std::int64_t>();
        GK_CHECK(WeightError, here != before, what, ": index ", here, " appears twice (positions ", at_pos - 1,
                 " and ", at_pos, "); indices must be unique");
        GK_THROW(WeightError, what, ": index ", here, " at position ", at_pos, " follows ", before,
                 "; indices must be sorted ascending");
      }
    }
  }
}

}  // namespace gk
