// quant/cuda/act_order.cu: site 12, Machete act-order (gather + W4A16 GEMM).
#include "act_order_launch.h"

#include <cuda_runtime.h>

namespace gk::quant::cuda {
namespace {

// One thread per (row, output channel): reads act_perm from device memory.
__global__ void act_perm_gather_kernel(const float* __restrict__ x, const int32_t* __restrict__ perm,
                                       float* __restrict__ y, int64_t m, int64_t k) {
  const int64_t total = m * k;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / k, i = idx % k;
    y[idx] = x[row * k + perm[i]];
  }
}

__global__ void machete_w4a16_kernel(const float* __restrict__ xp, const int32_t* __restrict__ qweight,
                                     const float* __restrict__ scales, float* __restrict__ out, int64_t m, int64_t n,
                                     int64_t k, int64_t group_size) {
  const int64_t total = m * n;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total; idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / n, col = idx % n;
    out[idx] = act_order::machete_dot(xp, qweight, scales, row, col, n, k, group_size);
  }
}

unsigned blocks_for(int64_t total) {
  const int64_t b = (total + 127) / 128;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

void launch_act_perm_gather(const float* x, const int32_t* perm, float* y, int64_t m, int64_t k, void* stream) {
  act_perm_gather_kernel<<<blocks_for(m * k), 128, 0, static_cast<cudaStream_t>(stream)>>>(x, perm, y, m, k);
}

void launch_machete_w4a16(const float* xp, const int32_t* qweight, const float* scales, float* out, int64_t m,
                          int64_t n, int64_t k, int64_t group_size, void* stream) {
  machete_w4a16_kernel<<<blocks_for(m * n), 128, 0, static_cast<cudaStream_t>(stream)>>>(xp, qweight, scales, out, m,
                                                                                         n, k, group_size);
}

}  // namespace gk::quant::cuda
