// Holding declared derivations to their word (Note [Declared derivations] in
// graphkeep/registry/role.h): every full reload, and every patch that re-runs
// a layer's PWAL, compares what PWAL built with what the declaration
// predicts before anything reaches captured storage.
#include "derivations.h"

#include "engine_impl.h"
#include "reload_internal.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/element_bits.h>

#include <ATen/ATen.h>

#include <string>

namespace gk::detail {
namespace {

// The tensor's elements as integers of their size (bitwise comparison: NaN
// payloads and -0.0 compare as the bits they are); wider ones as values.
at::Tensor as_bits(const at::Tensor& t) {
  const std::size_t n = t.element_size();
  return n == 1 || n == 2 || n == 4 || n == 8 ? t.view(bits_dtype(n)) : t;
}

// "ab_strides1" of "experts_.strides_.ab_strides1", for "<Owner>::<member>".
std::string member_name(const std::string& local) {
  const std::size_t dot = local.find_last_of('.');
  return dot == std::string::npos ? local : local.substr(dot + 1);
}

}  // namespace

bool patch_leaves_unchanged(const PlannedSlot& s) { return s.role.derive == Derive::from_shapes; }

void check_declared_derivations(const LayerPlan& lp, const std::vector<at::Tensor>& current,
                                const std::vector<char>& mismatched) {
  std::vector<std::size_t> which;
  std::vector<at::Tensor> differs;
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    const PlannedSlot& s = lp.slots[i];
    if (!patch_leaves_unchanged(s) || !s.defined() || mismatched[i] || !current[i].defined() ||
        current[i].numel() == 0 || same_storage_and_offset(current[i], s.captured))
      continue;
    which.push_back(i);
    differs.push_back(at::ne(as_bits(current[i]), as_bits(s.captured)).any().reshape({1}));
  }
  if (which.empty()) return;
  const at::Tensor any = at::cat(differs).cpu();  // one synchronization for the layer
  const bool* d = any.data_ptr<bool>();
  for (std::size_t j = 0; j < which.size(); ++j) {
    if (!d[j]) continue;
    const PlannedSlot& s = lp.slots[which[j]];
    const at::Tensor now = current[which[j]].reshape({-1}), was = s.captured.reshape({-1});
    const std::int64_t at = at::nonzero(at::ne(as_bits(now), as_bits(was))).reshape({-1})[0].item<std::int64_t>();
    GK_THROW(DeclarationError, s.owner, "::", member_name(s.local), " is declared ", to_string(s.role.role),
             ".from_shapes() (a function of shapes and configuration alone), but PWAL of layer '", lp.prefix,
             "' built ", s.name, " with other values from these weights: element ", at, " was ",
             was[at].item().toDouble(), " and is now ", now[at].item().toDouble(),
             ". It depends on the checkpoint's values: drop .from_shapes() from its declaration (a weight patch "
             "then re-runs this layer's PWAL). Nothing was copied into captured storage for this layer");
  }
}

}  // namespace gk::detail
