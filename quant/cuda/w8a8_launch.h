// quant/cuda/w8a8_launch.h: the plain CUDA launchers of site 13 (W8A8 int8
// with a static input scale) and the arithmetic they share with the CPU twins
// in quant/w8a8.cpp.
#pragma once

#include "marlin_splitk.h"

#include <cmath>
#include <cstdint>

namespace gk::quant::w8a8 {

// clamp(round_half_even(v / scale), -128, 127)
GK_HD std::int8_t quantize(float v, float scale) {
  float q = rintf(marlin::fdiv(v, scale));
  q = q < -128.f ? -128.f : (q > 127.f ? 127.f : q);
  return static_cast<std::int8_t>(q);
}

// float(sum_k xq[row, k] * w[col, k]) * input_scale * weight_scale[col]
GK_HD float dequant_dot(const std::int8_t* xq, const std::int8_t* w, float input_scale, const float* weight_scale,
                        std::int64_t row, std::int64_t col, std::int64_t k) {
  std::int32_t acc = 0;
  for (std::int64_t i = 0; i < k; ++i) acc += std::int32_t{xq[row * k + i]} * std::int32_t{w[col * k + i]};
  return marlin::fmul(marlin::fmul(static_cast<float>(acc), input_scale), weight_scale[col]);
}

}  // namespace gk::quant::w8a8

namespace gk::quant::cuda {
// xq = quantize(x, *input_scale), m * k elements.
void launch_w8a8_quant(const float* x, const float* input_scale, std::int8_t* xq, std::int64_t m, std::int64_t k,
                       void* stream);
// y[m, n] = dequant_dot(xq, w, *input_scale, weight_scale, ...)
void launch_w8a8_gemm(const std::int8_t* xq, const std::int8_t* w, const float* input_scale, const float* weight_scale,
                      float* y, std::int64_t m, std::int64_t n, std::int64_t k, void* stream);
}  // namespace gk::quant::cuda
