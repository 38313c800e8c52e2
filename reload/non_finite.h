// reload/non_finite.h: finding non-finite values in floating-point weights
// (internal to the reload layer; Note [Refusing non-finite weights]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace gk::detail {

// For each tensor, the flat index of its first NaN or infinity, or -1 when
// it has none (and for tensors that are not floating point). One read of
// the bytes: CUDA tensors through one kernel launch per batch of tensors on
// the current stream and one synchronization for all of them, CPU tensors
// through at::parallel_for.
std::vector<std::int64_t> first_non_finite(const std::vector<at::Tensor>& tensors);

}  // namespace gk::detail
