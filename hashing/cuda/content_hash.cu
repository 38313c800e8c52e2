// The content hash kernels behind gk::content_hashes and
// gk::overlaid_content_hashes on a CUDA device: the sums of Note [Content
// hash: gk-sum64 v1] (content_hash.h), many tensors in one launch. Plain
// CUDA, no Torch; the arithmetic is the host-tested code of
// graphkeep/hashing/sum64.h and overlay_load.h.
//
// Note [Summing at memory speed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every word's term is independent of the others, and the sum is exact
// modulo 2^64 in any order, so the whole hash has no serial chain: a thread
// block of 256 threads takes one 64 KiB block (8,192 words), thread i the
// words i, i + 256, ... (each warp load is 256 contiguous bytes, whole
// sectors), 8 loads in flight per thread before their terms are summed; a
// warp then a block reduce, and one 64-bit atomicAdd per block into the
// tensor's sum. The result does not depend on the order of the atomics. A
// term is one splitmix64 output, two 64-bit multiplies (six 32-bit IMADs)
// and a few shifts per 8 bytes: ~2.5 integer operations per byte, which an
// H100 or H200 issues faster than HBM delivers bytes, so the kernel is bound
// by memory. (XXH64, the earlier function, chains each lane's rounds: it
// reached about half of the memory's speed.) A tensor whose data pointer is
// not 8-byte aligned (a view at an odd storage offset) is read a byte at a
// time: correct, slower; a whole tensor or a row of one is aligned.
//
// The change through a set of writes (overlaid_content_hashes) is a sum over
// the words the writes cover: one thread per 4 KiB walks its writes in
// address order (OverlayLoad::delta), jumping from covered word to covered
// word, so the kernel reads the writes and the words they cover,
// O(changed), not the tensor. Each thread's walk is a chain of dependent
// loads (the next write's index, then its word): a thread per 64 KiB
// walked ~1,200 covered words of a 1 % bf16 patch's sector images in
// turn, one latency after another (docs/performance.md, "Figures behind
// the code"); sixteen threads per 64 KiB walk sixteen shorter chains at
// once.
// Sources that are sector images need no walk at all: a second kernel sums
// them write by write (Note [Exclusive writes] in overlay_load.h).
#include "content_hash_launch.h"

#include <graphkeep/hashing/overlay_load.h>
#include <graphkeep/hashing/sum64.h>
#include <graphkeep/numerics/block_sum.h>

#include <cuda_runtime.h>

namespace gk::cuda {
namespace {

namespace s64 = gk::detail::sum64;

constexpr int kThreads = 256;                  // per 64 KiB block (the whole hash)
constexpr int kDeltaThreads = 128;             // threads per thread block (the change through writes)
constexpr int kDeltaParts = 16;                // threads per 64 KiB block there: 4 KiB each
constexpr std::uint64_t kBlockWords = 8192;    // 64 KiB
constexpr int kPerThread = static_cast<int>(kBlockWords) / kThreads;
constexpr int kUnroll = 8;                     // loads in flight per thread

// The input tensors: read once, never written by this kernel; streaming
// loads (evict first).
struct StreamLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const {
    return __ldcs(reinterpret_cast<const unsigned long long*>(p));
  }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return __ldcs(p); }
};
// Inputs at an address that is not 8-byte aligned.
struct ByteLoad {
  __device__ __forceinline__ std::uint64_t word(const unsigned char* p) const { return s64::bytes_le(p, 8, *this); }
  __device__ __forceinline__ std::uint64_t byte(const unsigned char* p) const { return __ldcs(p); }
};

