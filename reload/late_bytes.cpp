#include "late_bytes.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace gk::detail {

struct LateBytes::Ready {
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<at::cuda::CUDAEvent> copied;  // one per device copied from
  bool waited = false;
#endif
};

LateBytes::LateBytes(const std::vector<at::Tensor>& tensors) {
  offsets_.reserve(tensors.size() + 1);
  offsets_.push_back(0);
  bool any_cuda = false;
  for (const at::Tensor& t : tensors) {
    GK_INTERNAL_ASSERT(t.defined(), "LateBytes: an undefined tensor");
    offsets_.push_back(offsets_.back() + t.nbytes());
    any_cuda = any_cuda || t.is_cuda();
  }
  const auto total = static_cast<std::int64_t>(offsets_.back());
  at::TensorOptions opts = at::TensorOptions().dtype(at::kByte);
  if (any_cuda) opts = opts.pinned_memory(true);
  host_ = at::empty({std::max<std::int64_t>(total, 1)}, opts);
  auto* base = static_cast<std::byte*>(host_.mutable_data_ptr());
#if defined(GRAPHKEEP_WITH_CUDA)
  if (any_cuda) ready_ = std::make_shared<Ready>();
  std::vector<c10::DeviceIndex> devices;
#endif
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor t = tensors[i].is_contiguous() ? tensors[i] : tensors[i].contiguous();
    const std::size_t n = offsets_[i + 1] - offsets_[i];
    if (n == 0) continue;
    if (!t.is_cuda()) {
      std::memcpy(base + offsets_[i], t.const_data_ptr(), n);
      continue;
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    const c10::DeviceIndex d = t.device().index();
    const c10::cuda::CUDAGuard guard(d);
    const cudaError_t err = cudaMemcpyAsync(base + offsets_[i], t.const_data_ptr(), n, cudaMemcpyDeviceToHost,
                                            c10::cuda::getCurrentCUDAStream(d).stream());
    GK_CHECK(StateError, err == cudaSuccess, "copying ", n, " bytes of a ", t.sizes(), " tensor from ", t.device(),
             " to the host failed: ", cudaGetErrorString(err));
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    if (!tensors[i].is_same(t)) keep_.push_back(std::move(t));
#endif
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  for (const c10::DeviceIndex d : devices) {
    ready_->copied.emplace_back(runtime::wait_event_flags());
    ready_->copied.back().record(c10::cuda::getCurrentCUDAStream(d));
  }
#endif
}

LateBytes::~LateBytes() { wait(); }
LateBytes::LateBytes(LateBytes&&) noexcept = default;
LateBytes& LateBytes::operator=(LateBytes&& other) noexcept {
  if (this != &other) {
    wait();  // the copies still write host_
    host_ = std::move(other.host_);
    offsets_ = std::move(other.offsets_);
    keep_ = std::move(other.keep_);
    ready_ = std::move(other.ready_);
  }
  return *this;
}

bool LateBytes::ready() const {
#if defined(GRAPHKEEP_WITH_CUDA)
  if (ready_ == nullptr || ready_->waited) return true;
  for (const at::cuda::CUDAEvent& e : ready_->copied)
    if (!e.query()) return false;
#endif
  return true;
}

void LateBytes::wait() {
#if defined(GRAPHKEEP_WITH_CUDA)
  if (ready_ != nullptr && !ready_->waited) {
    for (at::cuda::CUDAEvent& e : ready_->copied) e.synchronize();
    ready_->waited = true;
  }
#endif
  keep_.clear();
}

std::span<const std::byte> LateBytes::bytes(std::size_t i) const {
  GK_INTERNAL_ASSERT(host_.defined() && i + 1 < offsets_.size(), "LateBytes::bytes(", i, ") of ",
                     offsets_.empty() ? 0 : offsets_.size() - 1, " tensors, or after release()");
#if defined(GRAPHKEEP_WITH_CUDA)
  GK_INTERNAL_ASSERT(ready_ == nullptr || ready_->waited, "LateBytes::bytes() before wait()");
#endif
  return {static_cast<const std::byte*>(host_.const_data_ptr()) + offsets_[i], offsets_[i + 1] - offsets_[i]};
}

void LateBytes::release() {
  wait();
  host_ = at::Tensor();
  offsets_.clear();
  ready_.reset();
}

}  // namespace gk::detail
