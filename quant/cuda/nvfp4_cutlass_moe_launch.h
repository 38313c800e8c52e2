// quant/cuda/nvfp4_cutlass_moe_launch.h: the plain CUDA launcher of site 9 (see nvfp4_cutlass_moe.h).
#pragma once
#include <cstdint>

namespace gk::quant::cuda {
// NVFP4 MoE, top-1: activations quantized with a1_gscale / a2_gscale[e],
// GEMM outputs rescaled by g1_alphas / g2_alphas[e]. x: [T, K] -> y: [T, K].
void launch_nvfp4_cutlass_moe(const float* x, const float* gate, const std::uint8_t* w13, const std::uint8_t* w13_sf,
                              const std::uint8_t* w2, const std::uint8_t* w2_sf, const float* g1_alphas,
                              const float* g2_alphas, const float* a1_gscale, const float* a2_gscale, float* y,
                              int64_t tokens, int64_t experts, int64_t hidden, int64_t inter, void* stream);
}  // namespace gk::quant::cuda
