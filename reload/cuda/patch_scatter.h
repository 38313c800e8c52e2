// reload/cuda/patch_scatter.h: the plain CUDA launcher behind the commit of a
// weight patch (reload/patch_scatter.cpp; no Torch in the .cu). Internal to
// the reload layer.
//
// Note [Scatter tasks]
// ~~~~~~~~~~~~~~~~~~~~
// A patch's commit writes `values[i]` to `dst[indices[i]]` for every changed
// element of every touched tensor, and nothing else: at 1% density a bf16
// model's commit reads 6 bytes per changed element (an int32 index and the
// value) and writes the 2 bytes, where a full copy reads and writes every
// byte. Entries are split into tasks of at most kScatterChunk elements, one
// block each, and the task list travels by value as the kernel's parameter
// (as in Note [Copy tasks travel as kernel parameters]): one launch per
// kMaxScatterTasks tasks, nothing allocated, nothing uploaded. Indices are
// int32 or int64 as the patch stores them (never widened on the host);
// elements are moved as integers of their size (1, 2, 4 or 8 bytes), so
// every bit pattern (NaN payloads, -0.0) lands as it is. The indices were
// checked in range and unique at staging (gk::validate_patch), so no two
// threads write one element and no write leaves its tensor.
//
// Note [Sector images]
// ~~~~~~~~~~~~~~~~~~~~
// A 2-byte store to a random place is a partial write of a 32-byte sector:
// the L2 keeps the bytes it was given and the memory controller reads the
// sector back before it writes it. At 1% density a bf16 patch touches 15%
// of a model's sectors (1 - 0.99^16) with 1.07 changed elements each, so
// what the commit costs is sectors, not elements. A task of 32-byte
// "elements" (elem_bytes 32) writes whole sectors instead: indices number
// the 32-byte sectors of a 32-byte-aligned region, values are the sectors'
// complete new images (made at staging from the served bytes and the
// patch: ScatterItem::sectors in reload/patch_scatter.h), and two adjacent
// threads write the two 16-byte halves of a sector, so each warp store
// covers whole sectors and nothing is read back: the pause shrinks with
// the sectors the device no longer reads back (bench/scatter_probe.cu;
// the figures are in docs/performance.md, "Figures behind the code"). The
// price is staging memory: 36 bytes per touched sector instead of 6 per
// changed bf16 element.
#pragma once

#include <cstdint>

namespace gk::cuda {

// Elements one block writes at most (256 threads, 64 elements each).
inline constexpr std::uint32_t kScatterChunk = 16384;
// Sectors one block writes at most (Note [Sector images]; 256 threads, 32 halves each).
inline constexpr std::uint32_t kSectorChunk = 4096;
// The bytes of a sector, the unit of a sector task.
inline constexpr std::uint16_t kSectorBytes = 32;

// Tasks per launch: 32 bytes each, within the 32,764-byte parameter limit.
inline constexpr int kMaxScatterTasks = 1000;

struct ScatterTask {
  void* dst = nullptr;            // the tensor's first element (a flat view); sectors: 32-byte aligned
  const void* indices = nullptr;  // this task's first index
  const void* values = nullptr;   // this task's first value
  std::uint32_t count = 0;        // elements in this task
  std::uint16_t elem_bytes = 0;   // 1, 2, 4 or 8; 32: whole sectors (Note [Sector images])
  std::uint16_t index_bytes = 0;  // 4 (int32) or 8 (int64)
};

struct ScatterBatch {
  ScatterTask task[kMaxScatterTasks];
  int count = 0;

  bool full() const noexcept { return count == kMaxScatterTasks; }
};
static_assert(sizeof(ScatterBatch) <= 32764, "ScatterBatch must fit CUDA's kernel parameter limit (32,764 bytes)");

// Runs every task of `batch` in one launch on `stream` (a cudaStream_t of
// the current device). Returns the launch's cudaError_t as an int (0 on
// success). An empty batch launches nothing.
int launch_patch_scatter(const ScatterBatch& batch, void* stream);

// The reverse of every task of `batch` (elements only, not sectors):
// values[i] = dst[indices[i]], `values` written; one launch on `stream`.
int launch_patch_gather(const ScatterBatch& batch, void* stream);

}  // namespace gk::cuda
