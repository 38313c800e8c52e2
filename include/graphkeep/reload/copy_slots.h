// graphkeep/reload/copy_slots.h
//
// Copy-back of many slots at once: dst[i].copy_(src[i]) for every i, with
// the CUDA pairs done in one kernel launch per device (per 1,536 chunks of
// up to 512 KiB). A reload copies hundreds to thousands of small derived
// tensors (stride arrays, scales, workspaces); one copy_ per slot is bound by
// launch latency, far below the device's copy bandwidth (docs/performance.md
// has the numbers).
//
//   std::vector<at::Tensor> dst = captured_slots, src = new_slots;
//   gk::copy_slots(dst, src);   // on the current CUDA stream
//
// Pairs that are contiguous, on one CUDA device, with the same dtype and
// size go through the batched kernel; any other pair (CPU tensors, strided
// views, dtype casts) through at::Tensor::copy_, so the result is always
// that of copy_. The task list travels as the kernel's parameter: nothing
// is allocated or uploaded, so a call is also safe inside CUDA graph capture.
//
// When the same pairs are copied again and again (a trainer that writes each
// update into fixed staging tensors), a SlotCopyPlan does the per-pair work
// once, and each run() is only the launches:
//
//   gk::SlotCopyPlan copy(captured_slots, staging);  // checks every pair once
//   for (;;) { receive_update(staging); copy.run(); }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace gk {

// Raises gk::StateError when the two lists differ in length.
void copy_slots(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src);

// dst[i].copy_(src[i]) for fixed pairs, prepared once. Every pair must be
// batchable (contiguous, same dtype and size, all on one CUDA device) or, in
// a build without CUDA or for CPU pairs, is copied with copy_. The plan keeps
// every pair's storage alive, so its addresses stay valid; re-pointing one of
// the tensors with set_data afterwards is not seen by the plan.
class SlotCopyPlan {
 public:
  // Raises gk::StateError for lists of different lengths, and for a CUDA
  // pair that cannot be batched (naming the pair's index and the reason).
  SlotCopyPlan(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src);
  ~SlotCopyPlan();
  SlotCopyPlan(SlotCopyPlan&&) noexcept;
  SlotCopyPlan& operator=(SlotCopyPlan&&) noexcept;

  // Copies every pair, on the current stream of the pairs' device.
  void run() const;

  std::size_t pairs() const noexcept;
  std::size_t bytes() const noexcept;
  std::size_t launches() const noexcept;  // kernel launches per run()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gk
