// A tiny kernel for tests/cuda_graph_addresses_test.cpp whose parameters put
// device pointers at known non-zero offsets: parameter 1 is a by-value
// struct with pointers at +8 and +24 and a non-pointer 64-bit tag at +16;
// parameter 2 is a plain pointer. No Torch headers here (nvcc is slow on them).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

struct GkScaleArgs {
  std::int32_t n;      // +0
  float alpha;         // +4
  const float* in;     // +8
  std::uint64_t tag;   // +16: not an address
  float* out;          // +24
};
static_assert(offsetof(GkScaleArgs, in) == 8 && offsetof(GkScaleArgs, tag) == 16 &&
              offsetof(GkScaleArgs, out) == 24 && sizeof(GkScaleArgs) == 32);

// Layout: (int first @0, size 4) (GkScaleArgs args @8, size 32) (const float* bias @40, size 8)
__global__ void gk_test_scale_kernel(int first, GkScaleArgs args, const float* bias) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < args.n) args.out[i] = args.alpha * args.in[i] + bias[i] + static_cast<float>(first);
}

cudaError_t gk_test_launch_scale(int first, const float* in, float* out, int n, float alpha,
                                 std::uint64_t tag, const float* bias, cudaStream_t stream) {
  GkScaleArgs args{n, alpha, in, tag, out};
  const unsigned int blocks = static_cast<unsigned int>((n + 127) / 128);
  gk_test_scale_kernel<<<blocks, 128, 0, stream>>>(first, args, bias);
  return cudaGetLastError();
}
