// kernels/moe_layer_support.h: what the MoE layer sources share (private to
// the kernels layer): input checks, tensor options, the int4 repacking.
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/host_stream.h>

#include "cuda/moe_common.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace gk::kernels::detail {

using hostrt::reads;
using hostrt::writes;
namespace mc = gk::kernels::moe;

inline void check_inputs(const char* layer, const at::Tensor& x, const at::Tensor& logits, int64_t K, int64_t E) {
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && logits.dim() == 2 && logits.size(0) == x.size(0) && logits.size(1) == E &&
               x.scalar_type() == at::kFloat && logits.scalar_type() == at::kFloat && x.is_contiguous() &&
               logits.is_contiguous(),
           layer, ": x must be a contiguous float [T, ", K, "] and logits [T, ", E, "], got ", x.sizes(), " and ",
           logits.sizes());
}

inline at::TensorOptions on(c10::Device device, at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().dtype(dtype).device(device);
}

// The int4 checkpoint layout (uint8 [E, R, C/2], low nibble = even column)
// repacked 8 per int32 word in the kernel's nibble order (moe_common.h
// int4_slot): int32 [E, R, C/8].
inline at::Tensor pack_int4(const at::Tensor& q) {
  const int64_t E = q.size(0), R = q.size(1), C = q.size(2) * 2;
  const at::Tensor v = q.to(at::kLong);
  const at::Tensor nib = at::stack({v.bitwise_and(15), v.bitwise_right_shift(4)}, -1).reshape({E, R, C / 8, 8});
  std::vector<int64_t> mult(8);
  for (int64_t j = 0; j < 8; ++j) mult[j] = int64_t{1} << (4 * mc::int4_slot(j));
  const at::Tensor m = at::tensor(mult, at::TensorOptions().dtype(at::kLong)).to(q.device());
  return (nib * m).sum(-1).to(at::kInt).contiguous();  // wraps modulo 2^32: the word's bit pattern
}

}  // namespace gk::kernels::detail
