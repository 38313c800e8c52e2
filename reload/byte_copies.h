// reload/byte_copies.h: many device-to-device byte copies on one CUDA
// stream, launched as few batched-copy kernels. Internal to the reload layer.
//
// gk::copy_slots (whole tensors, the copy-back) and the batched default
// loads (reload/batched_loads.h: slices of a freshly materialized
// parameter) both reduce their work to (source, destination, bytes) ranges
// on one device. ByteCopies cuts each range into tasks of at most
// cuda::kCopyChunk bytes, fills a CopyBatch and launches it on the device's
// current stream when it is full, when the device changes, and at flush():
//
//   gk::detail::ByteCopies copies;
//   copies.add(device, src_bytes, dst_bytes, n);  // nothing launched yet
//   copies.flush();                               // the launches, in the order added
//
// The kernel reads the ranges when it runs: the caller keeps every source
// and destination alive until then, as for copy_ (a tensor freed meanwhile
// is reused by the caching allocator only in stream order). Destroying a
// ByteCopies launches nothing: what was added and not flushed is dropped.
#pragma once

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/core/Device.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <memory>

namespace gk::cuda {
struct CopyBatch;
}

namespace gk::detail {

class ByteCopies {
 public:
  ByteCopies();
  ~ByteCopies();
  ByteCopies(const ByteCopies&) = delete;
  ByteCopies& operator=(const ByteCopies&) = delete;

  // Queues the copy of bytes [src, src + n) to [dst, dst + n), both on
  // `device` (a CUDA device); the ranges must not overlap.
  void add(c10::Device device, const void* src, void* dst, std::uint64_t n);
  // Launches what is queued, on the current stream of its device.
  void flush();

 private:
  std::unique_ptr<cuda::CopyBatch> batch_;  // 30 KiB, off the caller's stack; made by the first add()
  c10::Device device_{c10::kCUDA, -1};
  c10::cuda::OptionalCUDAGuard guard_;  // restores the caller's device on destruction
};

}  // namespace gk::detail
#endif  // GRAPHKEEP_WITH_CUDA
