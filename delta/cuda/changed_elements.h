// delta/cuda/changed_elements.h: the changed elements of many tensors in
// two kernel launches (internal to the delta layer; no torch here, so nvcc
// compiles it without PyTorch's headers). delta/changed_elements.cpp drives
// it; Note [Changed elements on the device] there says why.
#pragma once

#include <cstdint>

namespace gk::cuda {

// Elements one task (block) compares at most.
inline constexpr std::int64_t kDiffTaskElements = std::int64_t{1} << 16;

// One pair of tensors to compare, bit for bit, and where its changes go.
struct DiffPair {
  const void* base = nullptr;    // contiguous, elem_bytes each
  const void* target = nullptr;  // contiguous, as many elements
  void* indices = nullptr;       // collect: the changed elements' positions (null: not collected)
  void* values = nullptr;        // collect: their target values
  std::uint16_t elem_bytes = 0;  // 1, 2, 4 or 8
  std::uint16_t index_bytes = 0; // 4 (int32) or 8 (int64)
};

// A run of one pair's elements.
struct DiffTask {
  std::int64_t begin = 0;  // elements [begin, begin + count)
  std::uint32_t pair = 0;
  std::uint32_t count = 0;  // at most kDiffTaskElements
};

// counts: one int32 per task, the elements whose bits differ. sums (zeroed,
// two per pair: base, target): the sums of the word terms of the content
// hash "gk-sum64 v1" over each pair's bytes (graphkeep/hashing/sum64.h; the
// hash adds the length term), read in the same pass. Returns the launch's
// cudaError_t as an int (0: launched); nothing runs for no tasks.
int launch_diff_count(const DiffPair* pairs, const DiffTask* tasks, int task_count, std::int32_t* counts,
                      unsigned long long* sums, void* stream);

// For every task whose pair has `indices`: writes each changed element's
// position and target value at the pair's output slot[task] onwards, in
// ascending order (slot: the changes of the pair's earlier tasks).
int launch_diff_collect(const DiffPair* pairs, const DiffTask* tasks, int task_count, const std::int64_t* slot,
                        void* stream);

}  // namespace gk::cuda
