// bench/scatter_probe.cu: a standalone probe of the ways a sparse patch's
// commit can write its changed elements into device memory, measured against
// one full device copy of the same bytes in the same run. It decides how
// reload/cuda/patch_scatter.cu writes (Note [Sector images] there).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/scatter_probe.cu -o /tmp/scatter_probe
//   /tmp/scatter_probe [GiB=15] [tensors=8]
//
// Ways, for bf16 elements at uniformly random positions (densities 1%, 4%, 10%):
//   elements   one 2-byte store per changed element (int32 index + value read);
//              the L2 merges partial sectors and the memory controller
//              reads them back before it writes them
//   sectors    one full 32-byte sector image per touched sector (uint32 sector
//              index + 32 bytes read), made at staging from the served bytes:
//              every store covers whole sectors, nothing is read back
//   copy       cudaMemcpyAsync of every tensor (the full commit's floor)
// Prints one JSON row per (density, way) with the median of 7 timed runs.
#include <cuda_runtime.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>
#include <thrust/unique.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct Pick {
  std::uint64_t seed;
  std::uint32_t threshold;
  __host__ __device__ bool operator()(std::uint32_t i) const {
    std::uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<std::uint32_t>(z) < threshold;
  }
};

struct ToSector {
  __host__ __device__ std::uint32_t operator()(std::uint32_t i) const { return i >> 4; }  // 16 bf16 per sector
};

constexpr int kThreads = 256;

// The shipped kernel's loop (one block per chunk of 16384 entries, 4 loads in
// flight per thread).
__global__ void __launch_bounds__(kThreads) elements_kernel(unsigned short* dst, const std::uint32_t* idx,
                                                            const unsigned short* val, std::uint32_t n) {
  constexpr int U = 4;
  const std::uint64_t base = static_cast<std::uint64_t>(blockIdx.x) * 16384;
  const std::uint32_t count = n - base < 16384 ? static_cast<std::uint32_t>(n - base) : 16384u;
  idx += base;
  val += base;
  std::uint32_t i = threadIdx.x;
  for (; i + (U - 1) * kThreads < count; i += U * kThreads) {
    std::uint32_t k[U];
    unsigned short v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      k[u] = idx[i + u * kThreads];
      v[u] = val[i + u * kThreads];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) dst[k[u]] = v[u];
  }
  for (; i < count; i += kThreads) dst[idx[i]] = val[i];
}

// Two threads per sector, 16 bytes each: the image is read coalesced, each
// sector written whole.
__global__ void __launch_bounds__(kThreads) sectors_kernel(uint4* dst, const std::uint32_t* sector,
                                                           const uint4* image, std::uint64_t halves) {
  constexpr int U = 4;
  std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * (kThreads * U) + threadIdx.x;
  std::uint32_t s[U];
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::uint64_t j = i + u * kThreads;
    if (j < halves) {
      s[u] = sector[j >> 1];
      v[u] = image[j];
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::uint64_t j = i + u * kThreads;
    if (j < halves) dst[static_cast<std::uint64_t>(s[u]) * 2 + (j & 1)] = v[u];
  }
}

struct Tensor {
  unsigned short* dst = nullptr;
  unsigned short* src = nullptr;
  std::uint64_t n = 0;
  thrust::device_vector<std::uint32_t> idx;
  thrust::device_vector<unsigned short> val;
  thrust::device_vector<std::uint32_t> sec;
  thrust::device_vector<uint4> img;
};

template <class F>
double median_ms(F&& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();  // warm
  CK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 15.0;
  const int tensors = argc > 2 ? std::atoi(argv[2]) : 8;
  const std::uint64_t per = static_cast<std::uint64_t>(gib * (1ull << 30) / 2 / tensors) & ~std::uint64_t{4095};
  std::vector<Tensor> ts(tensors);
  for (Tensor& t : ts) {
    t.n = per;
    CK(cudaMalloc(&t.dst, per * 2));
    CK(cudaMalloc(&t.src, per * 2));
    CK(cudaMemset(t.dst, 0, per * 2));
    CK(cudaMemset(t.src, 1, per * 2));
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_ms = median_ms([&] {
    for (Tensor& t : ts) CK(cudaMemcpyAsync(t.dst, t.src, t.n * 2, cudaMemcpyDeviceToDevice));
  });
  std::printf("{\"device\":\"%s\",\"bytes\":%llu,\"way\":\"copy\",\"ms\":%.3f}\n", prop.name,
              static_cast<unsigned long long>(per * 2 * tensors), copy_ms);
  for (double density : {0.01, 0.04, 0.10}) {
    std::uint64_t changed = 0, sectors = 0;
    for (int k = 0; k < tensors; ++k) {
      Tensor& t = ts[k];
      const Pick pick{0x1234567ull * (k + 1), static_cast<std::uint32_t>(density * 4294967296.0)};
      t.idx.resize(static_cast<std::size_t>(t.n * density * 1.1) + 4096);
      auto end = thrust::copy_if(thrust::counting_iterator<std::uint32_t>(0),
                                 thrust::counting_iterator<std::uint32_t>(static_cast<std::uint32_t>(t.n)),
                                 t.idx.begin(), pick);
      t.idx.resize(end - t.idx.begin());
      t.val.assign(t.idx.size(), 0x3f80);
      t.sec.resize(t.idx.size());
      thrust::transform(t.idx.begin(), t.idx.end(), t.sec.begin(), ToSector{});
      t.sec.erase(thrust::unique(t.sec.begin(), t.sec.end()), t.sec.end());
      t.img.assign(t.sec.size() * 2, make_uint4(1, 2, 3, 4));
      changed += t.idx.size();
      sectors += t.sec.size();
      t.idx.shrink_to_fit();
      t.sec.shrink_to_fit();
    }
    CK(cudaDeviceSynchronize());
    const double el_ms = median_ms([&] {
      for (Tensor& t : ts) {
        const auto n = static_cast<std::uint32_t>(t.idx.size());
        elements_kernel<<<(n + 16383) / 16384, kThreads>>>(t.dst, thrust::raw_pointer_cast(t.idx.data()),
                                                           thrust::raw_pointer_cast(t.val.data()), n);
      }
      CK(cudaGetLastError());
    });
    const double se_ms = median_ms([&] {
      for (Tensor& t : ts) {
        const std::uint64_t halves = t.img.size();
        sectors_kernel<<<static_cast<unsigned>((halves + kThreads * 4 - 1) / (kThreads * 4)), kThreads>>>(
            reinterpret_cast<uint4*>(t.dst), thrust::raw_pointer_cast(t.sec.data()),
            thrust::raw_pointer_cast(t.img.data()), halves);
      }
      CK(cudaGetLastError());
    });
    std::printf(
        "{\"density\":%.3f,\"changed\":%llu,\"sectors_touched\":%llu,\"sector_fraction\":%.4f,"
        "\"elements_ms\":%.3f,\"sectors_ms\":%.3f,\"copy_ms\":%.3f,\"elements_x_copy\":%.3f,\"sectors_x_copy\":%.3f}\n",
        density, static_cast<unsigned long long>(changed), static_cast<unsigned long long>(sectors),
        static_cast<double>(sectors) / (per * tensors / 16.0), el_ms, se_ms, copy_ms, el_ms / copy_ms, se_ms / copy_ms);
    std::fflush(stdout);
  }
  return 0;
}
