// graphkeep/numerics/block_sum.h: the sum of one value per thread of a CUDA
// block, added into a 64-bit counter in global memory with one atomic, for
// kernels that total what their blocks found (the content hash's partial
// sums, validate_patch's indices out of order). Device code only: without
// nvcc this header declares nothing.
//
//   std::uint64_t mine = ...;  // this thread's share
//   gk::numerics::add_block_sum<kThreads>(mine, &totals[job]);
//
// Every thread of the block calls it (a warp reduce by shuffles, the warps'
// sums through shared memory, then thread 0 adds the block's sum, modulo
// 2^64, and skips the atomic for a zero sum). It synchronizes the block
// once; a kernel calls it once per counter.
#pragma once

#if defined(__CUDACC__)

#include <cstdint>

namespace gk::numerics {

template <int kBlock>
__device__ __forceinline__ void add_block_sum(std::uint64_t v, unsigned long long* out) {
  static_assert(kBlock % 32 == 0, "whole warps");
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
  __shared__ std::uint64_t warp_sums[kBlock / 32];
  if ((threadIdx.x & 31u) == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint64_t b = 0;
#pragma unroll
    for (int i = 0; i < kBlock / 32; ++i) b += warp_sums[i];
    if (b != 0) atomicAdd(out, static_cast<unsigned long long>(b));
  }
}

}  // namespace gk::numerics

#endif  // __CUDACC__
