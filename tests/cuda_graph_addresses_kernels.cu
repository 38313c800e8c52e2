// A tiny kernel for tests/cuda_graph_addresses_test.cpp whose parameters put
// device pointers at known non-zero offsets: parameter 1 is a by-value
// struct with pointers at +8 and +24 and a non-pointer 64-bit tag at +16;
// parameter 2 is a plain pointer. No Torch headers here (nvcc is slow on them).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

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

// Note [ATen's TensorInfo] in capture/cuda/cuda_graph_addresses.cpp: the
// layout of at::cuda::detail::TensorInfo<float, unsigned>, under a name of
// our own, and a struct of the same bytes under another name. Both kernels
// copy in[0 .. n) to out; `stale` lands in strides[15] (byte 168), where
// ATen leaves whatever the host's stack held.
namespace gk_test {
template <class T, class IndexType>
struct TensorInfo {
  T* data;
  IndexType sizes[25];
  IndexType strides[25];
  int dims;
};
struct SameBytes {
  float* data;
  unsigned sizes[25];
  unsigned strides[25];
  int dims;
};
}  // namespace gk_test
static_assert(sizeof(gk_test::TensorInfo<float, unsigned>) == 216 && sizeof(gk_test::SameBytes) == 216);

template <class Info>
__global__ void gk_test_tensor_info_kernel(Info out, const float* in, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out.data[i] = in[i];
}

template <class Info>
static Info gk_test_info(float* out, std::uint64_t stale, int dims) {
  Info info{};
  info.data = out;
  info.sizes[0] = 1;
  info.strides[0] = 1;
  std::memcpy(reinterpret_cast<unsigned char*>(&info) + 168, &stale, sizeof stale);
  info.dims = dims;
  return info;
}

// named: the struct is gk_test::TensorInfo (else gk_test::SameBytes).
cudaError_t gk_test_launch_tensor_info(bool named, float* out, const float* in, int n, std::uint64_t stale,
                                       int dims, cudaStream_t stream) {
  const unsigned int blocks = static_cast<unsigned int>((n + 127) / 128);
  if (named)
    gk_test_tensor_info_kernel<<<blocks, 128, 0, stream>>>(
        gk_test_info<gk_test::TensorInfo<float, unsigned>>(out, stale, dims), in, n);
  else
    gk_test_tensor_info_kernel<<<blocks, 128, 0, stream>>>(gk_test_info<gk_test::SameBytes>(out, stale, dims), in, n);
  return cudaGetLastError();
}
