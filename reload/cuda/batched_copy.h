// reload/cuda/batched_copy.h: the plain CUDA launcher behind gk::copy_slots
// (no Torch in the .cu). Internal to the reload layer.
#pragma once

#include <cstdint>

namespace gk::cuda {

// One contiguous byte range to copy. Tasks are at most kCopyChunk bytes, so
// that one block per task balances large and small slots.
struct CopyTask {
  const unsigned char* src;
  unsigned char* dst;
  std::uint64_t bytes;
};
inline constexpr std::uint64_t kCopyChunk = 64 * 1024;

// Copies every task (an array of `count` tasks in device memory) in one
// launch on `stream` (a cudaStream_t). Returns the launch's cudaError_t as an
// int (0 on success).
int launch_batched_copy(const CopyTask* tasks, std::int64_t count, void* stream);

}  // namespace gk::cuda
