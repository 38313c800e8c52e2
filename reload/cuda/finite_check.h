// reload/cuda/finite_check.h: the plain CUDA launcher behind
// gk::detail::first_non_finite (no Torch in the .cu). Internal to the
// reload layer; Note [Refusing non-finite weights] in reload/non_finite.cpp.
#pragma once

#include <cstdint>

namespace gk::cuda {

// How a floating-point element is non-finite: every exponent bit set, read
// from `bytes`-wide little-endian words. For float8_e4m3fn, which has no
// infinity, the mask 0x7F (exponent and mantissa all ones) is its NaN.
struct FiniteTask {
  const void* data = nullptr;
  std::uint64_t numel = 0;
  std::uint32_t bytes = 0;  // element size: 1, 2, 4 or 8
  std::uint64_t mask = 0;   // non-finite iff (bits & mask) == mask
};

// Tensors per launch; the task list travels as the kernel's parameter.
inline constexpr int kMaxFiniteTasks = 512;

struct FiniteBatch {
  FiniteTask task[kMaxFiniteTasks];
  int count = 0;
};
static_assert(sizeof(FiniteBatch) <= 32764, "FiniteBatch must fit CUDA's kernel parameter limit (32,764 bytes)");

// For each task i, atomically lowers first[i] (an unsigned 64-bit word on the
// device, which the caller sets to UINT64_MAX) to the index of a non-finite
// element, if any; the smallest index wins. One launch on `stream` (a
// cudaStream_t of the current device); returns the launch's cudaError_t as
// an int (0 on success).
int launch_first_non_finite(const FiniteBatch& batch, unsigned long long* first, void* stream);

}  // namespace gk::cuda
