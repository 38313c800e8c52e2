// reload/non_finite.h: finding non-finite values in floating-point weights
// (internal to the reload layer; Note [Refusing non-finite weights]).
#pragma once

#include <graphkeep/hashing/hash_and_scan.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace gk::detail {

// Element width and the exponent mask that marks a non-finite value of a
// dtype; width 0 for dtypes without one (integers, bool) or that need a
// general check (complex, and float dtypes not listed).
ExponentTest exponent_test(at::ScalarType t);

// For each tensor, the flat index of its first NaN or infinity, or -1 when
// it has none (and for tensors that are not floating point). One read of
// the bytes: CUDA tensors through one kernel launch per batch of tensors on
// the current stream and one synchronization for all of them, CPU tensors
// through at::parallel_for.
std::vector<std::int64_t> first_non_finite(const std::vector<at::Tensor>& tensors);

// first_non_finite() in two halves: the constructor checks the CPU tensors
// and launches the scan of the CUDA ones (on side streams, after what the
// caller's stream has enqueued so far), wait() blocks for their answers.
// Work the caller enqueues in between is not waited for (Note [The check
// on a side stream] in non_finite.cpp): a streaming reload enqueues the
// previous layer's copy-back there.
class FiniteScan {
 public:
  explicit FiniteScan(const std::vector<at::Tensor>& tensors);
  ~FiniteScan();
  FiniteScan(const FiniteScan&) = delete;
  FiniteScan& operator=(const FiniteScan&) = delete;
  std::vector<std::int64_t> wait();

 private:
  struct Launched;
  std::vector<std::int64_t> first_;
  std::unique_ptr<Launched> launched_;
};

}  // namespace gk::detail
