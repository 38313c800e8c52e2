// reload/cuda/merge_entries.h: the plain CUDA launcher behind the merged
// writes of a patch's entries (reload/patch_landing.cpp, Note [One scatter
// per storage]; no Torch in the .cu). Internal to the reload layer.
//
// Note [Merging entries in one launch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Entries landing in one storage become one write in the storage's flat
// coordinates: each entry's indices plus its offset in the span, its values
// after the previous entry's. Done with tensor operations per storage (a
// concatenation, a widening, a binary search per merged index, a gather, an
// add, a narrowing: eight launches and host dispatches each), it was most of
// the 8B stage's host time (docs/performance.md, "Figures behind the code").
// One launch now merges every entry of a patch on a
// device: a block per kMergeChunk elements of one entry reads its indices
// once, adds the offset, narrows or widens them to the merged width, and
// copies its values beside them.
#pragma once

#include <cstdint>

namespace gk::cuda {

// Elements one block merges at most.
inline constexpr std::int64_t kMergeChunk = 65536;

// One entry: `count` indices at `indices` (index_bytes wide) become
// indices + add at `out_indices` (out_index_bytes wide); its `count`
// values of value_bytes each are copied to `out_values`.
struct MergeEntry {
  const void* indices = nullptr;
  const void* values = nullptr;
  void* out_indices = nullptr;
  void* out_values = nullptr;
  std::int64_t count = 0;
  std::int64_t add = 0;
  std::uint32_t value_bytes = 0;      // 1, 2, 4 or 8
  std::uint16_t index_bytes = 0;      // 4 or 8
  std::uint16_t out_index_bytes = 0;  // 4 or 8
};

// One block's work: elements [first, first + kMergeChunk) of entry `entry`.
struct MergeBlock {
  std::int64_t first = 0;
  std::int64_t entry = 0;
};

// Merges every block's elements in one launch on `stream` (a cudaStream_t
// of the current device); `entries` and `blocks` are device memory. Returns
// the launch's cudaError_t as an int (0 on success).
int launch_merge_entries(const MergeEntry* entries, const MergeBlock* blocks, std::int64_t block_count, void* stream);

}  // namespace gk::cuda
