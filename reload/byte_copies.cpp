#include "byte_copies.h"

#if defined(GRAPHKEEP_WITH_CUDA)
#include <graphkeep/core/check.h>

#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "cuda/batched_copy.h"

namespace gk::detail {

ByteCopies::ByteCopies() = default;
ByteCopies::~ByteCopies() = default;

void ByteCopies::add(c10::Device device, const void* src, void* dst, std::uint64_t n) {
  if (device != device_) {
    flush();
    device_ = device;
    guard_.set_device(device_);
  }
  // Made at the first copy, its arrays left unset (only the first `count`
  // entries are read): a ByteCopies that copies nothing (a CPU model's
  // loads) costs nothing, and one that does skips zeroing 30 KiB.
  if (!batch_) batch_ = std::make_unique_for_overwrite<cuda::CopyBatch>();
  const auto* from = static_cast<const unsigned char*>(src);
  auto* to = static_cast<unsigned char*>(dst);
  for (std::uint64_t o = 0; o < n; o += cuda::kCopyChunk) {
    if (batch_->full()) flush();
    batch_->add(from + o, to + o, static_cast<std::uint32_t>(std::min(cuda::kCopyChunk, n - o)));
  }
}

void ByteCopies::flush() {
  if (!batch_ || batch_->count == 0) return;
  const int err = cuda::launch_batched_copy(*batch_, c10::cuda::getCurrentCUDAStream(device_.index()).stream());
  batch_->count = 0;
  GK_CHECK(StateError, err == 0, "the batched copy failed to launch on ", device_, " (cudaError ", err, ")");
}

}  // namespace gk::detail
#endif  // GRAPHKEEP_WITH_CUDA
