// quant/cuda/marlin.cu: the Marlin-family split-K GEMMs (sites 5 and 6).
//
// One kernel template, marlin_splitk_kernel<Variant>, holds the lock protocol
// shared by every format (W4A16 act-order, FP8, FP4, MoE); the variants in
// marlin_splitk.h only say how a partial sum over a K range is computed.
#include "marlin_launch.h"

#include <cuda_runtime.h>


namespace gk::quant::cuda {
namespace {

using marlin::SplitK;

// ld.global.acquire.gpu: the load Marlin's barrier_acquire spins on.
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.global.acquire.gpu.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Waits until *lock == slice, at most spin_limit loads. False: a timeout (the
// lock holds a value no block will ever move it from, e.g. garbage left in a
// workspace that was not zeroed).
__device__ __forceinline__ bool barrier_acquire(const int* lock, int slice, int spin_limit) {
  for (int it = 0; it < spin_limit; ++it)
    if (load_acquire(lock) == slice) return true;
  return false;
}

// Publishes this slice's writes, then passes the turn on (the last slice
// resets the lock to 0 for the next launch).
__device__ __forceinline__ void barrier_release(int* lock, int slice, int slices) {
  __threadfence();
  atomicExch(lock, slice + 1 == slices ? 0 : slice + 1);
}

// grid (groups * tiles, slices); dynamic shared memory: m * tile_n partial
// sums, then m activity flags.
template <class V>
__global__ void marlin_splitk_kernel(V v, SplitK c) {
  extern __shared__ float smem[];
  float* part = smem;
  int* active = reinterpret_cast<int*>(smem + c.m * c.tile_n);
  __shared__ int got_turn;

  const int64_t unit = blockIdx.x, slice = blockIdx.y;
  const int64_t group = unit / c.tiles, tile = unit % c.tiles;
  const int64_t k_per = c.k / c.slices, k0 = slice * k_per, k1 = k0 + k_per;
  const int64_t cells = c.m * c.tile_n;

  for (int64_t r = threadIdx.x; r < c.m; r += blockDim.x) active[r] = v.active(group, r) ? 1 : 0;
  __syncthreads();
  // 1. the partial sums of this slice, before taking the turn (as Marlin does)
  for (int64_t i = threadIdx.x; i < cells; i += blockDim.x) {
    const int64_t row = i / c.tile_n, col = tile * c.tile_n + i % c.tile_n;
    part[i] = (col < c.n && active[row]) ? v.partial(group, row, col, k0, k1) : 0.f;
  }
  // 2. wait for our turn on the unit's lock (bounded)
  if (threadIdx.x == 0) got_turn = barrier_acquire(c.locks + unit, static_cast<int>(slice), c.spin_limit) ? 1 : 0;
  __syncthreads();
  // 3. reduce in slice order; a timeout poisons the outputs instead
  for (int64_t i = threadIdx.x; i < cells; i += blockDim.x) {
    const int64_t row = i / c.tile_n, col = tile * c.tile_n + i % c.tile_n;
    if (col >= c.n || !active[row]) continue;
    float* o = v.output(row, col);
    if (!got_turn)
      *o = marlin::quiet_nan();
    else
      *o = slice == 0 ? part[i] : marlin::fadd(__ldcg(o), part[i]);
  }
  // 4. pass the turn on (got_turn is uniform over the block)
  if (got_turn) {
    __syncthreads();
    if (threadIdx.x == 0) barrier_release(c.locks + unit, static_cast<int>(slice), static_cast<int>(c.slices));
  }
}

template <class V>
void launch_splitk(const V& v, const SplitK& c, void* stream) {
  const size_t smem = static_cast<size_t>(c.m * c.tile_n) * sizeof(float) + static_cast<size_t>(c.m) * sizeof(int);
  dim3 grid(static_cast<unsigned>(c.groups * c.tiles), static_cast<unsigned>(c.slices));
  marlin_splitk_kernel<V><<<grid, 128, smem, static_cast<cudaStream_t>(stream)>>>(v, c);
}

__global__ void moe_route_kernel(const float* __restrict__ x, const float* __restrict__ gate,
                                 int32_t* __restrict__ expert_ids, int64_t m, int64_t experts, int64_t k) {
  for (int64_t row = blockIdx.x * blockDim.x + threadIdx.x; row < m; row += gridDim.x * blockDim.x)
    expert_ids[row] = marlin::route_row(x, gate, row, experts, k);
}

}  // namespace

void launch_marlin_w4a16(const marlin::W4A16Args& a, const SplitK& c, void* stream) { launch_splitk(a, c, stream); }
void launch_marlin_fp8(const marlin::Fp8Args& a, const SplitK& c, void* stream) { launch_splitk(a, c, stream); }
void launch_marlin_fp4(const marlin::Fp4Args& a, const SplitK& c, void* stream) { launch_splitk(a, c, stream); }
void launch_marlin_moe(const marlin::MoeArgs& a, const SplitK& c, void* stream) { launch_splitk(a, c, stream); }

void launch_marlin_moe_route(const float* x, const float* gate, int32_t* expert_ids, int64_t m, int64_t experts,
                             int64_t k, void* stream) {
  const unsigned blocks = static_cast<unsigned>((m + 127) / 128);
  moe_route_kernel<<<blocks > 0 ? blocks : 1, 128, 0, static_cast<cudaStream_t>(stream)>>>(x, gate, expert_ids, m,
                                                                                          experts, k);
}

}  // namespace gk::quant::cuda
