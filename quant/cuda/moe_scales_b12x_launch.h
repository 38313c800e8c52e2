// quant/cuda/moe_scales_b12x_launch.h: the plain CUDA launcher of site 8 (see moe_scales_b12x.h).
#pragma once
#include <cstdint>

namespace gk::quant::cuda {
// NVFP4 MoE, top-1, with 128x4-swizzled weight scale factors (un-swizzled on
// read) and global FC1/FC2 input scales read from device memory.
// x: [T, K] -> y: [T, K].
void launch_b12x_moe(const float* x, const float* gate, const std::uint8_t* w13, const std::uint8_t* w13_sf_mma,
                     const float* w13_weight_scale_2, const std::uint8_t* w2, const std::uint8_t* w2_sf_mma,
                     const float* w2_weight_scale_2, const float* fc1_input_scale, const float* fc2_input_scale,
                     float* y, int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, void* stream);
}  // namespace gk::quant::cuda