// The tensor t holding block `task`: block_begin[t] <= task < block_begin[t + 1].
__device__ __forceinline__ int tensor_of(const ContentHashJob& job, std::uint64_t task) {
  int lo = 0, hi = job.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (job.block_begin[mid] <= task) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Note [Scanning while summing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A streaming reload from a trainer's resident tensors both hashes them and
// refuses a NaN or an infinity among them: two whole reads of the same
// bytes (docs/performance.md, "Figures behind the code"). The sum kernel
// can test each word it loads as well (a few integer operations per 8
// bytes; it is bound by memory, not by them): a word's lanes are the
// tensor's elements (its data pointer is element-aligned, a partial last
// word is padded with zero bits,
// which are finite in every dtype), an element is bad where its exponent
// bits are all set, y = (w & mask) ^ mask has a zero lane there, and
// (y - lo) & ~y & hi is non-zero exactly when some lane of y is zero (lo
// holds a 1 in each lane's lowest bit, hi in its highest). Only a word that
// has one is taken apart lane by lane; each thread keeps its lowest bad
// byte offset and lowers the tensor's with one atomicMin.
struct ScanWords {
  std::uint64_t mask = 0, lo = 0, hi = 0;
  std::uint32_t bytes = 0;  // 0: not tested

  ScanWords() = default;
  __device__ __forceinline__ ScanWords(const ContentHashJob& job, int t) {
    if (job.scan_mask == nullptr) return;
    bytes = static_cast<std::uint32_t>(job.scan_bytes[t]);
    if (bytes == 0) return;
    mask = job.scan_mask[t];
    lo = bytes == 8 ? 1 : bytes == 4 ? 0x0000000100000001ull : bytes == 2 ? 0x0001000100010001ull : 0x0101010101010101ull;
    hi = lo << (8 * bytes - 1);
  }
  // Lowers `found` to the byte offset of word j's first bad element.
  __device__ __forceinline__ void test(std::uint64_t w, std::uint64_t j, std::uint64_t& found) const {
    const std::uint64_t y = (w & mask) ^ mask;
    if (((y - lo) & ~y & hi) == 0) return;
    const std::uint64_t lane = bytes == 8 ? ~0ull : (1ull << (8 * bytes)) - 1;
    for (std::uint32_t l = 0; l < 8 / bytes; ++l) {
      if (((y >> (8 * bytes * l)) & lane) != 0) continue;
      const std::uint64_t at = j * 8 + l * bytes;
      if (at < found) found = at;
      return;
    }
  }
};

// Note [Hashing while copying]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A streaming reload copies each parameter PWAL left as it was loaded into
// the captured storage, and hashes it after PWAL to know that PWAL left it
// so (Note [Patch landings]): two reads of the same bytes. With copy_to the
// sum kernel stores every word it loads at the same offset of the
// destination, so one read serves both; the hash is the hash of the bytes
// the copy read. A partial last word stores only the bytes that exist; a
// destination that is not 8-byte aligned is written byte by byte.
struct CopyWords {
  unsigned char* to = nullptr;
  bool aligned = false;

  __device__ __forceinline__ CopyWords(const ContentHashJob& job, int t, bool copy) {
    if (!copy) return;
    to = reinterpret_cast<unsigned char*>(job.copy_to[t]);
    aligned = (reinterpret_cast<std::uintptr_t>(to) & 7u) == 0;
  }
  // Stores word j (w) of the n bytes.
  __device__ __forceinline__ void store(std::uint64_t w, std::uint64_t j, std::uint64_t n) const {
    if (aligned && 8 * j + 8 <= n) {
      reinterpret_cast<unsigned long long*>(to)[j] = w;
      return;
    }
    const std::uint64_t k = n - 8 * j < 8 ? n - 8 * j : 8;
    for (std::uint64_t b = 0; b < k; ++b) to[8 * j + b] = static_cast<unsigned char>(w >> (8 * b));
  }
};

template <bool kScan, bool kCopy>
__global__ void __launch_bounds__(kThreads) sum_kernel(const ContentHashJob job) {
  const std::uint64_t task = blockIdx.x;
  const int t = tensor_of(job, task);
  const std::uint64_t nbytes = job.nbytes[t];
  const auto* p = reinterpret_cast<const unsigned char*>(job.data[t]);
  const std::uint64_t first = (task - job.block_begin[t]) * kBlockWords;
  const std::uint64_t nwords = s64::words_of(nbytes);
  const std::uint64_t last = nwords - first < kBlockWords ? nwords : first + kBlockWords;
  const bool aligned = (reinterpret_cast<std::uintptr_t>(p) & 7u) == 0;
  std::uint64_t s = 0;
  std::uint64_t bad = ~0ull;
  const ScanWords scan = kScan ? ScanWords(job, t) : ScanWords();
  const bool test = kScan && scan.bytes != 0;
  const CopyWords copy(job, t, kCopy);
  if (aligned && (!kCopy || copy.aligned) && first + kBlockWords <= nbytes / 8) {
    // A whole block of whole words.
    // Word j's term is mix64(w + (j + 1) * kGamma); this thread's words are
    // kThreads apart, so their keys are kThreads * kGamma apart (additions,
    // not a multiply per word).
    const auto* w = reinterpret_cast<const unsigned long long*>(p) + first + threadIdx.x;
    constexpr std::uint64_t kStep = kThreads * s64::kGamma;
    std::uint64_t key = (first + threadIdx.x + 1) * s64::kGamma;
#pragma unroll 1
    for (int c = 0; c < kPerThread; c += kUnroll, key += kUnroll * kStep) {
      std::uint64_t v[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) v[i] = __ldcs(w + kThreads * (c + i));
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) s += s64::mix64(v[i] + key + i * kStep);
      if constexpr (kCopy) {
        auto* d = reinterpret_cast<unsigned long long*>(copy.to) + first + threadIdx.x;
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) d[kThreads * (c + i)] = v[i];
      }
      if (test) {
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) scan.test(v[i], first + threadIdx.x + kThreads * (c + i), bad);
      }
    }
  } else if (aligned) {
    for (std::uint64_t j = first + threadIdx.x; j < last; j += kThreads) {
      const std::uint64_t w = s64::word_at(p, nbytes, j, StreamLoad{});
      s += s64::word_term(w, j);
      if (test) scan.test(w, j, bad);
      if constexpr (kCopy) copy.store(w, j, nbytes);
    }
  } else {
    for (std::uint64_t j = first + threadIdx.x; j < last; j += kThreads) {
      const std::uint64_t w = s64::word_at(p, nbytes, j, ByteLoad{});
      s += s64::word_term(w, j);
      if (test) scan.test(w, j, bad);
      if constexpr (kCopy) copy.store(w, j, nbytes);
    }
  }
  if (test && bad != ~0ull) atomicMin(job.first_bad + t, static_cast<unsigned long long>(bad));
  numerics::add_block_sum<kThreads>(s, job.sums + t);
}

