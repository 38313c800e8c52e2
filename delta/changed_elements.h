// delta/changed_elements.h: which elements of many tensor pairs on one CUDA
// device differ, bit for bit, with one synchronization for all of them
// (internal to the delta layer; make_patch's device path). Only in builds
// with CUDA.
//
//   ChangedElements diff(device, pairs);        // counts and hashes, one synchronization
//   for (k ...) if (diff.count(k) > 0) diff.collect(k, indices_k, values_k);
//   diff.run();                                  // writes them, one launch
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace gk::detail {

class ChangedElements {
 public:
  // Counts the elements whose bits differ in each pair (base, target):
  // contiguous, same dtype and size, all on `device`. Synchronizes once.
  ChangedElements(c10::Device device, const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs);

  // The changed elements of pair k.
  std::int64_t count(std::size_t k) const { return counts_[k]; }

  // The content hashes ("gk-sum64 v1") of pair k's base and target, read in
  // the same pass as the count.
  std::pair<std::uint64_t, std::uint64_t> hashes(std::size_t k) const { return hashes_[k]; }

  // Asks for pair k's changes: `indices` (int32 or int64) and `values` (the
  // pair's dtype), count(k) elements each, on the device, ascending.
  void collect(std::size_t k, const at::Tensor& indices, const at::Tensor& values);

  // Writes every change asked for, in one launch on the device's current
  // stream; does not wait for it.
  void run();

 private:
  c10::Device device_;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs_;
  std::vector<std::int64_t> counts_;       // per pair
  std::vector<std::pair<std::uint64_t, std::uint64_t>> hashes_;  // per pair: base, target
  std::vector<std::int32_t> task_counts_;  // per task
  std::vector<std::int64_t> first_task_;   // per pair, and one past the last
  std::vector<std::pair<at::Tensor, at::Tensor>> out_;  // per pair: indices, values (undefined: not asked)
};

}  // namespace gk::detail
