// reload/cuda/batched_copy.h: the plain CUDA launcher behind gk::copy_slots
// (no Torch in the .cu). Internal to the reload layer.
//
// Note [Copy tasks travel as kernel parameters]
// A reload copies back tens of slots per layer, each a few KiB to a few MiB.
// The first version of gk::copy_slots uploaded a task list per call (a pinned
// allocation, a host-to-device copy, then the kernel): for small layers that
// upload cost more than the copy itself. Since CUDA 12.1 a kernel takes up to
// 32,764 bytes of parameters (Volta and newer; graphkeep builds for sm_75+),
// so a CopyBatch of kMaxTasks tasks is passed by value: one launch per batch,
// nothing allocated, nothing to keep alive until the stream has run, and the
// launch can be captured into a CUDA graph like any other.
#pragma once

#include <cstdint>

namespace gk::cuda {

// Bytes one block copies at most; larger slots are split into tasks of this
// size so that one block per task balances large and small slots. (64 KiB
// until 2026-12-06: a 1.2 GiB MoE layer then took 12 launches of a 32 KiB
// parameter each, each launch paying host time (docs/performance.md,
// "Figures behind the code"); 512 KiB tasks are still over a thousand
// blocks for such a layer.)
inline constexpr std::uint64_t kCopyChunk = 512 * 1024;

// Tasks per launch: 20 bytes each, within the 32,764-byte parameter limit.
inline constexpr int kMaxTasks = 1536;

// Note [Small batches travel small]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The driver copies a launch's parameters into its command buffer, so a
// launch's host time grows with its parameter's size: a whole CopyBatch
// (30 KiB) costs clearly more than a small one (measured in a trace of the
// MoE's streaming reload: docs/performance.md, "Figures behind the code").
// Most launches of a reload carry a few tasks (a layer's norms, its
// attention's slots), so a batch of at most kSmallTasks tasks is launched
// with only those (1.3 KiB); the kernel is the same, instantiated for each.
inline constexpr int kSmallTasks = 64;

struct CopyBatch {
  const unsigned char* src[kMaxTasks];
  unsigned char* dst[kMaxTasks];
  std::uint32_t bytes[kMaxTasks];
  int count = 0;

  bool full() const noexcept { return count == kMaxTasks; }
  void add(const unsigned char* s, unsigned char* d, std::uint32_t n) noexcept {
    src[count] = s;
    dst[count] = d;
    bytes[count] = n;
    ++count;
  }
};
static_assert(sizeof(CopyBatch) <= 32764, "CopyBatch must fit CUDA's kernel parameter limit (32,764 bytes)");

// Copies every task of `batch` in one launch on `stream` (a cudaStream_t of
// the current device). Returns the launch's cudaError_t as an int (0 on
// success). An empty batch launches nothing.
int launch_batched_copy(const CopyBatch& batch, void* stream);

}  // namespace gk::cuda
