// detail::LateFlags (Note [Verdicts read late] in late_flags.h).
#include "late_flags.h"

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gk::detail {

struct LateFlags::Ready {
#if defined(GRAPHKEEP_WITH_CUDA)
  at::cuda::CUDAEvent copied;
#endif
};

LateFlags::LateFlags(const at::Tensor& flags) {
  GK_INTERNAL_ASSERT(flags.defined() && flags.dim() == 1 && flags.scalar_type() == at::kBool,
                     "LateFlags takes a 1-D bool tensor");
  if (!flags.is_cuda()) {
    host_ = flags.contiguous();
    return;
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  host_ = at::empty(flags.sizes(), flags.options().device(at::kCPU).pinned_memory(true));
  host_.copy_(flags, /*non_blocking=*/true);
  ready_ = std::make_shared<Ready>();
  ready_->copied.record(c10::cuda::getCurrentCUDAStream(flags.device().index()));
#endif
}

LateFlags::~LateFlags() {
#if defined(GRAPHKEEP_WITH_CUDA)
  // Unread (an exception in between): the copy still writes host_.
  if (ready_ != nullptr) ready_->copied.synchronize();
#endif
}
LateFlags::LateFlags(LateFlags&&) noexcept = default;
LateFlags& LateFlags::operator=(LateFlags&& other) noexcept {
  if (this != &other) {
#if defined(GRAPHKEEP_WITH_CUDA)
    if (ready_ != nullptr) ready_->copied.synchronize();
#endif
    host_ = std::move(other.host_);
    ready_ = std::move(other.ready_);
  }
  return *this;
}

std::vector<char> LateFlags::read() {
  GK_INTERNAL_ASSERT(host_.defined(), "LateFlags::read() without flags, or twice");
#if defined(GRAPHKEEP_WITH_CUDA)
  if (ready_ != nullptr) ready_->copied.synchronize();
  ready_.reset();
#endif
  const bool* p = host_.const_data_ptr<bool>();
  std::vector<char> out(p, p + host_.numel());
  host_ = at::Tensor();
  return out;
}

}  // namespace gk::detail
