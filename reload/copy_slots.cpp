#include <graphkeep/check.h>
#include <graphkeep/reload/copy_slots.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "reload/cuda/batched_copy.h"
#endif

namespace gk {

namespace {

#if defined(GRAPHKEEP_WITH_CUDA)
bool batchable(const at::Tensor& d, const at::Tensor& s) {
  return d.is_cuda() && d.device() == s.device() && d.scalar_type() == s.scalar_type() && d.numel() == s.numel() &&
         d.is_contiguous() && s.is_contiguous() && !d.is_same(s);
}

// Collects the batchable pairs of one device into CopyBatch launches on that
// device's current stream (Note [Copy tasks travel as kernel parameters]).
class Launcher {
 public:
  void add(const at::Tensor& d, const at::Tensor& s) {
    if (d.device() != device_) {
      flush();
      device_ = d.device();
      guard_.set_device(device_);
      stream_ = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    }
    const auto* from = static_cast<const unsigned char*>(s.const_data_ptr());
    auto* to = static_cast<unsigned char*>(d.mutable_data_ptr());
    const auto total = static_cast<std::uint64_t>(d.nbytes());
    for (std::uint64_t o = 0; o < total; o += cuda::kCopyChunk) {
      if (batch_.full()) flush();
      batch_.add(from + o, to + o, static_cast<std::uint32_t>(std::min(cuda::kCopyChunk, total - o)));
    }
  }

  void flush() {
    if (batch_.count == 0) return;
    const int err = cuda::launch_batched_copy(batch_, stream_);
    batch_.count = 0;
    GK_CHECK(StateError, err == 0, "graphkeep: the batched slot copy failed to launch on ", device_,
             " (cudaError ", err, ")");
  }

 private:
  cuda::CopyBatch batch_;
  c10::Device device_{c10::kCUDA, -1};
  c10::cuda::OptionalCUDAGuard guard_;  // restores the caller's device on return
  void* stream_ = nullptr;
};
#endif

}  // namespace

void copy_slots(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  GK_CHECK(StateError, dst.size() == src.size(), "gk::copy_slots: ", dst.size(), " destinations but ", src.size(),
           " sources");
#if defined(GRAPHKEEP_WITH_CUDA)
  Launcher launcher;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    if (batchable(dst[i], src[i])) {
      launcher.add(dst[i], src[i]);
    } else {
      launcher.flush();  // keep copy_'s order among pairs that overlap
      dst[i].copy_(src[i]);
    }
  }
  launcher.flush();
#else
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
#endif
}

}  // namespace gk
