// The content hash kernel behind gk::content_hashes on a CUDA device: the
// function of Note [Content hash: gk-xxh64-blocks v1] (content_hash.h), many
// tensors in one launch. Plain CUDA, no Torch; the XXH64 arithmetic is the
// host-tested lane code of graphkeep/hashing/xxh64_lanes.h.
//
// Note [One quad of threads per block]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// XXH64 reads its input as 32-byte stripes and keeps four accumulators
// ("lanes"); lane j takes the j-th 8-byte word of every stripe through a
// multiply-rotate-multiply round. Each lane is a serial chain (a round does
// not compose associatively), so a 64 KiB block is four chains of 2,048
// rounds, and the parallelism is four chains per block. Three mappings:
//
//   a warp per block    4 of 32 threads run rounds, 28 only load: the kernel
//                       becomes bound by integer issue at ~1/8 of the SM's
//                       throughput, far below HBM bandwidth.
//   a thread per block  every thread computes (4 chains of ILP), but a thread
//                       must keep 4x the bytes in flight to hide DRAM latency
//                       (registers), and only one thread per 64 KiB exists.
//   a quad per block    (chosen) four adjacent threads hash one block, thread
//                       j running lane j. Every thread computes; one 8-byte
//                       load per thread makes a warp read 8 blocks x 32
//                       contiguous bytes, i.e. 8 whole 32-byte sectors, so
//                       every byte fetched is used; and there are 4 threads
//                       per block to keep loads in flight.
//
// The budget. A round is ~12 integer instructions (64-bit multiplies are
// emulated with 32-bit IMADs) per 8 bytes, ~1.5 per byte: 4.8 TB/s needs ~7e12
// integer operations per second, under half of an H200's (132 SMs x 64 lanes x
// ~1.98 GHz). Memory: to stream at 4.8 TB/s with ~0.7 us of DRAM latency,
// ~3.4 MB must be in flight (Little's law). Each thread keeps U = 16 words
// (128 bytes) in flight while it computes the previous 16 (two register
// buffers, lane_stripes in xxh64_lanes.h), so ~27k threads, ~7k blocks
// (~450 MB), are needed to approach bandwidth; a smaller job is bound by
// latency (a block's chain is 2,048 dependent rounds). So hash many tensors in
// one call (content_hashes), a layer or a whole model, not one at a time;
// bench/content_hash_bench.cpp measures GB/s against a device copy of the
// same bytes.
//
// One launch, no second pass: each quad writes its block's digest, and the
// quad that completes a tensor's last block (a per-tensor counter, after a
// __threadfence, as in CUDA's threadFenceReduction sample) hashes the
// tensor's digests, reading them with ld.global.cg (L2, where the other
// blocks' writes are visible) after a second fence. Blocks are assigned to
// tensors by a binary search over block_begin. A tensor whose data pointer is
// not 8-byte aligned (a view at an odd storage offset) is read a byte at a
// time: correct, slower; a whole tensor or a row of one is aligned.
#include "content_hash_launch.h"

#include <graphkeep/hashing/xxh64_lanes.h>

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

namespace x = gk::detail::xxh64;

constexpr int kThreads = 256;  // 64 quads
constexpr int kUnroll = 16;    // words in flight per thread (Note [One quad of threads per block])
constexpr std::uint64_t kBlockBytes = 64 * 1024;

// The input tensors: read once, never written by this kernel; streaming
// loads (evict first) keep them from displacing the digests in L2.
struct StreamLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const {
    return __ldcs(reinterpret_cast<const unsigned long long*>(p));
  }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return __ldcs(p); }
};
// Inputs at an address that is not 8-byte aligned.
struct ByteLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const { return x::bytes_le(p, 8, *this); }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return __ldcs(p); }
};
// The digests, written by other thread blocks of this launch: from L2.
struct CoherentLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const {
    return __ldcg(reinterpret_cast<const unsigned long long*>(p));
  }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return __ldcg(p); }
};

