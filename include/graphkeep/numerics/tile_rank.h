// graphkeep/numerics/tile_rank.h: the rank of each flagged thread of a CUDA
// block among the flagged threads before it, for kernels that compact what
// they find (a patch's sector images, make_patch's changed elements).
// Device code only: without nvcc this header declares nothing.
//
//   __shared__ int warp_total[kThreads / 32];
//   int found = 0;  // the tile's flagged threads
//   const int rank = gk::numerics::tile_rank<kThreads>(flag, warp_total, &found);
//   if (flag) out[next + rank] = ...;
//   next += found;
//
// Every thread of the block calls it with the block's threads in order (one
// warp vote per warp, the warps' totals through shared memory); it
// synchronizes the block twice, so a loop may call it again at once.
#pragma once

#if defined(__CUDACC__)

namespace gk::numerics {

template <int kThreads>
__device__ __forceinline__ int tile_rank(bool flag, int (&warp_total)[kThreads / 32], int* found) {
  static_assert(kThreads % 32 == 0, "whole warps");
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x >> 5);
  const unsigned bits = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_total[warp] = __popc(bits);
  __syncthreads();
  int before = 0, all = 0;
  for (int k = 0; k < kThreads / 32; ++k) {
    before += k < warp ? warp_total[k] : 0;
    all += warp_total[k];
  }
  __syncthreads();  // warp_total may be written again by the next call
  *found = all;
  return before + __popc(bits & ((1u << lane) - 1u));
}

// As tile_rank, for threads that each found `count` things (not one or
// none): where the thread's first one goes among the tile's, and the
// tile's total in *found. A warp scan by shuffles, then the warps' totals
// through shared memory; synchronizes the block twice.
template <int kThreads>
__device__ __forceinline__ int tile_offset(int count, int (&warp_total)[kThreads / 32], int* found) {
  static_assert(kThreads % 32 == 0, "whole warps");
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x >> 5);
  int inclusive = count;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += v;
  }
  if (lane == 31) warp_total[warp] = inclusive;
  __syncthreads();
  int before = 0, all = 0;
  for (int k = 0; k < kThreads / 32; ++k) {
    before += k < warp ? warp_total[k] : 0;
    all += warp_total[k];
  }
  __syncthreads();
  *found = all;
  return before + inclusive - count;
}

}  // namespace gk::numerics

#endif  // __CUDACC__
