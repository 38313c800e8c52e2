// reload/cuda/sector_images.h: the sector images of a whole patch in two
// kernel launches (internal to the reload layer; no torch here, so nvcc
// compiles it without PyTorch's headers). reload/sector_images.cpp drives it.
//
// Note [Sector images on the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A sector image (Note [Sector images] in patch_scatter.h) is the served
// 32 bytes of a touched sector with the patch's new elements written over
// them. Made with tensor operations, the images cost about twenty launches
// per patched tensor, a caching-allocator round trip per temporary and a
// gather far below the memory's speed: most of a patch's stage (the traced
// figures are in docs/performance.md, "Figures behind the code").
//
// Here every item of a device is one row of a table, cut into tasks of at
// most kSectorTaskEntries entries (one block each), and the whole patch
// takes two launches with one read back between them:
//   count  each task counts its entries below the whole sectors, its
//          entries inside them, and the sectors whose first changed entry
//          it holds (ballot and popc: the flags are bits);
//   (host) one copy of the counts to the host, the only synchronization:
//          each task's first output slot is a prefix sum there, and so is
//          each item's split into element writes and sector writes;
//   fill   each task ranks its sector-opening entries in order (a block
//          scan of the same bits) and the entry that opens a sector reads
//          the served 32 bytes, writes every later entry of the same
//          sector over them (at most 32 / element size entries, sorted,
//          possibly in the next task) and stores the image at its rank.
// Entries outside the whole sectors are a prefix and a suffix of an
// item's ascending indices, so they stay element writes over slices of
// the patch's own tensors: nothing is copied for them.
#pragma once

#include <cstdint>

namespace gk::cuda {

// Entries one task (block) handles at most.
inline constexpr std::int64_t kSectorTaskEntries = 4096;

// One item: a flat destination's changed elements.
struct SectorItem {
  unsigned char* whole = nullptr;  // the first whole sector (32-byte aligned)
  const void* indices = nullptr;   // ascending element indices of the destination
  const void* values = nullptr;    // one value per index, elem_bytes each
  std::int64_t count = 0;          // entries (indices and values)
  std::int64_t first = 0;          // the element index at `whole`
  std::int64_t sectors = 0;        // whole sectors from `whole` on (< 2^31)
  std::uint32_t per = 0;           // elements per sector: 32 / elem_bytes
  std::uint16_t elem_bytes = 0;    // 1, 2, 4 or 8
  std::uint16_t index_bytes = 0;   // 4 or 8
};

// A run of one item's entries.
struct SectorTask {
  std::int64_t begin = 0;  // the item's entries [begin, begin + count)
  std::uint32_t item = 0;
  std::uint32_t count = 0;  // at most kSectorTaskEntries
};

// What `count` writes per task (counts[3 t + k]).
enum SectorCount : int { kBelow = 0, kInside = 1, kOpened = 2 };

// counts: 3 int32 per task, written. Returns the launch's cudaError_t as an
// int (0: launched). Nothing is launched for no tasks.
int launch_sector_count(const SectorItem* items, const SectorTask* tasks, int task_count, std::int32_t* counts,
                        void* stream);

// slot: each task's first image slot (the prefix sum of its predecessors'
// kOpened counts). sector_ids: one int32 per image (the sector's number
// from its item's `whole`); images: 32 bytes each.
int launch_sector_fill(const SectorItem* items, const SectorTask* tasks, int task_count, const std::int64_t* slot,
                       std::int32_t* sector_ids, void* images, void* stream);

}  // namespace gk::cuda
