// quant/cuda/fp8_mla_attention_launch.h: the plain CUDA launcher of site 7 (see fp8_mla_attention.h).
#pragma once
#include <cstdint>

namespace gk::quant::cuda {
// Causal, softmax-free latent attention with W_K / W_V dequantized in the
// kernel; fmt: 0 = fp8 e4m3 with per-row float scales, 1 = mxfp4 with e8m0
// block scales. q: [T, H*dn], c: [T, L] -> y: [T, H*dv].
void launch_quant_mla(const float* q, const float* c, const std::uint8_t* w_k, const void* w_k_scale,
                      const std::uint8_t* w_v, const void* w_v_scale, float* y, int64_t tokens, int64_t heads,
                      int64_t dn, int64_t dv, int64_t latent, int fmt, float softmax_scale, void* stream);
}  // namespace gk::quant::cuda
