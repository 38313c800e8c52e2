// gk::check_patch, gk::apply_patch and gk::apply_patch_in_place (Note [Apply
// is transactional] in graphkeep/delta/apply_patch.h).
#include <graphkeep/core/check.h>
#include <graphkeep/delta/apply_patch.h>
#include <graphkeep/delta/detail/element_bits.h>
#include <graphkeep/hashing/content_hash.h>

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "patch_errors.h"

namespace gk {

namespace {

// Each entry's tensor among `tensors` (by position), with its shape and dtype
// checked: everything but the hashes, before any write.
std::vector<std::size_t> resolve(const Patch& patch, const std::vector<NamedTensor>& tensors) {
  const std::string_view label = detail::patch_label(patch);
  std::map<std::string_view, std::size_t> index;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    GK_CHECK(WeightError, index.emplace(tensors[i].name, i).second, label, ": tensor '", tensors[i].name,
             "' is given twice to apply the patch to");
  }
  std::vector<std::size_t> out;
  out.reserve(patch.entries.size());
  for (const PatchEntry& e : patch.entries) {
    const auto it = index.find(e.name);
    GK_CHECK(WeightError, it != index.end(), label, ": tensor '", e.name, "' is not among the ", tensors.size(),
             " tensors the patch is applied to (an unknown name)");
    const NamedTensor& t = tensors[it->second];
    GK_CHECK(WeightError, t.shard == 0, label, ": tensor '", e.name, "' is given as shard ", t.shard,
             "; a patch applies to whole checkpoint tensors");
    GK_CHECK(WeightError, t.value.defined() && t.value.layout() == at::kStrided, label, ": tensor '", e.name,
             "' is undefined or not strided");
    GK_CHECK(WeightError, t.value.sizes() == c10::IntArrayRef(e.shape) && t.value.scalar_type() == e.dtype, label,
             ": tensor '", e.name, "' is ", t.value.scalar_type(), " ", t.value.sizes(), " but the patch is for ",
             e.dtype, " ", c10::IntArrayRef(e.shape));
    out.push_back(it->second);
  }
  return out;
}

enum class Stage { base, target };

// The content hashes of `tensors` (contiguous, one per entry) against the
// entries' base or target hashes: one batched call.
void verify(const Patch& patch, const std::vector<at::Tensor>& tensors, Stage stage) {
  const std::vector<std::uint64_t> got = content_hashes(tensors);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const PatchEntry& e = patch.entries[i];
    const std::uint64_t want = stage == Stage::base ? e.base_hash : e.target_hash;
    GK_CHECK(WeightError, got[i] == want, detail::patch_label(patch), ": tensor '", e.name, "': ",
             stage == Stage::base
                 ? "its content hash is "
                 : "after the patch its content hash is ",
             format_content_hash(got[i]), " but the patch's ", stage == Stage::base ? "base" : "target", " hash is ",
             format_content_hash(want),
             stage == Stage::base ? " (the patch was made from other weights: apply it to version '"
                                  : " (the patch's values do not produce its target version '",
             stage == Stage::base ? patch.base_version : patch.target_version, "')");
  }
}

// The entry's indices (int64) and values (as bits), on `device`.
struct Moved {
  at::Tensor indices, values;
};
Moved moved(const PatchEntry& e, c10::Device device) {
  Moved m;
  if (e.encoding == PatchEncoding::sparse) m.indices = e.indices.to(device, at::kLong);
  m.values = detail::flat_bits(e.values.to(device).contiguous());
  return m;
}

// Writes the entry into `dst` (contiguous), bit for bit.
void write_entry(const PatchEntry& e, const Moved& m, const at::Tensor& dst) {
  const at::Tensor bits = detail::flat_bits(dst);
  if (e.encoding == PatchEncoding::dense) bits.copy_(m.values);
  else bits.index_copy_(0, m.indices, m.values);
}

}  // namespace

