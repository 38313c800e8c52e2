// kernels/cuda/mla_attention_launch.h: the plain CUDA launcher of site 1.
#pragma once
#include <cstdint>

namespace gk::kernels::cuda {
// y[t, h*dv + j] = (sum_d q[t,h*dn+d] * (sum_l w_uk_t[h,d,l] c[t,l]) ...) see mla_attention.h
void launch_mla_absorbed(const float* q, const float* c, const float* w_uk_t, const float* w_uv, float* y,
                         int64_t tokens, int64_t heads, int64_t dn, int64_t dv, int64_t latent, void* stream);
}  // namespace gk::kernels::cuda
