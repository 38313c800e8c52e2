// gk::Patch: sizes, device moves and validate_patch (Note [Patch format v1]
// in graphkeep/delta/patch.h).
#include <graphkeep/core/check.h>
#include <graphkeep/delta/patch.h>
#include <graphkeep/sources/safetensors_source.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "device_groups.h"
#include "patch_errors.h"

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <graphkeep/delta/detail/device_upload.h>

#include "cuda/index_order.h"
#endif

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
  // Built only for a message (a MoE patch has 18,000 entries).
  const auto what = [&] {
    return detail::concat(label, ": tensor '", e.name, "' (shape ", c10::IntArrayRef(e.shape), ", ", e.dtype, ")");
  };
  if (e.encoding == PatchEncoding::dense) {
    GK_CHECK(WeightError, e.values.defined(), what(), ": the dense entry has no values");
    GK_CHECK(WeightError, !e.indices.defined(), what(), ": the dense entry has indices too");
    GK_CHECK(WeightError, e.values.layout() == at::kStrided, what(), ": the values are not a strided tensor");
    GK_CHECK(WeightError, e.values.scalar_type() == e.dtype, what(), ": the dense values are ",
             e.values.scalar_type());
    GK_CHECK(WeightError, e.values.sizes() == c10::IntArrayRef(e.shape), what(), ": the dense values have shape ",
             e.values.sizes());
    return;
  }
  GK_CHECK(WeightError, e.indices.defined() && e.values.defined(), what(), ": the sparse entry lacks ",
           e.indices.defined() ? "values" : "indices");
  GK_CHECK(WeightError, e.indices.layout() == at::kStrided && e.values.layout() == at::kStrided, what(),
           ": the indices or values are not a strided tensor");
  GK_CHECK(WeightError, e.indices.dim() == 1, what(), ": the indices have shape ", e.indices.sizes(),
           "; they must be 1-D");
  const at::ScalarType want = patch_index_dtype(numel);
  GK_CHECK(WeightError, e.indices.scalar_type() == want, what(), ": the indices are ", e.indices.scalar_type(),
           "; a tensor of ", numel, " elements takes ", want == at::kInt ? "int32" : "int64",
           " indices (int32 below 2^31 elements)");
  GK_CHECK(WeightError, e.values.dim() == 1, what(), ": the values have shape ", e.values.sizes(),
           "; they must be 1-D");
  GK_CHECK(WeightError, e.values.scalar_type() == e.dtype, what(), ": the values are ", e.values.scalar_type(),
           "; they must be the tensor's dtype");
  GK_CHECK(WeightError, e.values.numel() == e.indices.numel(), what(), ": ", e.indices.numel(), " indices but ",
           e.values.numel(), " values");
  GK_CHECK(WeightError, e.indices.device() == e.values.device(), what(), ": the indices are on ", e.indices.device(),
           " and the values on ", e.values.device());
  GK_CHECK(WeightError, e.indices.numel() <= numel, what(), ": ", e.indices.numel(), " indices for ", numel,
           " elements");
}

// [min, max, repeats, descents] of a sparse entry's indices (count > 0), as
// an int64 tensor of 4 on the indices' device: no synchronization.
at::Tensor index_stats(const at::Tensor& idx) {
  const auto [lo, hi] = at::aminmax(idx);
  at::Tensor repeats, descents;
  const std::int64_t n = idx.numel();
  if (n > 1) {
    const at::Tensor a = idx.narrow(0, 0, n - 1), b = idx.narrow(0, 1, n - 1);
    repeats = at::eq(a, b).sum();
    descents = at::gt(a, b).sum();
  } else {
    repeats = descents = at::zeros({}, idx.options().dtype(at::kLong));
  }
  return at::stack({lo.to(at::kLong), hi.to(at::kLong), repeats, descents});
}

// Note [Validating indices in one pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A MoE patch has 18,000 entries: five launches each (index_stats) were
// most of its validation. Strictly ascending indices have their minimum
// first and their maximum last, so the common case needs no reduction per
// entry: the entries' indices concatenated (per chunk of at most 2^26), one
// comparison of every neighbour pair that lies in one entry (the pairs
// across an entry's boundary masked), summed; and each entry's first and
// last index gathered. One copy to the host gives the first and last of
// every entry and the count of pairs out of order. Only when that count is
// not zero (a patch about to be refused) is each entry examined on its own
// for the message. (A segmented reduction into per-entry slots would be
// one launch too, but its atomics serialize on an entry of millions.) On a
// CUDA device one kernel does all of it (order_summary): each block
// compares 64 Ki indices with their predecessors in their own width and
// adds its count with one atomic, so nothing is concatenated or widened
// (those copies were most of the check: docs/performance.md, "Figures
// behind the code").
//
// Per tensor of `idx` (1-D integer tensors on one device, none empty), its
// first and last index as the rows of a [n, 2] int64 tensor, and the number
// of neighbour pairs within one tensor that are not strictly ascending.
std::pair<at::Tensor, at::Tensor> ends_and_disorder(const std::vector<at::Tensor>& idx) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 26;
  const auto longs = idx.front().options().dtype(at::kLong);
  std::vector<at::Tensor> ends;
  at::Tensor disorder = at::zeros({}, longs);
  for (std::size_t i = 0; i < idx.size();) {
    std::vector<at::Tensor> part;
    std::vector<std::int64_t> firsts, lasts, boundaries;
    std::int64_t total = 0;
    for (; i < idx.size() && (part.empty() || total + idx[i].numel() <= kChunk); ++i) {
      if (total > 0) boundaries.push_back(total - 1);  // the pair (total - 1, total) spans two tensors
      firsts.push_back(total);
      total += idx[i].numel();
      lasts.push_back(total - 1);
      part.push_back(idx[i]);
    }
    // One conversion for the chunk (not a launch per entry) when the entries
    // share an index dtype, as make_patch's do.
    const bool one_dtype = std::all_of(part.begin(), part.end(),
                                       [&](const at::Tensor& t) { return t.scalar_type() == part.front().scalar_type(); });
    if (!one_dtype)
      for (at::Tensor& t : part) t = t.to(at::kLong);
    const at::Tensor ids = at::cat(part).to(at::kLong);
    const auto on_device = [&](const std::vector<std::int64_t>& v) { return at::tensor(v, at::kLong).to(longs.device()); };
    ends.push_back(at::stack({ids.index_select(0, on_device(firsts)), ids.index_select(0, on_device(lasts))}, 1));
    if (total > 1) {
      at::Tensor bad = at::le(ids.narrow(0, 1, total - 1), ids.narrow(0, 0, total - 1));
      if (!boundaries.empty()) bad.index_fill_(0, on_device(boundaries), false);
      disorder = disorder + bad.sum();
    }
  }
  return {at::cat(ends), disorder};
}