__global__ void __launch_bounds__(kDeltaThreads) delta_kernel(const ContentHashJob job) {
  const std::uint64_t part = static_cast<std::uint64_t>(blockIdx.x) * kDeltaThreads + threadIdx.x;
  const std::uint64_t task = part / kDeltaParts;
  if (task >= job.blocks) return;
  const int t = tensor_of(job, task);
  const std::uint32_t sb = job.source_begin[t];
  const int n = static_cast<int>(job.source_begin[t + 1] - sb);
  if (n == 0) return;
  const std::uint64_t nbytes = job.nbytes[t];
  const auto* p = reinterpret_cast<const unsigned char*>(job.data[t]);
  constexpr std::uint64_t kPartBytes = kBlockWords * 8 / kDeltaParts;
  const std::uint64_t lo = (task - job.block_begin[t]) * kBlockWords * 8 + (part % kDeltaParts) * kPartBytes;
  if (lo >= nbytes) return;
  const std::uint64_t hi = nbytes - lo < kPartBytes ? nbytes : lo + kPartBytes;
  std::uint64_t d;
  if ((reinterpret_cast<std::uintptr_t>(p) & 7u) == 0) {
    s64::OverlayLoad<StreamLoad> load{StreamLoad{}, job.sources + sb, n};
    d = load.delta(p, nbytes, lo, hi);
  } else {
    s64::OverlayLoad<ByteLoad> load{ByteLoad{}, job.sources + sb, n};
    d = load.delta(p, nbytes, lo, hi);
  }
  if (d != 0) atomicAdd(job.sums + t, static_cast<unsigned long long>(d));
}

