// hashing/cuda/content_hash_launch.h: the plain CUDA launcher behind
// gk::content_hashes and gk::overlaid_content_hashes on a CUDA device (no
// Torch in the .cu). Internal to the hashing layer; hashing/content_hash.cpp
// builds the job.
#pragma once

#include <graphkeep/hashing/overlay_load.h>

#include <cstdint>

namespace gk::cuda {

// One launch sums, for `count` non-empty tensors of one device, the word
// terms of Note [Content hash: gk-sum64 v1] (content_hash.h) into sums[t]:
// every word's term, or, with `sources`, the change the writes make to the
// terms of the words they cover. Every pointer is device memory of that
// device; the caller allocates and fills the inputs, zeroes `sums`, and
// keeps it all alive until the stream has run.
// The bytes of a tensor one thread block of the exclusive kernel owns.
inline constexpr std::uint64_t kExclusiveRangeBytes = std::uint64_t{1} << 20;

struct ContentHashJob {
  const std::uint64_t* data = nullptr;         // [count] address of each tensor's first byte
  const std::uint64_t* nbytes = nullptr;       // [count] its byte length (> 0)
  const std::uint64_t* block_begin = nullptr;  // [count + 1] its first 64 KiB block among all blocks
  unsigned long long* sums = nullptr;          // [count] zeroed: the sums, modulo 2^64
  int count = 0;
  std::uint64_t blocks = 0;  // block_begin[count]
  // Optional (gk::overlaid_content_hashes): tensor t's writes are
  // sources[source_begin[t] .. source_begin[t + 1]) (at most
  // kMaxOverlaySources of them); null: the whole hash's terms.
  const gk::detail::sum64::OverlaySource* sources = nullptr;
  const std::uint32_t* source_begin = nullptr;  // [count + 1]
  bool walk = true;  // false: no tensor has a source to walk (only exclusive ones below)
  // Optional, with `sources`: exclusive sources (Note [Exclusive writes] in
  // overlay_load.h), summed write by write by a second kernel. Pair i is
  // source exclusive[i] over tensor pair_tensor[i], in tasks
  // pair_task_begin[i] .. pair_task_begin[i + 1), each owning
  // kExclusiveRangeBytes of the tensor.
  const gk::detail::sum64::OverlaySource* exclusive = nullptr;  // [pairs]
  const std::uint64_t* pair_tensor = nullptr;                    // [pairs]
  const std::uint64_t* pair_task_begin = nullptr;                // [pairs + 1]
  int pairs = 0;
  std::uint64_t pair_tasks = 0;  // pair_task_begin[pairs]
  // Optional (gk::detail::hash_and_scan; whole hashes only): tensor t's
  // elements are `scan_bytes[t]`-wide words (1, 2, 4 or 8; 0: not tested),
  // bad where (word & mask) == mask for the mask repeated in every lane of
  // scan_mask[t]; first_bad[t] (set to ~0 by the caller) is lowered to the
  // byte offset of the first bad element.
  const std::uint64_t* scan_mask = nullptr;   // [count]
  const std::uint64_t* scan_bytes = nullptr;  // [count]
  unsigned long long* first_bad = nullptr;    // [count]
  // Optional (gk::detail::CopiedHashes; whole hashes only): tensor t's bytes
  // are also stored, as they are read, at copy_to[t] (device memory of the
  // same device, nbytes[t] long, overlapping no input): Note [Hashing while
  // copying] in content_hash.cu.
  const std::uint64_t* copy_to = nullptr;     // [count]
};

// Launches the content hash kernel on `stream` (a cudaStream_t of the current
// device). Returns the launch's cudaError_t as an int (0 on success); a job
// without blocks launches nothing.
int launch_content_hash(const ContentHashJob& job, void* stream);

}  // namespace gk::cuda
