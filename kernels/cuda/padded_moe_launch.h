// kernels/cuda/padded_moe_launch.h: the plain CUDA launcher of site 3 (see padded_moe.h).
#pragma once
#include <cstdint>

namespace gk::kernels::cuda {
// y[t, :] = w2[e] (relu(w13[e, :N] x_t) * (w13[e, N:] x_t)), e = argmax gate x_t; the
// weights' rows have strides w13_row_stride / w2_row_stride (padded), experts
// w13_expert_stride / w2_expert_stride.
void launch_padded_moe(const float* x, const float* gate, const float* w13, const float* w2, float* y, int64_t tokens,
                       int64_t experts, int64_t hidden, int64_t inter, int64_t w13_expert_stride,
                       int64_t w13_row_stride, int64_t w2_expert_stride, int64_t w2_row_stride, void* stream);
}  // namespace gk::kernels::cuda