// Note [Exclusive writes]: one block per kExclusiveRangeBytes of a tensor
// and one of its exclusive sources; two threads find the writes the range
// owns (two binary searches at once), then every thread sums its share of
// their parts, each independent of the others.
constexpr int kExclusiveThreads = 256;

__global__ void __launch_bounds__(kExclusiveThreads) exclusive_kernel(const ContentHashJob job) {
  const std::uint64_t task = blockIdx.x;
  int lo = 0, hi = job.pairs - 1;  // the pair holding the task
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (job.pair_task_begin[mid] <= task) lo = mid; else hi = mid - 1;
  }
  const int t = static_cast<int>(job.pair_tensor[lo]);
  const s64::OverlaySource s = job.exclusive[lo];
  const std::uint64_t nbytes = job.nbytes[t];
  const auto* p = reinterpret_cast<const unsigned char*>(job.data[t]);
  const std::uint64_t begin = (task - job.pair_task_begin[lo]) * kExclusiveRangeBytes;
  const std::uint64_t end = nbytes - begin < kExclusiveRangeBytes ? nbytes : begin + kExclusiveRangeBytes;
  __shared__ std::uint64_t owned[2];
  if (threadIdx.x < 2) owned[threadIdx.x] = s64::owned_from(s, job.data[t], threadIdx.x == 0 ? begin : end);
  __syncthreads();
  // A thread per part (a word of a sector image: four threads read its 32
  // bytes, so a warp's loads cover whole sectors).
  const int shift = s.unit == 32 ? 2 : 0;  // parts per write: 4 for sectors, else 1
  std::uint64_t d = 0;
  for (std::uint64_t q = (owned[0] << shift) + threadIdx.x; q < owned[1] << shift; q += kExclusiveThreads)
    d += s64::exclusive_part_delta(s, q >> shift, static_cast<std::uint32_t>(q & ((1u << shift) - 1)), p, nbytes,
                                   StreamLoad{});
  numerics::add_block_sum<kExclusiveThreads>(d, job.sums + t);
}

}  // namespace

int launch_content_hash(const ContentHashJob& job, void* stream) {
  if (job.count <= 0 || job.blocks == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (job.source_begin != nullptr) {
    const std::uint64_t grid = (job.blocks * kDeltaParts + kDeltaThreads - 1) / kDeltaThreads;
    if (grid > 0x7FFFFFFFull || job.pair_tasks > 0x7FFFFFFFull) return static_cast<int>(cudaErrorInvalidConfiguration);
    if (job.walk) delta_kernel<<<static_cast<unsigned>(grid), kDeltaThreads, 0, s>>>(job);
    if (job.pairs > 0 && job.pair_tasks > 0)
      exclusive_kernel<<<static_cast<unsigned>(job.pair_tasks), kExclusiveThreads, 0, s>>>(job);
  } else {
    if (job.blocks > 0x7FFFFFFFull) return static_cast<int>(cudaErrorInvalidConfiguration);
    const unsigned grid = static_cast<unsigned>(job.blocks);
    if (job.copy_to != nullptr && job.scan_mask != nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (job.copy_to != nullptr)
      sum_kernel<false, true><<<grid, kThreads, 0, s>>>(job);
    else if (job.scan_mask != nullptr)
      sum_kernel<true, false><<<grid, kThreads, 0, s>>>(job);
    else
      sum_kernel<false, false><<<grid, kThreads, 0, s>>>(job);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gk::cuda