// XXH64(p, len, seed), computed by the four threads of a quad (`lane` 0..3,
// `mask` the quad's bits); lane 0 gets the result, the others 0.
template <class Load>
__device__ __forceinline__ std::uint64_t quad_xxh64(const unsigned char* p, std::uint64_t len, std::uint64_t seed,
                                                    int lane, unsigned mask, const Load& load) {
  const std::uint64_t acc = x::lane_stripes<kUnroll>(x::lane_init(lane, seed), p + 8 * lane, len / 32, load);
  const std::uint64_t v[4] = {__shfl_sync(mask, acc, 0, 4), __shfl_sync(mask, acc, 1, 4),
                              __shfl_sync(mask, acc, 2, 4), __shfl_sync(mask, acc, 3, 4)};
  return lane == 0 ? x::finish(v, p, len, seed, load) : 0;
}

template <bool kOverlaid>
__global__ void __launch_bounds__(kThreads) content_hash_kernel(const ContentHashJob job) {
  const std::uint64_t task = (static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x) / 4;
  if (task >= job.blocks) return;  // whole quads: kThreads is a multiple of 4
  const int lane = static_cast<int>(threadIdx.x & 3u);
  const unsigned mask = 0xFu << (threadIdx.x & 28u);

  // The tensor t holding block `task`: block_begin[t] <= task < block_begin[t + 1].
  int lo = 0, hi = job.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (job.block_begin[mid] <= task) lo = mid; else hi = mid - 1;
  }
  const int t = lo;
  const std::uint64_t first = job.block_begin[t];
  const std::uint64_t nblocks = job.block_begin[t + 1] - first;
  const std::uint64_t nbytes = job.nbytes[t];
  const std::uint64_t offset = (task - first) * kBlockBytes;
  const auto* p = reinterpret_cast<const unsigned char*>(job.data[t]) + offset;
  const std::uint64_t len = nbytes - offset < kBlockBytes ? nbytes - offset : kBlockBytes;

  const bool aligned = (reinterpret_cast<std::uintptr_t>(p) & 7u) == 0;
  std::uint64_t digest;
  if constexpr (kOverlaid) {
    // Note [Hashing through the writes] (overlaid_hash.h): each thread reads
    // its words through a cursor per list of writes, from its first word;
    // lane 0 then reads the block's tail bytes through the same cursors.
    const std::uint32_t sb = job.source_begin[t];
    const int n = static_cast<int>(job.source_begin[t + 1] - sb);
    if (aligned) {
      x::OverlayLoad<StreamLoad> load{StreamLoad{}, job.sources + sb, n};
      load.start(p + 8 * lane);
      digest = quad_xxh64(p, len, 0, lane, mask, load);
    } else {
      x::OverlayLoad<ByteLoad> load{ByteLoad{}, job.sources + sb, n};
      load.start(p + 8 * lane);
      digest = quad_xxh64(p, len, 0, lane, mask, load);
    }
  } else {
    digest = aligned ? quad_xxh64(p, len, 0, lane, mask, StreamLoad{}) : quad_xxh64(p, len, 0, lane, mask, ByteLoad{});
  }
  int last = 0;
  if (lane == 0) {
    job.digests[task] = digest;
    __threadfence();
    last = atomicAdd(job.done + t, 1ull) == nblocks - 1;
  }
  if (!__shfl_sync(mask, last, 0, 4)) return;
  __threadfence();
  const std::uint64_t hash =
      quad_xxh64(reinterpret_cast<const unsigned char*>(job.digests + first), 8 * nblocks, nbytes, lane, mask,
                 CoherentLoad{});
  if (lane == 0) job.out[t] = hash;
}

}  // namespace

int launch_content_hash(const ContentHashJob& job, void* stream) {
  if (job.count <= 0 || job.blocks == 0) return 0;
  const std::uint64_t grid = (job.blocks * 4 + kThreads - 1) / kThreads;
  if (grid > 0x7FFFFFFFull) return static_cast<int>(cudaErrorInvalidConfiguration);
  if (job.source_begin != nullptr)
    content_hash_kernel<true><<<static_cast<unsigned>(grid), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(job);
  else
    content_hash_kernel<false><<<static_cast<unsigned>(grid), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(job);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
