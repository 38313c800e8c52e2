// graphkeep/delta/detail/element_bits.h: a tensor's elements as integers of
// the same size, for bitwise comparison and bit-exact copies (Note [Changed
// means different bits] in graphkeep/delta/make_patch.h). Internal: shared by
// the delta layer and the reload engine's patch path.
#pragma once

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

namespace gk::detail {

// The integer dtype of `itemsize` bytes (1, 2, 4 or 8).
inline at::ScalarType bits_dtype(std::size_t itemsize) {
  switch (itemsize) {
    case 1: return at::kByte;
    case 2: return at::kShort;
    case 4: return at::kInt;
    case 8: return at::kLong;
    default: break;
  }
  GK_THROW(WeightError, "a patch moves elements of 1, 2, 4 or 8 bytes, not ", itemsize);
}

// Note [Views without dispatch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A MoE patch's stage makes views of 18,000 entries' captured tensors and
// values (an expert's slice of w13, its bits as integers): through the
// dispatcher each narrow or view costs microseconds of host time, which a
// traced MoE stage showed as a large share of it (docs/performance.md,
// "Figures behind the code"). contiguous_alias makes the same view directly: a
// TensorImpl over the base's storage, with its version counter (as ATen's
// own views share it), contiguous sizes, an offset and a dtype. For the
// stage's internal views only (no autograd history: the stage runs under
// NoGradGuard); the dtype must have the base's element size.
// Whether contiguous_alias may view `t`'s storage as it lies: a contiguous
// tensor with a storage and no lazy negation or conjugation to apply.
inline bool aliasable(const at::Tensor& t) {
  return t.has_storage() && t.is_contiguous() && !t.is_neg() && !t.is_conj();
}

inline at::Tensor contiguous_alias(const at::Tensor& base, std::int64_t storage_offset, c10::IntArrayRef sizes,
                                   at::ScalarType dtype) {
  GK_INTERNAL_ASSERT(static_cast<std::int64_t>(c10::elementSize(dtype)) == base.element_size(),
                     "contiguous_alias changes the element size");
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_contiguous(sizes);
  impl->set_storage_offset(storage_offset);
  impl->set_version_counter(base.unsafeGetTensorImpl()->version_counter());
  return at::Tensor(std::move(impl));
}

// A contiguous tensor as a 1-D view of integers of its element size (no
// copy; no view made of what is one already, and no dispatch for the
// others: Note [Views without dispatch]).
inline at::Tensor flat_bits(const at::Tensor& contiguous) {
  const at::ScalarType bits = bits_dtype(contiguous.element_size());
  if (contiguous.dim() == 1 && contiguous.scalar_type() == bits) return contiguous;
  if (aliasable(contiguous))
    return contiguous_alias(contiguous, contiguous.storage_offset(), {contiguous.numel()}, bits);
  const at::Tensor flat = contiguous.dim() == 1 ? contiguous : contiguous.view(-1);
  return flat.scalar_type() == bits ? flat : flat.view(bits);
}

}  // namespace gk::detail
