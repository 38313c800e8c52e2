// graphkeep/delta/detail/element_bits.h: a tensor's elements as integers of
// the same size, for bitwise comparison and bit-exact copies (Note [Changed
// means different bits] in graphkeep/delta/make_patch.h). Internal: shared by
// the delta layer and the reload engine's patch path.
#pragma once

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>

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

// A contiguous tensor as a 1-D view of integers of its element size (no
// copy; no view made of what is one already: a MoE patch asks this of each
// of 18,000 entries).
inline at::Tensor flat_bits(const at::Tensor& contiguous) {
  const at::ScalarType bits = bits_dtype(contiguous.element_size());
  const at::Tensor flat = contiguous.dim() == 1 ? contiguous : contiguous.view(-1);
  return flat.scalar_type() == bits ? flat : flat.view(bits);
}

}  // namespace gk::detail
