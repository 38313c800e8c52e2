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
#pragma once

#include <cstdint>

namespace gk::cuda {

// Elements one block writes at most (256 threads, 64 elements each).
inline constexpr std::uint32_t kScatterChunk = 16384;

// Tasks per launch: 32 bytes each, within the 32,764-byte parameter limit.
inline constexpr int kMaxScatterTasks = 1000;

struct ScatterTask {
  void* dst = nullptr;            // the tensor's first element (a flat view)
  const void* indices = nullptr;  // this task's first index
  const void* values = nullptr;   // this task's first value
  std::uint32_t count = 0;        // elements in this task
  std::uint16_t elem_bytes = 0;   // 1, 2, 4 or 8
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

}  // namespace gk::cuda
