// hashing/device_hashes.h: the pieces content_hash.cpp and overlaid_hash.cpp
// share (internal to the hashing layer): the checks, the host function, and
// one device's launch of the hash kernel with its read-back.
#pragma once

#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/hashing/hash_and_scan.h>
#include <graphkeep/hashing/overlay_load.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gk::detail {

// Words per block, the unit of parallel work on the host and on a device:
// 64 KiB of input.
inline constexpr std::uint64_t kBlockWords = 8192;
// Blocks per parallel_for grain on the host: 1 MiB of input.
inline constexpr std::int64_t kHostGrainBlocks = 16;

// The sum, modulo 2^64, of words(first, last) over the blocks of the words
// of n bytes, the blocks in parallel on the host (one block: inline, with
// nothing allocated; a patch's targets are mostly that small at MoE scale).
template <class Words>
std::uint64_t sum_blocks(std::size_t n, const Words& words) {
  const std::uint64_t nwords = sum64::words_of(n);
  if (nwords <= kBlockWords) return nwords == 0 ? 0 : words(std::uint64_t{0}, nwords);
  const auto blocks = static_cast<std::int64_t>((nwords + kBlockWords - 1) / kBlockWords);
  std::vector<std::uint64_t> partial(static_cast<std::size_t>(blocks));
  at::parallel_for(0, blocks, kHostGrainBlocks, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const std::uint64_t first = static_cast<std::uint64_t>(i) * kBlockWords;
      partial[static_cast<std::size_t>(i)] = words(first, std::min(nwords, first + kBlockWords));
    }
  });
  std::uint64_t s = 0;
  for (const std::uint64_t v : partial) s += v;  // modulo 2^64: the order does not matter
  return s;
}

// The content hash of n bytes at p, on the host (parallel over blocks).
std::uint64_t host_hash(const std::byte* p, std::size_t n);

// The tensor's bytes may be hashed as they lie (Note [Content hash:
// gk-sum64 v1]); gk::WeightError naming position `index` otherwise.
void check_hashable(const at::Tensor& t, std::size_t index);

// What a kernel launch hashes of one input: n bytes at p.
struct HashBytes {
  const std::byte* p = nullptr;
  std::size_t n = 0;
};
// The whole tensor's bytes (checked by check_hashable).
HashBytes bytes_of(const at::Tensor& t);
// The range's bytes (checked by hash_host_ranges).
HashBytes bytes_of(const ContentRange& r);

// Checks every range (check_hashable, and the bounds), hashes the CPU ones
// into out; returns the non-empty CUDA ranges' positions per device.
std::map<c10::DeviceIndex, std::vector<std::size_t>> hash_host_ranges(const std::vector<ContentRange>& ranges,
                                                                      std::vector<std::uint64_t>& out);

#if defined(GRAPHKEEP_WITH_CUDA)
// Note [One pinned block per hash launch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A hash launch uploads its job (pointers, lengths, block starts) and reads
// its sums back. Each used to take a pinned tensor of its own and a
// Tensor::copy_ (a dispatch, a narrow, the host allocator's event): host
// time paid at each of two launches per decoder layer (measured in a trace
// of the MoE's streaming reload: docs/performance.md, "Figures behind the
// code"). Now one pinned block
// holds the job and, behind it, the words that come back, each moved by a
// plain cudaMemcpyAsync on the launch's stream. The host allocator records
// no event for such copies, so the block must not be freed while the
// stream may still write it: the launch's event (ReadEvent, recorded after
// the read-back) is waited for when the launch is destroyed, before its
// buffers are, on every path, an exception's included.
struct ReadEvent : at::cuda::CUDAEvent {
  using at::cuda::CUDAEvent::CUDAEvent;
  ReadEvent(ReadEvent&&) noexcept = default;
  ReadEvent& operator=(ReadEvent&&) noexcept = default;
  ~ReadEvent() {
    if (isCreated()) (void)cudaEventSynchronize(event());  // (no throw from a destructor)
  }
};

// One device's launch: the pinned block (the job, then what comes back),
// the device words whose tail receives the kernel's sums, the stream, and
// what each sum is added to.
struct DeviceLaunch {
  std::vector<std::size_t> which;
  std::vector<std::uint64_t> add;
  at::Tensor host, dev;
  c10::cuda::CUDAStream stream;
  const std::uint64_t* result = nullptr;  // in `host`: the sums (then the first bad bytes), copied after the kernel
  ReadEvent read;                         // recorded after that copy; destroyed first (declared last but one)
  bool scanned = false;                   // launched with `tests`
};

// Hashes the inputs `which` (all on `device`, all non-empty) in one launch
// on `stream` (a stream of `device`): whole, or, when `sources` is given
// (indexed like `inputs`), each as it will be after its writes
// (*sources)[w], from its hash now (*before)[w] and the words the writes
// cover (Note [Hashing through the writes]); or, with `tests` (indexed like
// `inputs`; whole hashes only), each also tested element by element (Note
// [Scanning while summing]); with `exclusive` (indexed like `inputs`, beside
// `sources`), each input's exclusive sources too, summed write by write
// (Note [Exclusive writes] in overlay_load.h); or, with `copy_to` (indexed
// like `inputs`; whole hashes only, no tests), each also copied to
// (*copy_to)[w] as it is read (Note [Hashing while copying] in
// cuda/content_hash.cu); read_device_hashes collects them.
DeviceLaunch launch_device_hashes(const std::vector<HashBytes>& inputs, std::vector<std::size_t> which,
                                  c10::Device device, c10::cuda::CUDAStream stream,
                                  const std::vector<std::vector<sum64::OverlaySource>>* sources = nullptr,
                                  const std::vector<std::uint64_t>* before = nullptr,
                                  const std::vector<ExponentTest>* tests = nullptr,
                                  const std::vector<std::vector<sum64::OverlaySource>>* exclusive = nullptr,
                                  const std::vector<std::byte*>* copy_to = nullptr);

// Whether every launch's hashes are back (asks their events; never blocks).
inline bool all_read(const std::vector<DeviceLaunch>& launches) {
  return std::all_of(launches.begin(), launches.end(), [](const DeviceLaunch& l) { return l.read.query(); });
}

// Waits for the launch's hashes and writes them into out[which[i]]; for a
// launch with tests, the byte offset of each input's first bad element (-1:
// none) into (*first_bad)[which[i]].
void read_device_hashes(DeviceLaunch& l, std::vector<std::uint64_t>& out,
                        std::vector<std::int64_t>* first_bad = nullptr);
#endif

}  // namespace gk::detail
