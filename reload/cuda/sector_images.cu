// The two kernels of Note [Sector images on the device] (sector_images.h).
#include "sector_images.h"

#include <graphkeep/numerics/tile_rank.h>

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kSectorTaskEntries % kThreads == 0, "a task is whole tiles of kThreads entries");

__device__ __forceinline__ std::int64_t index_at(const SectorItem& it, std::int64_t i) {
  return it.index_bytes == 8 ? static_cast<const long long*>(it.indices)[i]
                             : static_cast<const int*>(it.indices)[i];
}

// Where entry i lies: below the whole sectors, inside them (then `sector`
// is its sector's number from `whole`) or above them; and whether it opens
// its sector (the sector's first changed entry: the indices ascend).
struct Where {
  bool below = false, inside = false, opens = false;
  std::int64_t sector = 0;
};

__device__ __forceinline__ Where where(const SectorItem& it, std::int64_t i) {
  Where w;
  const std::int64_t k = index_at(it, i) - it.first;
  w.below = k < 0;
  w.inside = k >= 0 && k < it.sectors * it.per;
  if (!w.inside) return w;
  w.sector = k / it.per;
  if (i == 0) {
    w.opens = true;
  } else {
    const std::int64_t prev = index_at(it, i - 1) - it.first;
    w.opens = prev < 0 || prev / it.per != w.sector;
  }
  return w;
}

__global__ void __launch_bounds__(kThreads)
    sector_count_kernel(const SectorItem* __restrict__ items, const SectorTask* __restrict__ tasks,
                        std::int32_t* __restrict__ counts) {
  __shared__ int total[3];
  if (threadIdx.x < 3) total[threadIdx.x] = 0;
  __syncthreads();
  const SectorTask t = tasks[blockIdx.x];
  const SectorItem it = items[t.item];
  int below = 0, inside = 0, opened = 0;
  for (std::uint32_t j = threadIdx.x; j < t.count; j += kThreads) {
    const Where w = where(it, t.begin + j);
    below += w.below, inside += w.inside, opened += w.opens;
  }
  for (int o = 16; o > 0; o >>= 1) {
    below += __shfl_down_sync(0xffffffffu, below, o);
    inside += __shfl_down_sync(0xffffffffu, inside, o);
    opened += __shfl_down_sync(0xffffffffu, opened, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&total[kBelow], below);
    atomicAdd(&total[kInside], inside);
    atomicAdd(&total[kOpened], opened);
  }
  __syncthreads();
  if (threadIdx.x < 3) counts[3 * static_cast<std::int64_t>(blockIdx.x) + threadIdx.x] = total[threadIdx.x];
}

// The image of the sector that entry i opens: the served 32 bytes with
// every changed entry of that sector written over them.
__device__ void make_image(const SectorItem& it, std::int64_t i, std::int64_t sector, uint4* out) {
  union {
    uint4 v[2];
    unsigned char b[32];
  } img;
  const uint4* served = reinterpret_cast<const uint4*>(it.whole) + 2 * sector;
  img.v[0] = served[0];
  img.v[1] = served[1];
  const auto* values = static_cast<const unsigned char*>(it.values);
  const std::int64_t base = it.first + sector * it.per;
  for (std::int64_t j = i; j < it.count && j < i + it.per; ++j) {  // at most `per` entries share a sector
    const std::int64_t k = index_at(it, j) - base;                  // >= 0: the indices ascend
    if (k >= it.per) break;
    for (int b = 0; b < it.elem_bytes; ++b) img.b[k * it.elem_bytes + b] = values[j * it.elem_bytes + b];
  }
  out[0] = img.v[0];
  out[1] = img.v[1];
}

__global__ void __launch_bounds__(kThreads)
    sector_fill_kernel(const SectorItem* __restrict__ items, const SectorTask* __restrict__ tasks,
                       const std::int64_t* __restrict__ slot, std::int32_t* __restrict__ sector_ids,
                       uint4* __restrict__ images) {
  __shared__ int warp_total[kWarps];
  const SectorTask t = tasks[blockIdx.x];
  const SectorItem it = items[t.item];
  std::int64_t next = slot[blockIdx.x];  // the first slot of this tile
  for (std::uint32_t tile = 0; tile < t.count; tile += kThreads) {
    const std::uint32_t j = tile + threadIdx.x;
    Where w;
    if (j < t.count) w = where(it, t.begin + j);
    int opened = 0;
    const int rank = numerics::tile_rank<kThreads>(w.opens, warp_total, &opened);
    if (w.opens) {
      sector_ids[next + rank] = static_cast<std::int32_t>(w.sector);
      make_image(it, t.begin + j, w.sector, images + 2 * (next + rank));
    }
    next += opened;
  }
}

}  // namespace

int launch_sector_count(const SectorItem* items, const SectorTask* tasks, int task_count, std::int32_t* counts,
                        void* stream) {
  if (task_count <= 0) return 0;
  sector_count_kernel<<<static_cast<unsigned>(task_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      items, tasks, counts);
  return static_cast<int>(cudaGetLastError());
}

int launch_sector_fill(const SectorItem* items, const SectorTask* tasks, int task_count, const std::int64_t* slot,
                       std::int32_t* sector_ids, void* images, void* stream) {
  if (task_count <= 0) return 0;
  sector_fill_kernel<<<static_cast<unsigned>(task_count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      items, tasks, slot, sector_ids, static_cast<uint4*>(images));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