// The rows of ends_and_disorder on the host: 2n ends, then the disorder;
// on a CUDA device one launch reads every index once (index_order.h), in
// its width, with no concatenation or widening.
std::vector<std::int64_t> order_summary(const std::vector<at::Tensor>& idx, c10::Device device) {
  const std::size_t n = idx.size();
  std::vector<std::int64_t> out(2 * n + 1, 0);
#if defined(GRAPHKEEP_WITH_CUDA)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device);
    std::vector<cuda::OrderEntry> entries(n);
    std::vector<cuda::OrderTask> tasks;
    for (std::size_t k = 0; k < n; ++k) {
      entries[k] = {idx[k].const_data_ptr(), idx[k].numel(), static_cast<std::int64_t>(idx[k].element_size())};
      for (std::int64_t f = 0; f < idx[k].numel(); f += cuda::kOrderTaskIndices)
        tasks.push_back({f, static_cast<std::int64_t>(k)});
    }
    const at::Tensor e = detail::upload_rows(entries, device), t = detail::upload_rows(tasks, device);
    const at::Tensor stats = at::zeros({3 * static_cast<std::int64_t>(n)}, at::TensorOptions(at::kLong).device(device));
    const int err = cuda::launch_index_order(reinterpret_cast<const cuda::OrderEntry*>(e.const_data_ptr()),
                                             reinterpret_cast<const cuda::OrderTask*>(t.const_data_ptr()),
                                             static_cast<std::int64_t>(tasks.size()), stats.mutable_data_ptr<std::int64_t>(),
                                             c10::cuda::getCurrentCUDAStream(device.index()).stream());
    GK_CHECK(StateError, err == 0, "validate_patch: the index check failed to launch on ", device, " (cudaError ", err, ")");
    const at::Tensor host = stats.cpu();
    const auto* h = host.const_data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < n; ++k) {
      out[2 * k] = h[3 * k], out[2 * k + 1] = h[3 * k + 1];
      out[2 * n] += h[3 * k + 2];
    }
    return out;
  }
#endif
  const auto [ends, disorder] = ends_and_disorder(idx);
  const at::Tensor summary = at::cat({ends.reshape({-1}), disorder.reshape({1})}).cpu();
  std::copy_n(summary.const_data_ptr<std::int64_t>(), out.size(), out.begin());
  return out;
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
  detail::DeviceGroups by_device;
  for (std::size_t i = 0; i < patch.entries.size(); ++i) {
    const PatchEntry& e = patch.entries[i];
    if (e.encoding == PatchEncoding::sparse && e.indices.numel() > 0) by_device.add(e.indices.device(), i);
  }
  for (const auto& [device, which] : by_device.list()) {
    std::vector<at::Tensor> indices;
    indices.reserve(which.size());
    for (const std::size_t i : which) {
      const at::Tensor& t = patch.entries[i].indices;
      indices.push_back(t.is_contiguous() ? t : t.contiguous());  // (1-D: validate_entry; no dispatch where contiguous)
    }
    const std::vector<std::int64_t> summary = order_summary(indices, device);
    const std::int64_t* f = summary.data();
    // Per entry [min, max, repeats, descents]. Ordered: each entry's first
    // and last index are its min and max (Note [Validating indices in one
    // pass]); else every entry is examined alone.
    std::vector<std::int64_t> stats(4 * which.size(), 0);
    if (f[2 * which.size()] == 0) {
      for (std::size_t k = 0; k < which.size(); ++k) stats[4 * k] = f[2 * k], stats[4 * k + 1] = f[2 * k + 1];
    } else {
      std::vector<at::Tensor> each;
      for (const at::Tensor& t : indices) each.push_back(index_stats(t));
      const at::Tensor host = at::stack(each).cpu();
      std::copy_n(host.const_data_ptr<std::int64_t>(), stats.size(), stats.begin());
    }
    for (std::size_t k = 0; k < which.size(); ++k) {
      const PatchEntry& e = patch.entries[which[k]];
      const std::int64_t numel = e.numel();
      const std::int64_t* s = stats.data() + 4 * k;
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