void check_patch(const Patch& patch, const std::vector<ExpectedTensor>& expected) {
  validate_patch(patch);
  const std::string_view label = detail::patch_label(patch);
  std::map<std::string_view, const ExpectedTensor*> index;
  for (const ExpectedTensor& x : expected) index.emplace(x.name, &x);
  for (const PatchEntry& e : patch.entries) {
    const auto it = index.find(e.name);
    GK_CHECK(WeightError, it != index.end(), label, ": tensor '", e.name,
             "' is not a tensor of the model (an unknown name; the model expects ", expected.size(), " tensors)");
    const ExpectedTensor& x = *it->second;
    GK_CHECK(WeightError, x.shape == e.shape && x.dtype == e.dtype, label, ": tensor '", e.name, "' is ", e.dtype,
             " ", c10::IntArrayRef(e.shape), " in the patch but ", x.dtype, " ", c10::IntArrayRef(x.shape),
             " in the model");
  }
}

std::vector<NamedTensor> apply_patch(const Patch& patch, const std::vector<NamedTensor>& base,
                                     const ApplyPatchOptions& options) {
  validate_patch(patch);
  const std::vector<std::size_t> where = resolve(patch, base);
  std::vector<at::Tensor> before;
  for (const std::size_t i : where) before.push_back(base[i].value.contiguous());
  if (options.verify_base) verify(patch, before, Stage::base);

  std::vector<at::Tensor> after;
  for (std::size_t k = 0; k < where.size(); ++k) {
    const at::Tensor& b = before[k];
    // A fresh tensor: `before` is one already when the base was not contiguous.
    at::Tensor r = b.is_same(base[where[k]].value) ? b.clone(at::MemoryFormat::Contiguous) : b;
    write_entry(patch.entries[k], moved(patch.entries[k], r.device()), r);
    after.push_back(std::move(r));
  }
  if (options.verify_target) verify(patch, after, Stage::target);

  std::vector<NamedTensor> out = base;
  for (std::size_t k = 0; k < where.size(); ++k) out[where[k]].value = after[k];
  return out;
}

void apply_patch_in_place(const Patch& patch, const std::vector<NamedTensor>& tensors,
                          const ApplyPatchOptions& options) {
  validate_patch(patch);
  const std::vector<std::size_t> where = resolve(patch, tensors);
  std::vector<at::Tensor> dst;
  for (std::size_t k = 0; k < where.size(); ++k) {
    const at::Tensor& t = tensors[where[k]].value;
    GK_CHECK(WeightError, t.is_contiguous(), detail::patch_label(patch), ": tensor '", patch.entries[k].name,
             "' is not contiguous; apply_patch_in_place writes through a flat view (use apply_patch, out of place)");
    dst.push_back(t);
  }
  if (options.verify_base) verify(patch, dst, Stage::base);

  // Every entry's data on its tensor's device before the first write.
  std::vector<Moved> data;
  for (std::size_t k = 0; k < where.size(); ++k) data.push_back(moved(patch.entries[k], dst[k].device()));

  std::vector<at::Tensor> saved;  // what each applied entry overwrote
  saved.reserve(where.size());
  try {
    for (std::size_t k = 0; k < where.size(); ++k) {
      const PatchEntry& e = patch.entries[k];
      const at::Tensor bits = detail::flat_bits(dst[k]);
      saved.push_back(e.encoding == PatchEncoding::dense ? bits.clone() : bits.index_select(0, data[k].indices));
      write_entry(e, data[k], dst[k]);
    }
    if (options.verify_target) verify(patch, dst, Stage::target);
  } catch (...) {
    // Roll back, last entry first: the saved elements go back where they were.
    for (std::size_t k = saved.size(); k-- > 0;) {
      const at::Tensor bits = detail::flat_bits(dst[k]);
      if (patch.entries[k].encoding == PatchEncoding::dense) bits.copy_(saved[k]);
      else bits.index_copy_(0, data[k].indices, saved[k]);
    }
    throw;
  }
}

}  // namespace gk
