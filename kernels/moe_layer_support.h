// kernels/moe_layer_support.h: what the top-k MoE layer sources share
// (private to the kernels layer). The skeleton of such a layer:
//
//   constructor  check_routing, the layer's own shape checks, then one
//                checkpoint_param line per checkpoint parameter
//                (gk::DescribedLayer records them for checkpoint_params());
//   PWAL         the layer's own: repack, derive, rebuild the experts object;
//   forward      apply_experts (through an experts object, moe_experts.h),
//                or check_inputs and a launch of the layer's own.
//
// Also: tensor options and the int4 repacking. The quant layer's MoE layers
// (top-1 routing by a gate parameter, no experts object) share only the
// checkpoint declaration with these, which gk::DescribedLayer already gives
// both layers.
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/kernels/moe_experts.h>
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

// The routing arguments of a top-k MoE layer, checked in its constructor.
inline void check_routing(const char* layer, int64_t num_experts, int64_t topk) {
  GK_CHECK(DeclarationError, topk >= 1 && topk <= num_experts, layer, ": need 1 <= topk <= experts, got topk ", topk,
           " and ", num_experts, " experts");
}

// The forward of a layer whose PWAL builds an experts object: checks the
// inputs and that PWAL has run, then applies the experts.
inline at::Tensor apply_experts(const char* layer, const MoeExperts* experts, int64_t K, int64_t E,
                                const MoeCall& call) {
  check_inputs(layer, call.x, call.logits, K, E);
  GK_CHECK(StateError, experts != nullptr, layer, ": forward before process_weights_after_loading");
  return experts->apply(call);
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
