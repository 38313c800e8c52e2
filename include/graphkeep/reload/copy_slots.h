// graphkeep/reload/copy_slots.h
//
// Copy-back of many slots at once: dst[i].copy_(src[i]) for every i, with
// the CUDA pairs done in one kernel launch per device (per 1,536 chunks of
// up to 64 KiB). A reload copies hundreds to
// thousands of small derived tensors (stride arrays, scales, workspaces);
// one copy_ per slot is bound by launch latency, far below the device's copy
// bandwidth (docs/performance.md has the numbers).
//
//   std::vector<at::Tensor> dst = captured_slots, src = new_slots;
//   gk::copy_slots(dst, src);   // on the current CUDA stream
//
// Pairs that are contiguous, on one CUDA device, with the same dtype and
// size go through the batched kernel; any other pair (CPU tensors, strided
// views, dtype casts) through at::Tensor::copy_, so the result is always
// that of copy_. The task list travels as the kernel's parameter: nothing
// is allocated or uploaded, so a call is also safe inside CUDA graph capture.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace gk {

// Raises gk::StateError when the two lists differ in length.
void copy_slots(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src);

}  // namespace gk
