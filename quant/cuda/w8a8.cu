// quant/cuda/w8a8.cu: site 13, W8A8 int8 with a static per-tensor input scale
// and per-channel weight scales (both read from device memory).
#include "w8a8_launch.h"

#include <cuda_runtime.h>

namespace gk::quant::cuda {
namespace {

__global__ void w8a8_quant_kernel(const float* __restrict__ x, const float* __restrict__ input_scale,
                                  int8_t* __restrict__ xq, int64_t total) {
  const float s = input_scale[0];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    xq[i] = w8a8::quantize(x[i], s);
}

__global__ void w8a8_gemm_kernel(const int8_t* __restrict__ xq, const int8_t* __restrict__ w,
                                 const float* __restrict__ input_scale, const float* __restrict__ weight_scale,
                                 float* __restrict__ y, int64_t m, int64_t n, int64_t k) {
  const float s = input_scale[0];
  const int64_t total = m * n;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total; idx += int64_t{gridDim.x} * blockDim.x)
    y[idx] = w8a8::dequant_dot(xq, w, s, weight_scale, idx / n, idx % n, k);
}

unsigned blocks_for(int64_t total) {
  const int64_t b = (total + 127) / 128;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

void launch_w8a8_quant(const float* x, const float* input_scale, int8_t* xq, int64_t m, int64_t k, void* stream) {
  w8a8_quant_kernel<<<blocks_for(m * k), 128, 0, static_cast<cudaStream_t>(stream)>>>(x, input_scale, xq, m * k);
}

void launch_w8a8_gemm(const int8_t* xq, const int8_t* w, const float* input_scale, const float* weight_scale, float* y,
                      int64_t m, int64_t n, int64_t k, void* stream) {
  w8a8_gemm_kernel<<<blocks_for(m * n), 128, 0, static_cast<cudaStream_t>(stream)>>>(xq, w, input_scale, weight_scale,
                                                                                     y, m, n, k);
}

}  // namespace gk::quant::cuda
