// quant/cuda/act_order_launch.h: the plain CUDA launchers of site 12 (Machete
// act-order) and the arithmetic they share with the CPU twins in
// quant/act_order.cpp.
#pragma once

#include "marlin_splitk.h"

#include <cstdint>

namespace gk::quant::act_order {

// y[row, i] = x[row, perm[i]]: the act-order gather (vLLM: x[:, perm]).
GK_HD void gather_row(const float* x, const std::int32_t* perm, float* y, std::int64_t row, std::int64_t k) {
  for (std::int64_t i = 0; i < k; ++i) y[row * k + i] = x[row * k + perm[i]];
}

// One output of the Machete W4A16 GEMM on permuted activations: the weights
// are prepacked in act-order (sorted K), so sorted channel i belongs to group
// i / group_size.
GK_HD float machete_dot(const float* xp, const std::int32_t* qweight, const float* scales, std::int64_t row,
                        std::int64_t col, std::int64_t n, std::int64_t k, std::int64_t group_size) {
  float acc = 0.f;
  for (std::int64_t i = 0; i < k; ++i) {
    const std::uint32_t word = static_cast<std::uint32_t>(qweight[(i >> 3) * n + col]);
    const int q = static_cast<int>((word >> (4 * (i & 7))) & 0xFu) - 8;
    const float w = marlin::fmul(static_cast<float>(q), scales[(i / group_size) * n + col]);
    acc = marlin::fadd(acc, marlin::fmul(xp[row * k + i], w));
  }
  return acc;
}

}  // namespace gk::quant::act_order

namespace gk::quant::cuda {
void launch_act_perm_gather(const float* x, const std::int32_t* perm, float* y, std::int64_t m, std::int64_t k,
                            void* stream);
void launch_machete_w4a16(const float* xp, const std::int32_t* qweight, const float* scales, float* out,
                          std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t group_size, void* stream);
}  // namespace gk::quant::cuda
